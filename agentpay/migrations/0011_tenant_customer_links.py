"""A tenant's provider customer is linked by staff with a reason and a ticket, each change an
append-only row (a trigger refuses rewrites on PostgreSQL); one customer tops up one tenant.
Billing leads may view the links."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


TABLE = "agentpay_tenantcustomerlink"
VIEW = ["view_tenantcustomerlink"]


def triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":  # agentpay_refuse_rewrite() is 0002's
        schema_editor.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                              f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")


def drop_triggers(apps, schema_editor):
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
    leads, _ = Group.objects.get_or_create(name="Billing leads")
    leads.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay", codename__in=VIEW))


class Migration(migrations.Migration):

    dependencies = [
        ('agentpay', '0010_onchain_rail'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='TenantCustomerLink',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('previous_ref', models.CharField(blank=True, default='', max_length=255)),
                ('customer_ref', models.CharField(blank=True, default='', help_text='Empty: unlinked.', max_length=255)),
                ('reason', models.TextField()),
                ('ticket', models.CharField(max_length=128)),
                ('linked_at', models.DateTimeField()),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.AddConstraint(
            model_name='tenant',
            constraint=models.UniqueConstraint(condition=models.Q(('provider_customer_ref', ''), _negated=True), fields=('provider_customer_ref',), name='one_tenant_per_provider_customer'),
        ),
        migrations.AddField(
            model_name='tenantcustomerlink',
            name='actor_user',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='tenantcustomerlink',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='customer_links', to='agentpay.tenant'),
        ),
        migrations.RunPython(triggers, drop_triggers),
        migrations.RunPython(grant, migrations.RunPython.noop),
    ]
