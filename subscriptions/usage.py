"""Usage records (issue 19 item 4; seed 003: a payment failure must never lose usage already consumed).

Usage is kept apart from subscription debt. `usage_record` is the one way a record is written:
it accepts a record whatever the subscription's entitlement profile (REVOKED included: usage
already consumed is owed, so it is recorded, never refused), it never reads or writes a dunning
cycle, and it is idempotent on the producer's own id:

- the same producer and producer_record_id with the same canonical body → the stored record
  again (`created=False`), nothing written;
- the same producer and producer_record_id with another body → `UsageConflict`, nothing
  written (the API answers 422, as it does for an Idempotency-Key reused with another body);
- two identical records at once → one row: the unique (producer, producer_record_id)
  constraint decides, and the loser reads the winner's row back.

The only later change is `usage_mark_invoiced`, once, when the provider invoices the usage.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from dunning.clock import CLOCK_TOLERANCE, trusted_now
from entitlements.models import ServiceToken
from subscriptions.models import Subscription, UsageMetric, UsageRecord

_CURRENCY = re.compile(r"^[a-z]{3}$")
# One advisory-lock namespace for usage, so two first records of a subscription agree on its currency.
_USAGE_LOCK_NAMESPACE = 19_004


class UsageInvalid(ValueError):
    """A record that cannot be accepted as given: `errors` maps each field to its fault."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


class UsageConflict(Exception):
    """The producer already recorded this id with a different body; the stored record is kept."""

    def __init__(self, existing: UsageRecord) -> None:
        super().__init__(f"producer record id {existing.producer_record_id!r} was already recorded with a "
                         f"different body (record #{existing.pk}); use a new id for new usage")
        self.existing = existing


class UsageRefused(Exception):
    """An invoicing request the stored records refuse (already invoiced elsewhere, unknown records)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class UsageInput:
    """A usage record as the producer reports it (already parsed: types are right, values unchecked)."""

    producer_record_id: str
    metric: str
    quantity: int
    cost: int
    currency: str
    occurred_at: datetime


@dataclass(frozen=True)
class UsageOutcome:
    record: UsageRecord
    created: bool  # False: a replay of a record already stored


def canonical_usage(subscription_pk: int, usage: UsageInput) -> dict[str, object]:
    """The record's meaning, independent of how it was spelled (a provider id or the local id for the
    subscription, upper- or lower-case currency, any UTC offset for the time)."""
    return {
        "subscription": subscription_pk,
        "producer_record_id": usage.producer_record_id,
        "metric": usage.metric,
        "quantity": usage.quantity,
        "cost": usage.cost,
        "currency": usage.currency.lower(),
        "occurred_at": usage.occurred_at.astimezone(UTC).isoformat(timespec="microseconds"),
    }


def usage_digest(subscription_pk: int, usage: UsageInput) -> str:
    body = json.dumps(canonical_usage(subscription_pk, usage), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def subscription_currency(subscription: Subscription) -> str:
    """The currency the subscription is billed in: its newest invoice's, else its first usage
    record's; '' when neither exists yet (the first record sets it)."""
    invoice = subscription.invoices.order_by("-created_at", "-pk").values_list("currency", flat=True).first()
    if invoice:
        return invoice.lower()
    first = UsageRecord.objects.filter(subscription=subscription).order_by("pk").values_list("currency", flat=True)
    return first.first() or ""


def _validate(usage: UsageInput, now: datetime) -> dict[str, str]:
    errors: dict[str, str] = {}
    if not usage.producer_record_id or len(usage.producer_record_id) > 255 or "\x00" in usage.producer_record_id:
        errors["producer_record_id"] = "1-255 characters, no NUL"
    if usage.metric not in UsageMetric.values:
        errors["metric"] = f"one of {', '.join(UsageMetric.values)}"
    if isinstance(usage.quantity, bool) or not isinstance(usage.quantity, int) or usage.quantity <= 0:
        errors["quantity"] = "a positive whole number"
    if isinstance(usage.cost, bool) or not isinstance(usage.cost, int) or usage.cost < 0:
        errors["cost"] = "a whole number of minor units (cents), zero or more"
    if not _CURRENCY.match(usage.currency.lower()):
        errors["currency"] = "a three-letter ISO 4217 code, e.g. usd"
    if timezone.is_naive(usage.occurred_at):
        errors["occurred_at"] = "needs a UTC offset (e.g. 2026-12-01T10:00:00Z)"
    elif usage.occurred_at > now + CLOCK_TOLERANCE:
        errors["occurred_at"] = "lies in the future; usage is reported after it happened"
    return errors


