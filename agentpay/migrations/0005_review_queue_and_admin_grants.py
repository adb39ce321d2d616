"""The admin's "Needs review" queue (a proxy of PaymentIntent) and who may see what.

Billing leads see every AgentPay page (the queue's actions need `resolve_review`, the staff
credit `credit_wallet`, both granted in 0002). Support agents see the intents, the queue,
tenants and wallets, read-only: they answer customers, a lead decides.
"""

from django.db import migrations

LEAD_VIEW = ["paymentintent", "reviewqueueintent", "tenant", "ledgeraccount", "transfer", "intentreceipt",
             "gatewayrequest", "outboxmessage", "pricedroute", "settlement", "fulfillment"]
AGENT_VIEW = ["paymentintent", "reviewqueueintent", "tenant", "ledgeraccount"]


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
    views = Permission.objects.filter(content_type__app_label="agentpay", codename__startswith="view_")
    for group in Group.objects.filter(name__in=("Billing leads", "Support agents")):
        group.permissions.remove(*views)


class Migration(migrations.Migration):
    dependencies = [("agentpay", "0004_wallets_for_existing_tenants")]

    operations = [
        migrations.CreateModel(
            name="ReviewQueueIntent",
            fields=[],
            options={"verbose_name": "needs-review intent", "verbose_name_plural": "needs review (queue)",
                     "proxy": True, "indexes": [], "constraints": []},
            bases=("agentpay.paymentintent",),
        ),
        migrations.RunPython(grant, revoke),
    ]
