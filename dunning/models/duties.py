"""Seed 003's two standing duties (issue 19 item 3): the manual compensation queue
("已支付未开通" / "已开通未支付" cases, each with an owner, a reason and a ticket) and the
weekly sample review of at least 20 failed subscriptions.

Both are append-only: a case's current state lives on the case (its bookkeeping fields), and
every decision is one CompensationAction; a reviewer's verdict is one SampleVerdict row, and a
change of mind is a new row, never an overwrite.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dunning.append_only import AppendOnlyModel


class CompensationKind(models.TextChoices):
    PAID_NOT_ENTITLED = "PAID_NOT_ENTITLED", "Paid but not entitled"
    ENTITLED_NOT_PAID = "ENTITLED_NOT_PAID", "Entitled but not paid"


class CompensationState(models.TextChoices):
    OPEN = "OPEN", "Open — nobody owns it"
    OWNED = "OWNED", "Owned"
    RESOLVED = "RESOLVED", "Resolved"


class CompensationResolution(models.TextChoices):
    REFETCH_AND_REAPPLY = "REFETCH_AND_REAPPLY", "Re-fetch the invoice and re-apply the provider's truth"
    RECOMPUTE_ACCESS = "RECOMPUTE_ACCESS", "Recompute access from the stored evidence (restores or restricts)"
    GRANT_EXCEPTION = "GRANT_EXCEPTION", "Restore access for a bounded time (exception on the cycle)"
    EXPLAINED = "EXPLAINED", "No action needed: explained"


class CompensationCase(AppendOnlyModel):
    """One mismatch between money and access that a person must settle."""

    MUTABLE_FIELDS = frozenset({"state", "owner", "owned_at", "resolution", "reason", "ticket", "resolved_by",
                                "resolved_at", "last_seen_at", "sightings"})

    kind = models.CharField(max_length=32, choices=CompensationKind.choices)
    subscription = models.ForeignKey("subscriptions.Subscription", on_delete=models.PROTECT,
                                     related_name="compensation_cases")
    invoice = models.ForeignKey("subscriptions.Invoice", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="compensation_cases")
    cycle = models.ForeignKey("dunning.DunningCycle", null=True, blank=True, on_delete=models.PROTECT,
                              related_name="compensation_cases")
    source_alert = models.ForeignKey("dunning.Alert", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="compensation_cases")
    source_report = models.ForeignKey("dunning.ReconciliationReport", null=True, blank=True,
                                      on_delete=models.PROTECT, related_name="compensation_cases")
    source_finding = models.JSONField(default=dict, blank=True,
                                      help_text="The reconciliation finding (or alert figures) the case opened on.")
    detail = models.TextField()
    opened_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    sightings = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, choices=CompensationState.choices, default=CompensationState.OPEN)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                              related_name="owned_compensation_cases")
    owned_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=32, choices=CompensationResolution.choices, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    ticket = models.CharField(max_length=128, blank=True, default="")
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["subscription", "kind"], condition=~models.Q(state="RESOLVED"),
            name="one_unresolved_compensation_case")]
        permissions = [("work_compensation", "Own and resolve manual compensation cases")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.subscription.provider_subscription_id}"


class CompensationActionKind(models.TextChoices):
    OPEN = "OPEN", "Opened"
    SEEN_AGAIN = "SEEN_AGAIN", "Seen again by a detector"
    TAKE = "TAKE", "Took ownership"
    RESOLVE = "RESOLVE", "Resolved"


class CompensationAction(AppendOnlyModel):
    """One step of a case: who, what, when, why; written once."""

    case = models.ForeignKey(CompensationCase, on_delete=models.PROTECT, related_name="actions")
    action = models.CharField(max_length=16, choices=CompensationActionKind.choices)
    actor = models.CharField(max_length=150, help_text='A username, or "job:<name>".')
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")
    resolution = models.CharField(max_length=32, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    ticket = models.CharField(max_length=128, blank=True, default="")
    outcome = models.TextField(blank=True, default="", help_text="What the service said it did.")
    # The detector output an OPEN / SEEN_AGAIN step read: each source is read into the queue once.
    source_alert = models.ForeignKey("dunning.Alert", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+")
    source_report = models.ForeignKey("dunning.ReconciliationReport", null=True, blank=True,
                                      on_delete=models.PROTECT, related_name="+")
    receipt_ids = models.JSONField(default=list, blank=True, help_text="Transition receipts the service wrote.")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["case", "at"], name="compaction_case_at")]

    def __str__(self) -> str:
        return f"{self.get_action_display()} by {self.actor} at {self.at:%Y-%m-%d %H:%M}"


class SampleReview(AppendOnlyModel):
    """The sample of one ISO week: picked once, reproducibly (seeded from the week)."""

    week = models.CharField(max_length=8, unique=True, help_text='ISO week, e.g. "2026-W48".')
    week_start = models.DateTimeField()
    week_end = models.DateTimeField()
    picked_at = models.DateTimeField()
    seed = models.CharField(max_length=64)
    requested_size = models.PositiveIntegerField()
    population = models.PositiveIntegerField(help_text="Subscriptions with a failed payment that week.")

    class Meta:
        permissions = [("review_sample", "Record verdicts in the weekly sample review")]

    def __str__(self) -> str:
        return f"sample review {self.week}"


class SampleReviewItem(AppendOnlyModel):
    """One picked subscription, frozen as it stood at pick time."""

    review = models.ForeignKey(SampleReview, on_delete=models.PROTECT, related_name="items")
    subscription = models.ForeignKey("subscriptions.Subscription", on_delete=models.PROTECT,
                                     related_name="sample_review_items")
    position = models.PositiveIntegerField()
    state_snapshot = models.JSONField()
    evidence_snapshot = models.JSONField()
    automatic_verdict = models.CharField(max_length=32)
    automatic_blockers = models.JSONField(default=list)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["review", "subscription"], name="one_item_per_subscription")]
        ordering = ("review", "position")

    def __str__(self) -> str:
        return f"{self.review.week} #{self.position}: {self.subscription.provider_subscription_id}"


class ReviewerVerdict(models.TextChoices):
    CORRECT = "CORRECT", "Correct: state agrees with the evidence"
    INCORRECT = "INCORRECT", "Incorrect: state contradicts the evidence"
    UNSURE = "UNSURE", "Unsure"


class SampleVerdict(AppendOnlyModel):
    """A reviewer's verdict on one item. The newest row per item is the current verdict."""

    item = models.ForeignKey(SampleReviewItem, on_delete=models.PROTECT, related_name="verdicts")
    verdict = models.CharField(max_length=16, choices=ReviewerVerdict.choices)
    note = models.TextField(blank=True, default="")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    replaces = models.OneToOneField("self", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="replaced_by")
    recorded_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["item", "-recorded_at"], name="sampleverdict_item_recent")]
        # With `replaces` one-to-one, the verdicts of an item form one chain: two reviewers
        # racing to record (or change) the same verdict cannot both win.
        constraints = [models.UniqueConstraint(fields=["item"], condition=models.Q(replaces__isnull=True),
                                               name="one_first_verdict_per_item")]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.reviewer} at {self.recorded_at:%Y-%m-%d %H:%M}"
