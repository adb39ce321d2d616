"""The shadow report (seed 001, SPEC §15): for every dunning cycle decided while its subscription
was not enforced (SHADOW, NOTIFY_ONLY, or ENFORCE outside the rollout), three things side by side:

- what the shadow decided: the cycle's own state machine ran as usual (GRACE_ACTIVE, RESTRICTED,
  …) while access was left alone — the furthest state it reached, and the access actually held;
- what ENFORCE would have done: the most restrictive profile the decision computed (each such
  transition receipt records it as ``decision_profile``);
- what happened afterwards: paid (a PAYMENT_SUCCEEDED fact or a recovered cycle), restricted
  (the cycle is restricted now), canceled, voided, or still open.

A disagreement is a case where enforcing would have been wrong or the two decisions contradict:
ENFORCE would have restricted a customer who then paid; ENFORCE would have kept full access to a
debt that ended canceled; or the shadow's state machine restricted while the decision kept FULL.
Read-only: it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dunning.models import FactKind, MonetaryFact, TransitionReceipt
from dunning.policy.cache import policy_spec
from dunning.policy.document import PROFILES
from dunning.policy.rollout import SHADOW_DECISION
from dunning.states import RESTRICTED_PROFILE_STATES, SETTLED_STATES
from entitlements.models import EntitlementSnapshot
from entitlements.profiles import FULL

RESTRICTED_STATES = {str(s) for s in RESTRICTED_PROFILE_STATES}
PAID_STATES = {"RECOVERED"}


@dataclass(frozen=True)
class ShadowCase:
    cycle_id: str
    subscription: str
    subscription_pk: int
    policy: str
    mode: str
    shadow_state: str
    access_held: str
    enforce_profile: str
    outcome: str
    disagreement: str

    @property
    def disagrees(self) -> bool:
        return bool(self.disagreement)


def _rank(profile: str) -> int:
    return PROFILES.index(profile) if profile in PROFILES else 0


def _outcome(cycle, paid: bool) -> str:  # noqa: ANN001 - DunningCycle
    if paid or cycle.state in PAID_STATES:
        return "paid"
    if cycle.state == "CANCELED":
        return "canceled"
    if cycle.state in RESTRICTED_STATES:
        return "restricted"
    if cycle.state in {str(s) for s in SETTLED_STATES} or cycle.state == "CLOSED_VOID":
        return "voided"
    return "open"


def _disagreement(enforce_profile: str, restricts_from: str, reached_restriction: bool, outcome: str) -> str:
    would_restrict = _rank(enforce_profile) >= _rank(restricts_from)
    if would_restrict and outcome == "paid":
        return f"ENFORCE would have restricted to {enforce_profile}; the customer paid afterwards"
    if enforce_profile == FULL and outcome == "canceled":
        return "ENFORCE would have kept FULL access; the debt ended canceled"
    if reached_restriction and enforce_profile == FULL:
        return "the shadow restricted the cycle but the decision kept FULL access"
    return ""


def shadow_report(*, limit: int = 500) -> list[ShadowCase]:
    """Cycles decided without enforcement, newest first (at most `limit` cycles)."""
    receipts = (TransitionReceipt.objects.filter(accepted=True, cycle__isnull=False, detail__contains=SHADOW_DECISION)
                .select_related("cycle__policy", "subscription").order_by("-pk"))
    by_cycle: dict[int, list[TransitionReceipt]] = {}
    for receipt in receipts.iterator(chunk_size=1000):
        if receipt.cycle_id not in by_cycle and len(by_cycle) >= limit:
            continue
        by_cycle.setdefault(receipt.cycle_id, []).append(receipt)
    if not by_cycle:
        return []
    cycles = {r[0].cycle_id: r[0].cycle for r in by_cycle.values()}
    paid = set(MonetaryFact.objects.filter(kind=FactKind.PAYMENT_SUCCEEDED,
                                           invoice_id__in=[c.invoice_id for c in cycles.values()])
               .values_list("invoice_id", flat=True))
    held = {(s, g): p for s, g, p in EntitlementSnapshot.objects.filter(
        subscription_id__in={r[0].subscription_id for r in by_cycle.values()}).values_list(
        "subscription_id", "generation", "profile")}
    cases = []
    for cycle_pk, shadow_receipts in by_cycle.items():
        cycle, newest = cycles[cycle_pk], shadow_receipts[0]
        strictest = max(shadow_receipts, key=lambda r: _rank(r.decision_profile))
        spec = policy_spec(cycle.policy)
        reached = any(r.to_state in RESTRICTED_STATES for r in shadow_receipts) or cycle.state in RESTRICTED_STATES
        outcome = _outcome(cycle, cycle.invoice_id in paid)
        mode = newest.detail.split("; mode ", 1)[-1].split(":", 1)[0]
        cases.append(ShadowCase(
            cycle_id=str(cycle.cycle_id), subscription=newest.subscription.provider_subscription_id,
            subscription_pk=newest.subscription_id, policy=cycle.policy.identity, mode=mode,
            shadow_state=strictest.to_state or cycle.state,
            access_held=held.get((strictest.subscription_id, strictest.entitlement_generation), FULL),
            enforce_profile=strictest.decision_profile, outcome=outcome,
            disagreement=_disagreement(strictest.decision_profile, spec.restricted_profile, reached, outcome),
        ))
    return cases


def shadow_disagreements(*, limit: int = 500) -> list[ShadowCase]:
    return [case for case in shadow_report(limit=limit) if case.disagrees]
