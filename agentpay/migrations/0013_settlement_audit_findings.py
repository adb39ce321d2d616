"""The confirmed audit's findings (agentpay.chain.audit): evidence, frozen in the database like the
receipts (0002's trigger function); billing leads and support agents may read them."""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "agentpay_settlementauditfinding"


def freeze(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                          f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")


def unfreeze(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}")


def grant(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config("agentpay")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # historical app configs have none
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = Permission.objects.filter(content_type__app_label="agentpay", codename="view_settlementauditfinding")
    for name in ("Billing leads", "Support agents"):
        Group.objects.get_or_create(name=name)[0].permissions.add(*view)


class Migration(migrations.Migration):

    dependencies = [
        ('agentpay', '0012_onchain_admin_grants'),
    ]

    operations = [
        migrations.CreateModel(
            name='SettlementAuditFinding',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('found_at', models.DateTimeField()),
                ('evidence_kind', models.CharField(help_text='what the chain showed (Evidence.kind)', max_length=12)),
                ('detail', models.TextField()),
                ('block_number', models.PositiveBigIntegerField(blank=True, null=True)),
                ('block_hash', models.CharField(blank=True, default='', max_length=66)),
                ('action', models.CharField(choices=[('none', 'Recorded (a person reads it)'), ('rebroadcast', 'The same signed bytes sent again'), ('cleared', 'The chain shows it confirmed again')], max_length=12)),
                ('broadcast_answer', models.TextField(blank=True, default='')),
                ('needs_review', models.BooleanField()),
                ('transaction', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='audit_findings', to='agentpay.chaintransaction')),
            ],
            options={
                'ordering': ['-found_at', '-id'],
                'indexes': [models.Index(fields=['transaction', '-found_at'], name='audit_finding_latest')],
            },
        ),
        migrations.RunPython(freeze, unfreeze),
        migrations.RunPython(grant, migrations.RunPython.noop),
    ]
