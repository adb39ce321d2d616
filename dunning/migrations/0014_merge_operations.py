"""Joins issue 19's four parts, built side by side from 0012: alert deliveries, seed 003's duties,
desensitised bodies and rollout stages. None depends on another's tables."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('dunning', '0013_alert_deliveries'),
        ('dunning', '0013_duties_compensation_and_sample_review'),
        ('dunning', '0013_privacy_body_purge'),
        ('dunning', '0013_rollout_stages'),
    ]

    operations = [
    ]
