"""The API permissions of the two staff roles (SPEC §11, §13): support agents read, grant
exceptions and retry; billing leads also publish policies. The groups come from dunning 0006."""

from django.db import migrations

PERMISSIONS = {
    "api_read": "Read billing state through the API",
    "api_grant_exception": "Grant a dunning exception through the API",
    "api_retry_payment": "Retry a payment now through the API",
    "api_publish_policy": "Publish a dunning policy through the API",
}
ROLES = {
    "Support agents": ("api_read", "api_grant_exception", "api_retry_payment"),
    "Billing leads": ("api_read", "api_grant_exception", "api_retry_payment", "api_publish_policy"),
}


def grant(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="entitlements", model="servicetoken")
    perms = {
        codename: Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": name})[0]
        for codename, name in PERMISSIONS.items()
    }
    for group_name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(*(perms[c] for c in codenames))


def revoke(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="entitlements", codename__in=list(PERMISSIONS)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("entitlements", "0002_api_tables"),
        ("dunning", "0006_staff_groups"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(grant, revoke)]
