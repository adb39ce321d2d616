"""Permissions of the two staff roles (SPEC §11).

Support agents: view everything a support case needs, grant an exception, own an unknown payment.
Billing leads: all of that, plus resolve evidence conflicts, request cancellation, the incident
switch (pause restrictions, rebind to the previous policy) and policies.

Daily work needs no superuser: staff users in these groups.
"""

from django.db import migrations, models

VIEW = [
    ("subscriptions", "customer"), ("subscriptions", "subscription"), ("subscriptions", "invoice"),
    ("dunning", "dunningcycle"), ("dunning", "paymentattempt"), ("dunning", "providerevent"),
    ("dunning", "providerreceipt"), ("dunning", "monetaryfact"), ("dunning", "transitionreceipt"),
    ("dunning", "dunningpolicy"), ("entitlements", "entitlementsnapshot"),
]
LEAD_VIEW = [
    ("dunning", "outboxmessage"), ("dunning", "webhookdelivery"), ("dunning", "incidentswitch"),
    ("dunning", "alert"), ("dunning", "jobrun"), ("dunning", "reconciliationreport"),
    ("dunning", "notificationdelivery"),
]
AGENT_DECISIONS = ["grant_exception", "own_unknown_payment"]
LEAD_DECISIONS = [*AGENT_DECISIONS, "resolve_conflict", "request_cancellation", "incident_switch", "rebind_policy"]
LEAD_POLICY = [("dunning", "add_dunningpolicy")]


def _ensure_permissions(apps):
    """Model permissions are normally created after all migrations; create them now."""
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        original = getattr(app_config, "models_module", None)
        app_config.models_module = original or True  # historical app configs have none
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = original


def grant(apps, schema_editor):
    _ensure_permissions(apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")

    def perms(pairs):
        found = []
        for app_label, codename in pairs:
            found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return found

    view = [(app, f"view_{model}") for app, model in VIEW]
    lead_view = [(app, f"view_{model}") for app, model in LEAD_VIEW]
    agents = Group.objects.get(name="Support agents")
    leads = Group.objects.get(name="Billing leads")
    agents.permissions.add(*perms(view + [("dunning", c) for c in AGENT_DECISIONS]))
    leads.permissions.add(*perms(view + lead_view + LEAD_POLICY + [("dunning", c) for c in LEAD_DECISIONS]))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for group in Group.objects.filter(name__in=("Support agents", "Billing leads")):
        group.permissions.clear()


class Migration(migrations.Migration):
    dependencies = [
        ("dunning", "0006_staff_groups"),
        ("subscriptions", "0001_initial"),
        ("entitlements", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.CreateModel(
            name="SupportConsole",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
            ],
            options={
                "permissions": [
                    ("grant_exception", "Grant a time-limited exception to a dunning cycle"),
                    ("own_unknown_payment", "Take ownership of a payment whose outcome is unknown"),
                    ("resolve_conflict", "Resolve an evidence conflict after a fresh provider fetch"),
                    ("request_cancellation", "Request cancellation of a restricted subscription"),
                    ("incident_switch", "Pause new restrictions (incident switch)"),
                    ("rebind_policy", "Rebind a subscription to the previous policy version"),
                ],
                "managed": False,
                "default_permissions": (),
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
