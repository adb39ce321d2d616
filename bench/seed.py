"""Database seeding for the bench (runs in the bench process with Django set up).

One prototype subscription is taken through the real services (register → open the renewal
cycle → record_failure → start_grace), so its rows are exactly what the product writes. The
other subscriptions are bulk-created copies of those rows with their own provider ids (matching
the simulator's clones), their own cycle_id, and an `outstanding_cycle_root` recomputed for
that cycle_id, so the root and the latest snapshot stay consistent. The prototype's failure is
recorded with the evidence the payment_failed webhook carries (invoice mirror, PAYMENT_FAILED fact),
and each copy gets the same fact derived from its own invoice, so a fresh fetch of an unchanged
invoice finds nothing new, as in production. Unlike production, copies have no transition
receipts, no provider receipt behind their fact and no payment attempt row: the sweep and event
processing do not read them.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import ACCOUNT, PRICE

if TYPE_CHECKING:  # Django is set up by the caller; nothing here imports it at module level
    from subscriptions.providers.base import ProviderInvoice

BATCH = 2000


def publish_shipped_policies() -> None:
    from dunning.policy.publishing import policy_publish

    for path in sorted((Path(__file__).resolve().parent.parent / "dunning" / "policy" / "shipped").glob("*.yaml")):
        policy_publish(text=path.read_text())


def _fields(obj: Any, **overrides: Any) -> dict[str, Any]:
    values = {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields if not f.primary_key}
    values.update(overrides)
    return values


def _root(cycle_id: uuid.UUID, generation: int) -> str:
    return hashlib.sha256(f"{cycle_id}:{generation}".encode()).hexdigest()


def _failed_invoice(row: dict[str, Any]) -> ProviderInvoice:
    """The provider's view of a row's invoice after its hard-declined renewal attempt, as the
    payment_failed webhook would have shown it."""
    from subscriptions.providers.base import ProviderInvoice

    return ProviderInvoice(
        id=row["invoice"], account=ACCOUNT, subscription_id=row["subscription"], customer_id=row["customer"],
        status="open", amount_due=row["amount"], amount_paid=0, currency=row["currency"],
        attempt_count=row["attempt_count"], next_payment_attempt=None, payment_refs=(row["payment_ref"],),
        price_ids=(PRICE,), billing_reason="subscription_cycle", last_decline_code=row["decline_code"])


def seed_grace_cycles(rows: list[dict[str, Any]], *, failed_at: datetime,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Subscriptions with one cycle each in GRACE_ACTIVE, grace started at `failed_at`.

    `rows` come from the simulator (customer, subscription, invoice ids). Returns
    {"subscription_pks": [...], "cycle_pks": [...]} in the order of `rows`.
    """
    from dunning.acceptance.inputs import Cause, Evidence, Expect
    from dunning.acceptance.opening import InvoiceFacts, cycle_open_for_invoice, subscription_register
    from dunning.acceptance.transitions import cycle_accept_transition
    from dunning.evidence.next_edge import invoice_facts, invoice_update
    from dunning.models import DunningCycle, MonetaryFact
    from dunning.states import CycleState
    from entitlements.models import EntitlementSnapshot
    from subscriptions.models import Customer, Invoice, Subscription

    first = rows[0]
    cause = Cause.system("bench-seed")
    customer = Customer.objects.create(email="bench0@bench.invalid", provider_customer_id=first["customer"])
    sub = subscription_register(customer=customer, provider_account=ACCOUNT,
                                provider_subscription_id=first["subscription"], price_id=PRICE, cause=cause,
                                now=failed_at)
    cycle = cycle_open_for_invoice(
        subscription_pk=sub.pk, cause=cause, now=failed_at,
        invoice=InvoiceFacts(provider_invoice_id=first["invoice"], amount_due=first["amount"],
                             currency=first["currency"], attempt_count=0))

    def load() -> DunningCycle:
        return DunningCycle.objects.select_related("invoice", "subscription", "pending_attempt").get(pk=cycle.pk)

    failed = _failed_invoice(first)
    failure = Evidence(invoice=invoice_update(failed), facts=invoice_facts(failed, decline_code=first["decline_code"],
                                                                          now=failed_at))
    steps = (("record_failure", {"decline_code": first["decline_code"], "attempt_number": failed.attempt_count,
                                 "provider_payment_ref": first["payment_ref"]}, failure),
             ("start_grace", {}, None))
    for edge, params, evidence in steps:
        result = cycle_accept_transition(cycle_pk=cycle.pk, edge=edge, expect=Expect.from_cycle(load()),
                                         cause=cause, params=params, evidence=evidence, now=failed_at)
        if not result.accepted:
            raise RuntimeError(f"seeding the prototype: {edge} refused: {result.reason} {result.detail}")
    proto_cycle = load()
    proto_sub = Subscription.objects.get(pk=sub.pk)
    proto_invoice = Invoice.objects.get(pk=proto_cycle.invoice_id)
    proto_snapshots = list(EntitlementSnapshot.objects.filter(subscription=proto_sub).order_by("generation"))
    assert proto_cycle.state == CycleState.GRACE_ACTIVE, proto_cycle.state
    if _root(proto_cycle.cycle_id, proto_cycle.generation) != proto_sub.outstanding_cycle_root:
        raise RuntimeError("the bench's root formula no longer matches dunning.acceptance.aggregate.outstanding_root")

    sub_pks, cycle_pks = [proto_sub.pk], [proto_cycle.pk]
    rest = rows[1:]
    for start in range(0, len(rest), BATCH):
        chunk = rest[start:start + BATCH]
        customers = Customer.objects.bulk_create([
            Customer(**_fields(customer, provider_customer_id=r["customer"],
                               email=f"bench{start + i + 1}@bench.invalid"))
            for i, r in enumerate(chunk)])
        cycle_ids = [uuid.uuid4() for _ in chunk]
        subs = Subscription.objects.bulk_create([
            Subscription(**_fields(proto_sub, customer_id=c.pk, provider_subscription_id=r["subscription"],
                                   outstanding_cycle_root=_root(cid, proto_cycle.generation)))
            for c, r, cid in zip(customers, chunk, cycle_ids, strict=True)])
        invoices = Invoice.objects.bulk_create([
            Invoice(**_fields(proto_invoice, subscription_id=s.pk, provider_invoice_id=r["invoice"]))
            for s, r in zip(subs, chunk, strict=True)])
        cycles = DunningCycle.objects.bulk_create([
            DunningCycle(**_fields(proto_cycle, cycle_id=cid, subscription_id=s.pk, invoice_id=v.pk,
                                   grace_started_at=proto_cycle.grace_started_at - spread,
                                   grace_expires_at=proto_cycle.grace_expires_at - spread))
            for s, v, cid, spread in zip(subs, invoices, cycle_ids,
                                         (timedelta(seconds=(start + i) % 3600) for i in range(len(chunk))),
                                         strict=True)])
        # Each copy's facts are derived from its own invoice, with the keys a fresh fetch computes.
        MonetaryFact.objects.bulk_create([
            MonetaryFact(kind=f.kind, invoice_id=v.pk, cycle_id=c.pk, amount=f.amount, currency=f.currency,
                         provider_ref=f.provider_ref, decline_code=f.decline_code, dedupe_key=f.dedupe_key,
                         occurred_at=f.occurred_at, recorded_at=failed_at)
            for c, v, r in zip(cycles, invoices, chunk, strict=True)
            for f in invoice_facts(_failed_invoice(r), decline_code=r["decline_code"], now=failed_at)])
        EntitlementSnapshot.objects.bulk_create([
            EntitlementSnapshot(**_fields(snap, subscription_id=s.pk, cause_receipt_id=None))
            for s in subs for snap in proto_snapshots])
        sub_pks.extend(s.pk for s in subs)
        cycle_pks.extend(c.pk for c in cycles)
        if progress:
            progress(f"seeded {len(cycle_pks)}/{len(rows)} subscriptions in grace")
    return {"subscription_pks": sub_pks, "cycle_pks": cycle_pks,
            "grace_generation": proto_sub.entitlement_generation}
