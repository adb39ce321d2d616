"""Both staff roles read the Alipay adapter's records (agreements, renewal orders, deductions sent) in
the console; neither may change them (no change/add/delete permission is granted)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

ALIPAY_MODELS = ("alipayagreement", "alipayrenewalorder", "alipaytrade")


def grant(apps, schema_editor):
    app_config = apps.get_app_config("subscriptions")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # historical app configs have none
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    views = Permission.objects.filter(content_type__app_label="subscriptions",
                                      codename__in=[f"view_{model}" for model in ALIPAY_MODELS])
    for name in ("Support agents", "Billing leads"):
        Group.objects.get_or_create(name=name)[0].permissions.add(*views)


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="subscriptions",
                              codename__in=[f"view_{model}" for model in ALIPAY_MODELS]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("subscriptions", "0005_alipay_records"),
        ("dunning", "0006_staff_groups"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
