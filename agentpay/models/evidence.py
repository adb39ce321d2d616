"""Evidence rows that are not receipts: one row per upstream status query (wallet-ledger-spec §9.3)."""

from __future__ import annotations

from django.db import models

from agentpay.models.append_only import AppendOnlyModel
from agentpay.models.payments import Fulfillment


class StatusQueryAnswer(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NOT_FOUND = "not_found"
    IN_PROGRESS = "in_progress"
    INCONCLUSIVE = "inconclusive", "inconclusive (error, timeout, not the contract)"


class FulfillmentStatusQuery(AppendOnlyModel):
    """One status query about one fulfillment, conclusive or not, written once and never changed.

    Written before the acceptance that cites it (the step's evidence names `query_id`), so an
    answer that proves something is on record even if the acceptance is then refused.
    """

    fulfillment = models.ForeignKey(Fulfillment, on_delete=models.PROTECT, related_name="status_query_rows")
    asked_at = models.DateTimeField(help_text="The job's `now` (trusted time) when it asked.")
    answer = models.CharField(max_length=16, choices=StatusQueryAnswer.choices)
    fenced = models.BooleanField(default=False)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="None: no HTTP answer at all.")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    body_digest = models.CharField(max_length=64, blank=True, default="", help_text="SHA-256 of the answer's body.")
    error = models.TextField(blank=True, default="", help_text="Why the answer is inconclusive.")
    request_id = models.UUIDField(null=True, blank=True, help_text="Sent as AgentPay-Request-Id.")
    proves = models.CharField(max_length=64, blank=True, default="",
                              help_text="The fulfillment event this answer is evidence for, if any.")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "status query"
        verbose_name_plural = "status queries"
        indexes = [models.Index(fields=["fulfillment", "id"], name="status_query_by_fulfillment")]

    def __str__(self) -> str:
        return f"{self.fulfillment.fulfillment_id} → {self.answer}{' (fenced)' if self.fenced else ''}"