def usage_check(subscription: Subscription, usage: UsageInput, now: datetime | None = None) -> dict[str, str]:
    """The faults `usage_record` would refuse the record for, without writing (a batch checks every
    record before it records any). The currency is checked again under the lock when recording."""
    errors = _validate(usage, now or trusted_now())
    currency = subscription_currency(subscription)
    if "currency" not in errors and currency and usage.currency.lower() != currency:
        errors["currency"] = _currency_fault(currency)
    return errors


def _currency_fault(currency: str) -> str:
    return f"the subscription is billed in {currency}; report the cost in {currency}"


def _replay_or_conflict(producer: ServiceToken, producer_record_id: str, digest: str) -> UsageOutcome | None:
    existing = UsageRecord.objects.filter(producer=producer, producer_record_id=producer_record_id).first()
    if existing is None:
        return None
    if existing.body_digest != digest:
        raise UsageConflict(existing)
    return UsageOutcome(existing, created=False)


def usage_record(*, subscription: Subscription, producer: ServiceToken, usage: UsageInput,
                 now: datetime | None = None) -> UsageOutcome:
    """Record one usage record, or return the identical one already stored. Raises UsageInvalid
    (bad values, a currency other than the subscription's) or UsageConflict (same id, other body);
    either way nothing is written. The entitlement profile is not consulted: usage is recorded in all."""
    now = now or trusted_now()
    errors = _validate(usage, now)
    if errors:
        raise UsageInvalid(errors)
    digest = usage_digest(subscription.pk, usage)
    replay = _replay_or_conflict(producer, usage.producer_record_id, digest)
    if replay is not None:
        return replay
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Serialises a subscription's writers only: the first two records agree on one currency.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                                   [_USAGE_LOCK_NAMESPACE, subscription.pk % 2**31])
            currency = subscription_currency(subscription)
            if currency and usage.currency.lower() != currency:
                raise UsageInvalid({"currency": _currency_fault(currency)})
            record = UsageRecord.objects.create(
                subscription=subscription, producer=producer, producer_record_id=usage.producer_record_id,
                metric=usage.metric, quantity=usage.quantity, cost=usage.cost, currency=usage.currency.lower(),
                occurred_at=usage.occurred_at, received_at=now, body_digest=digest)
    except IntegrityError:
        # Another request stored this producer id between our look and our insert: its row decides.
        replay = _replay_or_conflict(producer, usage.producer_record_id, digest)
        if replay is None:
            raise
        return replay
    return UsageOutcome(record, created=True)


def usage_mark_invoiced(*, record_pks: Sequence[int], provider_invoice_id: str,
                        now: datetime | None = None) -> int:
    """Mark records as billed by the provider's invoice, once. All or nothing: every record must
    exist, belong to one subscription and be uninvoiced (or already on this same invoice, which
    is a repeat and changes nothing). Returns how many records were newly marked."""
    now = now or trusted_now()
    provider_invoice_id = provider_invoice_id.strip()
    if not provider_invoice_id:
        raise UsageRefused("INVOICE_ID_REQUIRED", "name the provider invoice that bills this usage")
    wanted = set(record_pks)
    with transaction.atomic():
        records = list(UsageRecord.objects.select_for_update().filter(pk__in=wanted).order_by("pk"))
        missing = wanted - {r.pk for r in records}
        if missing:
            raise UsageRefused("UNKNOWN_USAGE_RECORD", f"no usage record {', '.join(map(str, sorted(missing)))}")
        if len({r.subscription_id for r in records}) > 1:
            raise UsageRefused("MIXED_SUBSCRIPTIONS", "one invoice bills the usage of one subscription")
        elsewhere = [r.pk for r in records if r.invoiced_at and r.provider_invoice_id != provider_invoice_id]
        if elsewhere:
            raise UsageRefused("ALREADY_INVOICED",
                               f"usage record(s) {', '.join(map(str, elsewhere))} are already on another invoice")
        fresh = [r.pk for r in records if r.invoiced_at is None]
        return UsageRecord.objects.filter(pk__in=fresh, invoiced_at__isnull=True).update(
            invoiced_at=now, provider_invoice_id=provider_invoice_id)
