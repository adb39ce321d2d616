"""The weekly sample review (seed 003: "建议每周抽样检查至少20条失败订阅，核对支付事件与会员状态是否一致").

`sample_review_pick` picks, for one ISO week, DUNNING_SAMPLE_REVIEW_SIZE (20) subscriptions that
had a failed payment in that week (a FAILED payment attempt resolved, or a PAYMENT_FAILED money
fact that occurred, within the week), or all of them when fewer exist. The pick is random but
seeded from the week's name, so a re-run picks the same set; and a week is picked once (the
unique `week`), so a re-run returns the stored sample. Each item freezes the subscription's state,
its evidence and the automatic review verdict (`dunning.reads.review.subscription_verdict`) as they
stood at pick time.

A reviewer (permission `dunning.review_sample`) records CORRECT / INCORRECT / UNSURE with a note
through `sample_verdict_record`: one current verdict per item; changing it writes a new row that
`replaces` the previous one (a one-to-one chain, so two reviewers racing cannot both change it).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from dunning.clock import trusted_now
from dunning.models import DunningCycle, FactKind, MonetaryFact, PaymentAttempt, ProviderReceipt
from dunning.models.duties import ReviewerVerdict, SampleReview, SampleReviewItem, SampleVerdict
from dunning.reads.review import subscription_verdict
from dunning.refusals import CodedRefusal
from dunning.states import AttemptState
from subscriptions.models import Subscription

PERMISSION = "dunning.review_sample"
DEFAULT_SIZE = 20
EVIDENCE_ROWS = 20  # per kind, per subscription, newest first


class SampleReviewRefused(CodedRefusal):
    """The verdict cannot be recorded; nothing changed."""


@dataclass(frozen=True)
class IsoWeek:
    name: str  # "2026-W48"
    start: datetime  # Monday 00:00 UTC
    end: datetime  # the next Monday 00:00 UTC (exclusive)

    @classmethod
    def of(cls, moment: datetime) -> IsoWeek:
        year, week, weekday = moment.astimezone(UTC).isocalendar()
        monday = date.fromisocalendar(year, week, 1)
        start = datetime.combine(monday, time(), tzinfo=UTC)
        return cls(f"{year}-W{week:02d}", start, start + timedelta(days=7))

    @classmethod
    def named(cls, name: str) -> IsoWeek:
        try:
            year, week = name.split("-W")
            return cls.of(datetime.combine(date.fromisocalendar(int(year), int(week), 1), time(), tzinfo=UTC))
        except ValueError as exc:
            raise ValueError(f'an ISO week looks like "2026-W48", not {name!r}') from exc

    def previous(self) -> IsoWeek:
        return IsoWeek.of(self.start - timedelta(days=1))


def failed_in_week(week: IsoWeek) -> list[int]:
    """Primary keys of the subscriptions with a failed payment in the week, ascending."""
    by_attempt = (PaymentAttempt.objects.filter(state=AttemptState.FAILED, resolved_at__gte=week.start,
                                                resolved_at__lt=week.end)
                  .values_list("cycle__subscription_id", flat=True))
    by_fact = (MonetaryFact.objects.filter(kind=FactKind.PAYMENT_FAILED, occurred_at__gte=week.start,
                                           occurred_at__lt=week.end)
               .values_list("invoice__subscription_id", flat=True))
    return sorted(set(by_attempt) | set(by_fact))


def week_seed(week: IsoWeek) -> str:
    return hashlib.sha256(f"dunning-sample-review:{week.name}".encode()).hexdigest()


def pick_from(population: list[int], *, week: IsoWeek, size: int) -> list[int]:
    """The same week and population always give the same picks, in the same order."""
    chooser = random.Random(week_seed(week))  # noqa: S311 - a reproducible sample, not a secret
    return chooser.sample(population, min(size, len(population)))


def sample_size() -> int:
    size = int(getattr(settings, "DUNNING_SAMPLE_REVIEW_SIZE", DEFAULT_SIZE))
    if size < 1:
        raise ValueError(f"DUNNING_SAMPLE_REVIEW_SIZE must be at least 1, not {size}")
    return size


def state_snapshot(sub: Subscription) -> dict[str, Any]:
    cycles = DunningCycle.objects.filter(subscription=sub).select_related("invoice").order_by("opened_at", "pk")
    return {
        "subscription": sub.provider_subscription_id, "entitlement_profile": sub.entitlement_profile,
        "entitlement_generation": sub.entitlement_generation, "provider_status": sub.provider_status,
        "cohort": sub.cohort, "policy": str(sub.policy_id),
        "cycles": [{"cycle": str(c.cycle_id), "invoice": c.invoice.provider_invoice_id, "state": c.state,
                    "invoice_status": c.invoice.status, "amount": c.amount, "currency": c.currency,
                    "failure_class": c.failure_class,
                    "grace_expires_at": c.grace_expires_at.isoformat() if c.grace_expires_at else None}
                   for c in cycles],
    }


def evidence_snapshot(sub: Subscription) -> dict[str, Any]:
    facts = (MonetaryFact.objects.filter(invoice__subscription=sub).select_related("invoice")
             .order_by("-occurred_at", "-pk")[:EVIDENCE_ROWS])
    attempts = (PaymentAttempt.objects.filter(cycle__subscription=sub).select_related("cycle__invoice")
                .order_by("-created_at", "-pk")[:EVIDENCE_ROWS])
    receipts = (ProviderReceipt.objects.filter(invoice__subscription=sub).order_by("-fetched_at", "-pk")
                [:EVIDENCE_ROWS])
    return {
        "facts": [{"kind": f.kind, "invoice": f.invoice.provider_invoice_id, "amount": f.amount,
                   "currency": f.currency, "decline_code": f.decline_code, "occurred_at": f.occurred_at.isoformat()}
                  for f in facts],
        "attempts": [{"invoice": a.cycle.invoice.provider_invoice_id, "origin": a.origin, "state": a.state,
                      "decline_code": a.decline_code, "at": (a.resolved_at or a.created_at).isoformat()}
                     for a in attempts],
        "receipts": [{"object": f"{r.object_type} {r.object_id}", "status": r.status,
                      "fetched_at": r.fetched_at.isoformat(), "digest": r.body_digest[:12]} for r in receipts],
    }


def sample_review_pick(*, now: datetime | None = None, week: IsoWeek | None = None) -> tuple[SampleReview, bool]:
    """Pick the sample of `week` (by default the ISO week before `now`'s, the last complete one).
    Returns (review, picked_now); a week already picked is returned as stored."""
    now = now or trusted_now()
    week = week or IsoWeek.of(now).previous()
    if week.start > now:
        raise ValueError(f"week {week.name} has not started at {now.isoformat()}")
    existing = SampleReview.objects.filter(week=week.name).first()
    if existing is not None:
        return existing, False
    size = sample_size()
    population = failed_in_week(week)
    picks = pick_from(population, week=week, size=size)
    subscriptions = Subscription.objects.select_related("policy").in_bulk(picks)
    try:
        with transaction.atomic():
            review = SampleReview.objects.create(week=week.name, week_start=week.start, week_end=week.end,
                                                 picked_at=now, seed=week_seed(week), requested_size=size,
                                                 population=len(population))
            for position, pk in enumerate(picks, start=1):
                sub = subscriptions[pk]
                verdict = subscription_verdict(sub, now=now)
                SampleReviewItem.objects.create(
                    review=review, subscription=sub, position=position, state_snapshot=state_snapshot(sub),
                    evidence_snapshot=evidence_snapshot(sub), automatic_verdict=verdict.status,
                    automatic_blockers=[b.as_dict() for b in verdict.blockers])
    except IntegrityError:  # another worker picked this week first
        return SampleReview.objects.get(week=week.name), False
    return review, True


def current_verdict(item: SampleReviewItem) -> SampleVerdict | None:
    return item.verdicts.filter(replaced_by__isnull=True).order_by("-recorded_at", "-pk").first()


def sample_verdict_record(*, item_pk: int, user: Any, verdict: str, note: str = "",
                          now: datetime | None = None) -> SampleVerdict:
    """Record (or change) the reviewer's verdict on one item. A change is a new row replacing the
    current one; recording the verdict already current, with the same note, changes nothing."""
    if not getattr(user, "is_authenticated", False) or not user.has_perm(PERMISSION):
        raise SampleReviewRefused("NOT_A_REVIEWER", "Only a billing lead may record sample review verdicts.")
    if verdict not in ReviewerVerdict.values:
        raise SampleReviewRefused("UNKNOWN_VERDICT", f"Choose one of: {', '.join(ReviewerVerdict.values)}.")
    note = (note or "").strip()
    if verdict != ReviewerVerdict.CORRECT and not note:
        raise SampleReviewRefused("NOTE_REQUIRED", "Say what is wrong or unclear: INCORRECT and UNSURE need a note.")
    now = now or trusted_now()
    try:
        with transaction.atomic():
            item = SampleReviewItem.objects.select_for_update().filter(pk=item_pk).first()
            if item is None:
                raise SampleReviewRefused("NO_SUCH_ITEM", f"There is no sample review item {item_pk}.")
            previous = current_verdict(item)
            if previous is not None and (previous.verdict, previous.note) == (verdict, note):
                return previous
            return SampleVerdict.objects.create(item=item, verdict=verdict, note=note, reviewer=user,
                                                replaces=previous, recorded_at=now)
    except IntegrityError as exc:
        raise SampleReviewRefused("VERDICT_CHANGED_MEANWHILE",
                                  "Someone recorded a verdict on this item just now; reload and look again.") from exc
