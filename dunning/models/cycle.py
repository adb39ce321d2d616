"""Dunning cycles (one per renewal invoice) and payment attempts (SPEC §3, §5)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django_fsm import RETURN_VALUE, ConcurrentTransition, ConcurrentTransitionMixin, FSMField, transition
from simple_history.models import HistoricalRecords

from dunning.acceptance_scope import is_inside_acceptance
from dunning.states import (
    AUTO_SETTLEABLE_STATES,
    CONFLICT_RESOLUTIONS,
    DELINQUENT_STATES,
    EXCEPTION_SOURCE_STATES,
    GRACE_DEADLINE_STATES,
    OPEN_STATES,
    SETTLED_STATES,
    AttemptState,
    CycleState,
    FailureClass,
)

S = CycleState
ONLY_IN_ACCEPTANCE = [is_inside_acceptance]
# Where the customer can act on an open invoice (a new card, "Pay now"): every delinquent state
# but an attempt already in flight, a conflict waiting for a person, and the terminal CANCELED.
CUSTOMER_ACTIONABLE_STATES = frozenset(
    DELINQUENT_STATES - {S.RETRY_DISPATCHING, S.PAYMENT_UNKNOWN, S.EVIDENCE_CONFLICT, S.CANCELED})


class GenerationFenceMixin:
    """Every UPDATE of the row also requires the `generation` it was loaded with (CAS).

    ConcurrentTransitionMixin only compares the state column; this adds the version column,
    so a stale instance fails to save even when the state happens to match. A plain mixin (not
    an abstract model) so that FSMModelMixin stays ahead of Model in the MRO.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded_generation = self.generation

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        self._loaded_generation = self.generation

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        super().refresh_from_db(*args, **kwargs)
        self._loaded_generation = self.generation

    def _do_update(self, base_qs, using, pk_val, values, update_fields, forced_update):  # type: ignore[override]
        fenced = base_qs.filter(generation=self._loaded_generation)
        updated = super()._do_update(fenced, using, pk_val, values, update_fields, forced_update)
        if not updated and base_qs.filter(pk=pk_val).using(using).exists():
            raise ConcurrentTransition(
                f"generation moved past {self._loaded_generation} since this cycle was loaded"
            )
        return updated


