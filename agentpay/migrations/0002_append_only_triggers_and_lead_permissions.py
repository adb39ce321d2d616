"""The database refuses rewrites of evidence (PostgreSQL only; the SQLite demo relies on the
model layer), and billing leads get AgentPay's decisions and views.

Transfers and receipts may never change; the request log may only be answered (its answer
columns); the outbox only gets its delivery bookkeeping.
"""

from django.db import migrations

REFUSE = """
CREATE OR REPLACE FUNCTION agentpay_refuse_rewrite() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'agentpay: %% is append-only (%% refused)', TG_TABLE_NAME, TG_OP;
END $$ LANGUAGE plpgsql;
"""
FROZEN_TABLES = ("agentpay_transfer", "agentpay_intentreceipt")
NO_DELETE_TABLES = ("agentpay_gatewayrequest", "agentpay_outboxmessage")

LEAD_PERMS = ["resolve_review", "credit_wallet"]
LEAD_VIEW = ["tenant", "pricedroute", "ledgeraccount", "transfer", "paymentintent", "settlement", "fulfillment",
             "intentreceipt", "gatewayrequest", "outboxmessage"]


def triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(REFUSE)
    for table in FROZEN_TABLES:
        schema_editor.execute(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                              f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")
    for table in NO_DELETE_TABLES:
        schema_editor.execute(f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                              f"FOR EACH ROW EXECUTE FUNCTION agentpay_refuse_rewrite()")


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in FROZEN_TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
    for table in NO_DELETE_TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS agentpay_refuse_rewrite()")


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
    codenames = LEAD_PERMS + [f"view_{model}" for model in LEAD_VIEW]
    leads.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay", codename__in=codenames))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for group in Group.objects.filter(name="Billing leads"):
        group.permissions.remove(*Permission.objects.filter(content_type__app_label="agentpay"))


class Migration(migrations.Migration):
    dependencies = [("agentpay", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length"),
                    ("contenttypes", "0002_remove_content_type_name")]

    operations = [
        migrations.RunPython(triggers, drop_triggers),
        migrations.RunPython(grant, revoke),
    ]
