"""Issued entitlement snapshots: append-only, one per generation of a subscription."""

from __future__ import annotations

from django.db import models

from dunning.append_only import AppendOnlyModel


class EntitlementSnapshot(AppendOnlyModel):
    subscription = models.ForeignKey(
        "subscriptions.Subscription", on_delete=models.PROTECT, related_name="entitlement_snapshots"
    )
    generation = models.PositiveBigIntegerField()
    profile = models.CharField(max_length=32)
    capabilities = models.JSONField()
    reason = models.CharField(max_length=255)
    issued_at = models.DateTimeField()
    cause_receipt = models.ForeignKey(
        "dunning.TransitionReceipt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["subscription", "generation"], name="uniq_snapshot_generation")
        ]
        ordering = ["subscription_id", "-generation"]
        get_latest_by = "generation"

    def __str__(self) -> str:
        return f"{self.subscription_id}@{self.generation} {self.profile}"