class DunningCycle(GenerationFenceMixin, ConcurrentTransitionMixin, models.Model):
    generation = models.PositiveBigIntegerField(default=1)
    cycle_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    subscription = models.ForeignKey("subscriptions.Subscription", on_delete=models.PROTECT, related_name="cycles")
    invoice = models.OneToOneField("subscriptions.Invoice", on_delete=models.PROTECT, related_name="cycle")
    amount = models.BigIntegerField(help_text="Minor units, as invoiced when the cycle opened.")
    currency = models.CharField(max_length=3)
    provider_generation = models.PositiveBigIntegerField(
        default=1, help_text="Invoice revision last accepted into this cycle."
    )
    policy = models.ForeignKey("dunning.DunningPolicy", on_delete=models.PROTECT, related_name="cycles")
    state = FSMField(default=S.CURRENT, choices=S.choices, protected=True, db_index=True)
    failure_class = models.CharField(max_length=32, choices=FailureClass.choices, blank=True, default="")
    decline_code = models.CharField(max_length=64, blank=True, default="")
    customer_action_required = models.BooleanField(default=False)
    retry_budget_used = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    pending_attempt = models.ForeignKey(
        "dunning.PaymentAttempt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    grace_started_at = models.DateTimeField(null=True, blank=True)
    grace_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    restricted_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    # Exception (support-granted, always expiring).
    exception_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    exception_owner = models.CharField(max_length=150, blank=True, default="")
    exception_reason = models.TextField(blank=True, default="")
    exception_ticket = models.CharField(max_length=128, blank=True, default="")
    exception_profile = models.CharField(max_length=32, blank=True, default="")
    suspended_state = models.CharField(max_length=32, choices=S.choices, blank=True, default="")
    # Evidence conflict: the profile this cycle held when evidence contradicted itself.
    conflict_reason = models.TextField(blank=True, default="")
    conflict_held_profile = models.CharField(max_length=32, blank=True, default="")
    # PAYMENT_UNKNOWN ownership (SPEC §5: an owner within one hour).
    unknown_owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    unknown_since = models.DateTimeField(null=True, blank=True)
    unknown_owner_assigned_at = models.DateTimeField(null=True, blank=True)
    dispute_reopened = models.BooleanField(default=False)
    opened_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)
    # The history table gains a row on every save and is read by cycle (`id`: the object's history,
    # the money gate), by subscription (the admin timeline) and by invoice (the simulation's
    # reconciliation check), newest first: the other indexes simple_history copies from the model
    # were kept up to date for no query.
    history = HistoricalRecords(excluded_fields=["updated_at"], no_db_index=[
        "cycle_id", "policy", "state", "pending_attempt", "unknown_owner", "grace_expires_at", "next_attempt_at",
        "exception_expires_at"])

    class Meta:
        indexes = [models.Index(fields=["subscription", "state"], name="cycle_sub_state")]

    def __str__(self) -> str:
        return f"cycle {self.cycle_id} ({self.state})"

    # --- FSM edges. Guards with reasons live in the acceptance service; these only move state
    # and the fields that belong to the edge. Each is callable only inside acceptance. ---

    @transition(field=state, source=S.CURRENT, target=S.PAYMENT_FAILED, conditions=ONLY_IN_ACCEPTANCE)
    def record_failure(self, *, failure_class: str, decline_code: str, no_retry: bool) -> None:
        self.failure_class = failure_class
        self.decline_code = decline_code
        self.customer_action_required = no_retry
        if no_retry:
            self.next_attempt_at = None

    @transition(field=state, source=S.PAYMENT_FAILED, target=S.GRACE_ACTIVE, conditions=ONLY_IN_ACCEPTANCE)
    def start_grace(self, *, now: datetime, expires_at: datetime) -> None:
        self.grace_started_at = now
        self.grace_expires_at = expires_at

    @transition(field=state, source=S.GRACE_ACTIVE, target=S.RETRY_SCHEDULED, conditions=ONLY_IN_ACCEPTANCE)
    def schedule_retry(self, *, next_attempt_at: datetime) -> None:
        self.next_attempt_at = next_attempt_at

    @transition(field=state, source=S.RETRY_SCHEDULED, target=S.RETRY_SCHEDULED, conditions=ONLY_IN_ACCEPTANCE)
    def reschedule_retry(self, *, next_attempt_at: datetime | None) -> None:
        self.next_attempt_at = next_attempt_at

    @transition(field=state, source=S.RETRY_SCHEDULED, target=S.RETRY_SCHEDULED, conditions=ONLY_IN_ACCEPTANCE)
    def prepare_retry(self, *, attempt: PaymentAttempt) -> None:
        self.pending_attempt = attempt

    @transition(field=state, source=S.RETRY_SCHEDULED, target=S.RETRY_DISPATCHING, conditions=ONLY_IN_ACCEPTANCE)
    def dispatch_retry(self) -> None:
        self.retry_budget_used += 1

    @transition(field=state, source=[S.RETRY_DISPATCHING, S.RETRY_SCHEDULED, S.PAYMENT_UNKNOWN],
                target=S.RETRY_FAILED, conditions=ONLY_IN_ACCEPTANCE)
    def retry_failed(self, *, failure_class: str, decline_code: str, no_retry: bool) -> None:
        self.pending_attempt = None
        self.unknown_since = None
        self.failure_class = failure_class
        self.decline_code = decline_code
        self.customer_action_required = self.customer_action_required or no_retry
        self.next_attempt_at = None

    @transition(field=state, source=S.RETRY_DISPATCHING, target=S.PAYMENT_UNKNOWN, conditions=ONLY_IN_ACCEPTANCE)
    def mark_unknown(self, *, now: datetime) -> None:
        self.unknown_since = now

    @transition(field=state, source=S.PAYMENT_UNKNOWN, target=S.PAYMENT_UNKNOWN, conditions=ONLY_IN_ACCEPTANCE)
    def assign_unknown_owner(self, *, owner: Any, now: datetime) -> None:
        self.unknown_owner = owner
        self.unknown_owner_assigned_at = now

    @transition(field=state, source=S.RETRY_FAILED, target=S.GRACE_ACTIVE, conditions=ONLY_IN_ACCEPTANCE)
    def return_to_grace(self) -> None:
        pass

    # Grace is a deadline, not a retry outcome (SPEC §5): a cycle waiting on a scheduled retry, or
    # between a failed retry and its return to grace, expires too. The retry stays recorded.
    @transition(field=state, source=list(GRACE_DEADLINE_STATES), target=S.GRACE_EXPIRED,
                conditions=ONLY_IN_ACCEPTANCE)
    def expire_grace(self) -> None:
        pass

    @transition(field=state, source=S.GRACE_EXPIRED, target=S.RESTRICTING, conditions=ONLY_IN_ACCEPTANCE)
    def begin_restriction(self) -> None:
        pass

    @transition(field=state, source=S.RESTRICTING, target=S.RESTRICTED, conditions=ONLY_IN_ACCEPTANCE)
    def complete_restriction(self, *, now: datetime) -> None:
        self.restricted_at = now

    @transition(field=state, source=S.RESTRICTED, target=S.CANCEL_PENDING, conditions=ONLY_IN_ACCEPTANCE)
    def request_cancellation(self, *, now: datetime) -> None:
        self.cancel_requested_at = now

    @transition(field=state, source=S.CANCEL_PENDING, target=S.CANCELED, conditions=ONLY_IN_ACCEPTANCE)
    def cancel(self, *, now: datetime) -> None:
        self.settled_at = now

    @transition(field=state, source=list(AUTO_SETTLEABLE_STATES), target=S.RECOVERED,
                conditions=ONLY_IN_ACCEPTANCE)
    def recover(self, *, now: datetime) -> None:
        self._settle(now)

    @transition(field=state, source=list(AUTO_SETTLEABLE_STATES), target=S.CLOSED_VOID,
                conditions=ONLY_IN_ACCEPTANCE)
    def close_void(self, *, now: datetime) -> None:
        self._settle(now)

    @transition(field=state, source=list((OPEN_STATES | {S.RECOVERED}) - {S.EVIDENCE_CONFLICT}),
                target=S.EVIDENCE_CONFLICT, conditions=ONLY_IN_ACCEPTANCE)
    def flag_conflict(self, *, reason: str, held_profile: str) -> None:
        self.conflict_reason = reason
        self.conflict_held_profile = held_profile

    @transition(field=state, source=S.EVIDENCE_CONFLICT,
                target=RETURN_VALUE(*sorted(CONFLICT_RESOLUTIONS)), conditions=ONLY_IN_ACCEPTANCE)
    def resolve_conflict(self, *, resolution: str, now: datetime) -> str:
        if resolution in SETTLED_STATES:
            self._settle(now)
        elif resolution == S.RESTRICTED and self.restricted_at is None:
            self.restricted_at = now
        self.conflict_held_profile = ""
        return resolution

    @transition(field=state, source=list(EXCEPTION_SOURCE_STATES), target=S.EXCEPTION_ACTIVE,
                conditions=ONLY_IN_ACCEPTANCE)
    def grant_exception(self, *, expires_at: datetime, owner: str, reason: str, ticket: str, profile: str) -> None:
        self.suspended_state = self.state
        self.exception_expires_at = expires_at
        self.exception_owner = owner
        self.exception_reason = reason
        self.exception_ticket = ticket
        self.exception_profile = profile

    @transition(field=state, source=S.EXCEPTION_ACTIVE,
                target=RETURN_VALUE(*sorted(EXCEPTION_SOURCE_STATES)), conditions=ONLY_IN_ACCEPTANCE)
    def expire_exception(self) -> str:
        back_to = self.suspended_state
        self.suspended_state = ""
        self.exception_profile = ""
        return back_to

    @transition(field=state, source=S.RECOVERED, target=S.PAYMENT_FAILED, conditions=ONLY_IN_ACCEPTANCE)
    def reopen_after_dispute(self) -> None:
        self.dispute_reopened = True
        self.settled_at = None
        self.failure_class = FailureClass.CUSTOMER_ACTION
        self.customer_action_required = True

    # The customer's own actions leave the state (and so access) alone: a new payment method
    # changes what may be tried next, and a payment of theirs changes access only once the
    # provider shows the invoice paid (then `recover`).

    @transition(field=state, source=list(CUSTOMER_ACTIONABLE_STATES), target=None, conditions=ONLY_IN_ACCEPTANCE)
    def clear_customer_action(self) -> None:
        self.customer_action_required = False
        # The hard decline was the old card's; the new one has not been declined.
        self.failure_class = ""

    @transition(field=state, source=list(CUSTOMER_ACTIONABLE_STATES), target=None, conditions=ONLY_IN_ACCEPTANCE)
    def dispatch_customer_payment(self, *, attempt: PaymentAttempt) -> None:
        self.pending_attempt = attempt

    @transition(field=state, source=list(CUSTOMER_ACTIONABLE_STATES), target=None, conditions=ONLY_IN_ACCEPTANCE)
    def customer_payment_failed(self, *, attempt: PaymentAttempt, failure_class: str, decline_code: str,
                                no_retry: bool) -> None:
        if self.pending_attempt_id == attempt.pk:
            self.pending_attempt = None
        self.failure_class = failure_class
        self.decline_code = decline_code
        self.customer_action_required = self.customer_action_required or no_retry

    @transition(field=state, source=list(CUSTOMER_ACTIONABLE_STATES), target=None, conditions=ONLY_IN_ACCEPTANCE)
    def customer_payment_unknown(self) -> None:
        pass

    def _settle(self, now: datetime) -> None:
        self.settled_at = now
        self.pending_attempt = None
        self.next_attempt_at = None
        self.unknown_since = None
        self.conflict_held_profile = ""


class AttemptOrigin(models.TextChoices):
    PROVIDER = "PROVIDER", "Reported by the payment provider"
    LOCAL = "LOCAL", "Initiated locally"


class PaymentAttempt(models.Model):
    """One charge attempt. A local attempt's operation id and idempotency key are persisted
    before dispatch and reused for every resend (SPEC §9)."""

    cycle = models.ForeignKey(DunningCycle, on_delete=models.PROTECT, related_name="attempts")
    origin = models.CharField(max_length=16, choices=AttemptOrigin.choices)
    operation_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    idempotency_key = models.CharField(max_length=255, unique=True)
    invoice_digest = models.CharField(max_length=64, help_text="sha256 of invoice id, amount and currency.")
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    state = models.CharField(max_length=16, choices=AttemptState.choices, default=AttemptState.PREPARED)
    provider_payment_ref = models.CharField(max_length=255, blank=True, default="")
    decline_code = models.CharField(max_length=64, blank=True, default="")
    failure_class = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    history = HistoricalRecords()

    class Meta:
        indexes = [models.Index(fields=["state"], name="attempt_state")]

    def __str__(self) -> str:
        return f"attempt {self.operation_id} ({self.state})"
