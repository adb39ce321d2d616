"""Who may see the on-chain rail's pages (issue 18). Billing leads see every on-chain record (the
refund page's "Pay back on chain" needs `resolve_review`, granted in 0002); support agents see the
refunds owed and the transactions, to answer a payer who asks where their money is."""

from django.db import migrations

LEAD_VIEW = ["chainnetwork", "paymentchallenge", "chainauthorization", "chaintransaction", "refundobligation"]
AGENT_VIEW = ["chaintransaction", "refundobligation"]


def grant(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config("agentpay")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # historical app configs have none
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, models in (("Billing leads", LEAD_VIEW), ("Support agents", AGENT_VIEW)):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*Permission.objects.filter(content_type__app_label="agentpay",
                                                         codename__in=[f"view_{m}" for m in models]))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    views = Permission.objects.filter(content_type__app_label="agentpay",
                                      codename__in=[f"view_{m}" for m in LEAD_VIEW])
    for group in Group.objects.filter(name__in=("Billing leads", "Support agents")):
        group.permissions.remove(*views)


class Migration(migrations.Migration):
    dependencies = [("agentpay", "0011_tenant_customer_links")]

    operations = [migrations.RunPython(grant, revoke)]
