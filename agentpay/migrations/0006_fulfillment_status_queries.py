"""One append-only row per upstream status query (wallet-ledger-spec §9.3).

As for transfers and receipts (0002), a PostgreSQL trigger refuses UPDATE and DELETE; billing
leads may view the rows.
"""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "agentpay_fulfillmentstatusquery"


def trigger(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # agentpay_refuse_rewrite() is 0002's.
    schema_editor.execute(f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
                          f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")


def drop_trigger(apps, schema_editor):
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
    leads.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay",
                                                     codename="view_fulfillmentstatusquery"))


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="agentpay", codename="view_fulfillmentstatusquery").delete()


class Migration(migrations.Migration):

    dependencies = [
        ('agentpay', '0005_review_queue_and_admin_grants'),
    ]

    operations = [
        migrations.CreateModel(
            name='FulfillmentStatusQuery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('asked_at', models.DateTimeField(help_text="The job's `now` (trusted time) when it asked.")),
                ('answer', models.CharField(choices=[('succeeded', 'Succeeded'), ('failed', 'Failed'), ('not_found', 'Not Found'), ('in_progress', 'In Progress'), ('inconclusive', 'inconclusive (error, timeout, not the contract)')], max_length=16)),
                ('fenced', models.BooleanField(default=False)),
                ('http_status', models.PositiveSmallIntegerField(blank=True, help_text='None: no HTTP answer at all.', null=True)),
                ('latency_ms', models.PositiveIntegerField(blank=True, null=True)),
                ('timed_out', models.BooleanField(default=False)),
                ('body_digest', models.CharField(blank=True, default='', help_text="SHA-256 of the answer's body.", max_length=64)),
                ('error', models.TextField(blank=True, default='', help_text='Why the answer is inconclusive.')),
                ('request_id', models.UUIDField(blank=True, help_text='Sent as AgentPay-Request-Id.', null=True)),
                ('proves', models.CharField(blank=True, default='', help_text='The fulfillment event this answer is evidence for, if any.', max_length=64)),
                ('recorded_at', models.DateTimeField(auto_now_add=True)),
                ('fulfillment', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='status_query_rows', to='agentpay.fulfillment')),
            ],
            options={
                'verbose_name': 'status query',
                'verbose_name_plural': 'status queries',
                'indexes': [models.Index(fields=['fulfillment', 'id'], name='status_query_by_fulfillment')],
            },
        ),
        migrations.RunPython(trigger, drop_trigger),
        migrations.RunPython(grant, revoke),
    ]
