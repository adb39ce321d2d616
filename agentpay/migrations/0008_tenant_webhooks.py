"""Tenant callbacks: the endpoint (secret shown once, only its digest kept), one delivery row per
(outbox message, tenant), and one append-only row per POST.

On PostgreSQL a trigger refuses any rewrite of an attempt and the deletion of a delivery (its
bookkeeping columns may change, as the outbox's do). Billing leads may view all three.
"""

import django.db.models.deletion
from django.db import migrations, models

FROZEN = ("agentpay_webhookattempt",)
NO_DELETE = ("agentpay_webhookdelivery",)
VIEW = ["view_tenantwebhookendpoint", "view_webhookdelivery", "view_webhookattempt"]


def triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # agentpay_refuse_rewrite() is 0002's.
    for table in FROZEN:
        schema_editor.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                              f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")
    for table in NO_DELETE:
        schema_editor.execute(f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                              f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in FROZEN:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    for table in NO_DELETE:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete ON {table}")


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


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="agentpay", codename__in=VIEW).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('agentpay', '0007_tenant_provider_customer'),
    ]

    operations = [
        migrations.CreateModel(
            name='TenantWebhookEndpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.URLField(help_text='Where the signed callbacks are POSTed.', max_length=2000)),
                ('secret_salt', models.CharField(help_text='Random; the secret is derived from it (not secret).', max_length=64)),
                ('secret_prefix', models.CharField(help_text='The first characters, to tell secrets apart.', max_length=16)),
                ('secret_hash', models.CharField(help_text='SHA-256 of the secret; the secret itself is not kept.', max_length=64)),
                ('active', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('secret_rotated_at', models.DateTimeField(blank=True, null=True)),
                ('tenant', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='webhook_endpoint', to='agentpay.tenant')),
            ],
        ),
        migrations.CreateModel(
            name='WebhookDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('dedupe_key', models.CharField(help_text="The outbox row's; sent as AgentPay-Event-Id.", max_length=255)),
                ('url', models.URLField(help_text="The endpoint's URL when the delivery was first tried.", max_length=2000)),
                ('created_at', models.DateTimeField()),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('message', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='webhook_deliveries', to='agentpay.outboxmessage')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='webhook_deliveries', to='agentpay.tenant')),
            ],
            options={
                'verbose_name_plural': 'webhook deliveries',
            },
        ),
        migrations.CreateModel(
            name='WebhookAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempted_at', models.DateTimeField()),
                ('url', models.URLField(max_length=2000)),
                ('http_status', models.PositiveSmallIntegerField(blank=True, help_text='None: no HTTP answer.', null=True)),
                ('latency_ms', models.PositiveIntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('body_digest', models.CharField(help_text='SHA-256 of the body we sent.', max_length=64)),
                ('signature_timestamp', models.PositiveBigIntegerField()),
                ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='attempt_rows', to='agentpay.webhookdelivery')),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.AddConstraint(
            model_name='webhookdelivery',
            constraint=models.UniqueConstraint(fields=('message', 'tenant'), name='one_webhook_delivery_per_tenant'),
        ),
        migrations.RunPython(triggers, drop_triggers),
        migrations.RunPython(grant, revoke),
    ]
