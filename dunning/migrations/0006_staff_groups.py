"""The two staff roles of SPEC §11. Their permissions are granted with the support console;
here they exist so unknown payments can be assigned to billing staff in turn."""

from django.db import migrations

GROUPS = ("Support agents", "Billing leads")


def create_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in GROUPS:
        Group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("dunning", "0005_operations"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
