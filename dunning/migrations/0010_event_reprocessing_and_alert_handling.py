"""Held provider events can be fetched again and re-processed (billing leads), and alerts can be
acknowledged and resolved (support agents and billing leads), each decision on an audit row.

Support agents now see alerts (they acknowledge them); both roles see the audit rows.
"""

from importlib import import_module

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

AGENT = [
    ("dunning", "acknowledge_alert"), ("dunning", "resolve_alert"), ("dunning", "view_alert"),
    ("dunning", "view_alertaction"), ("dunning", "view_eventreprocessing"),
]
LEAD = [*AGENT, ("dunning", "reprocess_event")]


def grant(apps, schema_editor):
    import_module("dunning.migrations.0007_support_console_permissions")._ensure_permissions(apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")

    def perms(pairs):
        return [Permission.objects.get(content_type__app_label=app, codename=codename) for app, codename in pairs]

    for name, pairs in (("Support agents", AGENT), ("Billing leads", LEAD)):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*perms(pairs))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    codenames = {codename for _, codename in LEAD} - {"view_alert"}
    for group in Group.objects.filter(name__in=("Support agents", "Billing leads")):
        group.permissions.remove(*Permission.objects.filter(content_type__app_label="dunning",
                                                            codename__in=codenames))
    agents = Group.objects.filter(name="Support agents").first()
    if agents is not None:
        agents.permissions.remove(*Permission.objects.filter(content_type__app_label="dunning",
                                                             codename="view_alert"))


class Migration(migrations.Migration):

    dependencies = [
        ('dunning', '0009_cancel_unconfirmed_alert'),
        ('dunning', '0007_support_console_permissions'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='supportconsole',
            options={'default_permissions': (), 'managed': False, 'permissions': [('grant_exception', 'Grant a time-limited exception to a dunning cycle'), ('own_unknown_payment', 'Take ownership of a payment whose outcome is unknown'), ('resolve_conflict', 'Resolve an evidence conflict after a fresh provider fetch'), ('request_cancellation', 'Request cancellation of a restricted subscription'), ('incident_switch', 'Pause new restrictions (incident switch)'), ('rebind_policy', 'Rebind a subscription to the previous policy version'), ('reprocess_event', "Fetch a held provider event's objects again and re-process it"), ('acknowledge_alert', 'Acknowledge an alert and take ownership of it'), ('resolve_alert', 'Resolve an alert with a note')]},
        ),
        migrations.AddField(
            model_name='alert',
            name='acknowledged_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='alert',
            name='owner',
            field=models.ForeignKey(blank=True, help_text='Who acknowledged it and follows it up.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='owned_alerts', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='alert',
            name='resolution_note',
            field=models.TextField(blank=True, default='', help_text='What was done, by whoever resolved it.'),
        ),
        migrations.CreateModel(
            name='AlertAction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(choices=[('ACKNOWLEDGE', 'Acknowledged (took ownership)'), ('RESOLVE', 'Resolved')], max_length=16)),
                ('actor', models.CharField(help_text='A username, or "job:<name>" for a scheduled job.', max_length=150)),
                ('note', models.TextField(blank=True, default='')),
                ('previous_owner', models.CharField(blank=True, default='', help_text='Who owned the alert before an acknowledgement took it over.', max_length=150)),
                ('at', models.DateTimeField()),
                ('actor_user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('alert', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='actions', to='dunning.alert')),
            ],
            options={
                'indexes': [models.Index(fields=['alert', 'at'], name='alertaction_alert_at')],
            },
        ),
        migrations.CreateModel(
            name='EventReprocessing',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('actor', models.CharField(help_text="The requesting user's name, as it was then.", max_length=150)),
                ('reason', models.TextField()),
                ('ticket', models.CharField(max_length=128)),
                ('requested_at', models.DateTimeField(help_text='Trusted time the request was accepted.')),
                ('previous_outcome', models.CharField(max_length=16)),
                ('previous_detail', models.TextField(blank=True, default='')),
                ('previous_processed_at', models.DateTimeField(blank=True, null=True)),
                ('status', models.CharField(choices=[('STARTED', 'Started'), ('DONE', 'Done'), ('PROVIDER_UNAVAILABLE', 'Provider did not answer'), ('FAILED', 'Failed on our side'), ('ABANDONED', 'Abandoned (the process stopped)')], default='STARTED', max_length=24)),
                ('new_outcome', models.CharField(blank=True, default='', max_length=16)),
                ('new_detail', models.TextField(blank=True, default='')),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('event', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reprocessings', to='dunning.providerevent')),
                ('requested_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'event re-processing',
                'indexes': [models.Index(fields=['event', '-requested_at'], name='reprocessing_event_recent')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('status', 'STARTED')), fields=('event',), name='one_reprocessing_in_flight')],
            },
        ),
        migrations.RunPython(grant, revoke),
    ]
