"""Permissions of the support console (SPEC §11). A table-less model only carries them: each
names one staff decision, and the two staff groups get them by migration 0007."""

from __future__ import annotations

from django.db import models


class SupportConsole(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("grant_exception", "Grant a time-limited exception to a dunning cycle"),
            ("own_unknown_payment", "Take ownership of a payment whose outcome is unknown"),
            ("resolve_conflict", "Resolve an evidence conflict after a fresh provider fetch"),
            ("request_cancellation", "Request cancellation of a restricted subscription"),
            ("incident_switch", "Pause new restrictions (incident switch)"),
            ("rebind_policy", "Rebind a subscription to the previous policy version"),
            ("reprocess_event", "Fetch a held provider event's objects again and re-process it"),
            ("acknowledge_alert", "Acknowledge an alert and take ownership of it"),
            ("resolve_alert", "Resolve an alert with a note"),
        ]

    def __str__(self) -> str:
        return "support console permissions"
