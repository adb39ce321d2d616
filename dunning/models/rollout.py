"""The live rollout stage of a published policy for a cohort (SPEC §15, issue 19 item 1).

A published policy is immutable, so its mode and percentage as stated in the document are only
its *initial* stage. Each promotion (or a step back) appends one RolloutStage; the newest row for
(policy, cohort) — or for (policy, "*") — is the stage in force. Rows are never rewritten.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dunning.append_only import AppendOnlyModel


class RolloutStage(AppendOnlyModel):
    policy = models.ForeignKey("dunning.DunningPolicy", on_delete=models.PROTECT, related_name="rollout_stages")
    cohort = models.CharField(max_length=64, help_text='A subscription cohort, or "*" for every cohort.')
    mode = models.CharField(max_length=16)  # SHADOW | NOTIFY_ONLY | ENFORCE
    percent = models.PositiveSmallIntegerField()
    previous_mode = models.CharField(max_length=16)
    previous_percent = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    ticket = models.CharField(max_length=128)
    # What the promotion was allowed on: the gates report and the shadow window, as shown then.
    evidence = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["policy", "cohort", "-started_at", "-id"], name="rollout_stage_current")]
        ordering = ["-started_at", "-id"]
        verbose_name = "rollout stage"
        verbose_name_plural = "rollout"

    def __str__(self) -> str:
        return f"{self.policy_id}/{self.cohort}: {self.mode} {self.percent} %"
