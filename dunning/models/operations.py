"""Operational records: job runs, the incident switch, reconciliation reports, alerts and
notification deliveries (SPEC §10, §15)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from simple_history.models import HistoricalRecords

from dunning.append_only import AppendOnlyModel


class JobRun(AppendOnlyModel):
    """One run of a scheduled job, with the trusted time it ran for and what it did."""

    MUTABLE_FIELDS = frozenset({"finished_at", "status", "examined", "changed", "refused", "errors", "detail"})

    job = models.CharField(max_length=64, db_index=True)
    run_for = models.DateTimeField(help_text="The trusted `now` the job evaluated guards against.")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, default="RUNNING")  # RUNNING | OK | PARTIAL | FAILED
    examined = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    detail = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["job", "-run_for"], name="jobrun_job_recent")]

    def __str__(self) -> str:
        return f"{self.job} for {self.run_for:%Y-%m-%d %H:%M} {self.status}"


class IncidentSwitch(models.Model):
    """While active, no cycle of the cohort enters RESTRICTING (SPEC §11, §15). Ending it is a
    recorded decision too; nothing here fabricates a payment."""

    cohort = models.CharField(max_length=64, default="*", help_text='A cohort, or "*" for all.')
    pause_restrictions = models.BooleanField(default=True)
    reason = models.TextField()
    ticket = models.CharField(max_length=128)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField()
    ended_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="+")
    ended_at = models.DateTimeField(null=True, blank=True)
    history = HistoricalRecords()

    class Meta:
        verbose_name_plural = "incident switches"
        indexes = [models.Index(fields=["cohort"], name="incident_active_cohort",
                                condition=models.Q(ended_at__isnull=True))]

    def __str__(self) -> str:
        return f"incident {self.ticket} ({'active' if self.ended_at is None else 'ended'})"


class ReconciliationReport(AppendOnlyModel):
    """Daily comparison of provider-paid invoices, local facts and entitlement snapshots."""

    run_for = models.DateTimeField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    created_at = models.DateTimeField()
    totals = models.JSONField(default=dict)
    discrepancies = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"reconciliation {self.window_start:%Y-%m-%d}..{self.window_end:%Y-%m-%d}: {len(self.discrepancies)}"


class AlertKind(models.TextChoices):
    PAID_NOT_RESTORED = "PAID_NOT_RESTORED", "Paid but access not restored"
    DUPLICATE_CHARGE = "DUPLICATE_CHARGE", "Two successful charges for one invoice"
    FAILURE_RATE_SPIKE = "FAILURE_RATE_SPIKE", "Payment failure rate above the 7-day mean"
    RECONCILIATION_MISMATCH = "RECONCILIATION_MISMATCH", "Reconciliation found a mismatch"
    UNKNOWN_UNOWNED = "UNKNOWN_UNOWNED", "Unknown payment without an owner"
    CANCEL_UNCONFIRMED = "CANCEL_UNCONFIRMED", "Provider has not confirmed a cancellation"
    UNKNOWN_PAST_RETENTION = "UNKNOWN_PAST_RETENTION", "Unknown payment past the key retention: a person decides"


# Conditions the jobs cannot see clear (money already moved twice, a day's failure rate, a
# reconciliation report): a person resolves them, never a job.
ALERT_KINDS_RESOLVED_BY_A_PERSON = frozenset({
    AlertKind.DUPLICATE_CHARGE, AlertKind.FAILURE_RATE_SPIKE, AlertKind.RECONCILIATION_MISMATCH})


class Alert(AppendOnlyModel):
    """One episode of one condition. Handling it (acknowledge, resolve) is recorded twice: the
    current state here, and one append-only AlertAction per decision."""

    MUTABLE_FIELDS = frozenset({"resolved_at", "resolved_by", "last_seen_at", "occurrences", "owner",
                                "acknowledged_at", "resolution_note"})

    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    dedupe_key = models.CharField(max_length=255, unique=True)
    subscription = models.ForeignKey("subscriptions.Subscription", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="alerts")
    invoice = models.ForeignKey("subscriptions.Invoice", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="alerts")
    detail = models.TextField()
    figures = models.JSONField(default=dict)
    raised_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    occurrences = models.PositiveIntegerField(default=1)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="owned_alerts", help_text="Who acknowledged it and follows it up.")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolution_note = models.TextField(blank=True, default="", help_text="What was done, by whoever resolved it.")

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.detail[:60]}"

    @property
    def needs_a_person(self) -> bool:
        return self.kind in ALERT_KINDS_RESOLVED_BY_A_PERSON


class AlertActionKind(models.TextChoices):
    ACKNOWLEDGE = "ACKNOWLEDGE", "Acknowledged (took ownership)"
    RESOLVE = "RESOLVE", "Resolved"


class AlertAction(AppendOnlyModel):
    """One decision on an alert: who, what, when, with what note. Written once, never changed."""

    alert = models.ForeignKey(Alert, on_delete=models.PROTECT, related_name="actions")
    action = models.CharField(max_length=16, choices=AlertActionKind.choices)
    actor = models.CharField(max_length=150, help_text='A username, or "job:<name>" for a scheduled job.')
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    note = models.TextField(blank=True, default="")
    previous_owner = models.CharField(max_length=150, blank=True, default="",
                                      help_text="Who owned the alert before an acknowledgement took it over.")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["alert", "at"], name="alertaction_alert_at")]

    def __str__(self) -> str:
        return f"{self.get_action_display()} by {self.actor} at {self.at:%Y-%m-%d %H:%M}"


class NotificationDelivery(AppendOnlyModel):
    """What the notification consumer did with one outbox message: it sends at most once."""

    MUTABLE_FIELDS = frozenset({"status", "reason", "recipient", "subject", "handled_at"})

    message = models.OneToOneField("dunning.OutboxMessage", on_delete=models.PROTECT, related_name="delivery")
    status = models.CharField(max_length=16)  # SENDING | SENT | SKIPPED | FAILED
    reason = models.CharField(max_length=255, blank=True, default="")
    recipient = models.EmailField(blank=True, default="")
    template = models.CharField(max_length=64)
    subject = models.CharField(max_length=255, blank=True, default="")
    handled_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "notification deliveries"

    def __str__(self) -> str:
        return f"{self.template} → {self.recipient or '—'} {self.status}"
