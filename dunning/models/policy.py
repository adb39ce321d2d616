from __future__ import annotations

from functools import cached_property

from django.conf import settings
from django.db import models

from dunning.append_only import AppendOnlyModel
from dunning.policy.document import PolicyDocument, validate_policy


class DunningPolicy(AppendOnlyModel):
    """A published `subscription.dunningPolicy.v1`, immutable once stored (identity name@version)."""

    name = models.CharField(max_length=128)
    version = models.PositiveIntegerField()
    identity = models.CharField(max_length=140, unique=True)
    document = models.JSONField(help_text="The validated, canonical document.")
    digest = models.CharField(max_length=64)
    source_text = models.TextField(help_text="The text as published (YAML or JSON).")
    prices = models.JSONField(default=list)
    cohort = models.CharField(max_length=64, default="default")
    is_default = models.BooleanField(default=False)
    mode = models.CharField(max_length=16)
    retry_authority = models.CharField(max_length=32)
    published_at = models.DateTimeField()
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        verbose_name_plural = "dunning policies"
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="uniq_policy_name_version")]
        ordering = ["name", "-version"]

    def __str__(self) -> str:
        return self.identity

    @cached_property
    def spec(self) -> PolicyDocument:
        return validate_policy(self.document)
