"""The paid-event task under ``celery worker -P threads`` (issue 21): many invoice.paid events,
each delivered twice, processed at once on four threads (each its own database connection, as
Celery's thread pool gives them) against a simulator with latency: every subscription is restored
exactly once and every event is finished."""

from __future__ import annotations

import pytest

from dunning.evidence import intake
from dunning.models import EventOutcome, ProviderEvent
from dunning.models import TransitionReceipt as Receipt
from dunning.tasks import process_provider_event
from tests.support.scenarios import cycle_of, failed_renewal
from tests.support.threads import run_together
from tests.verification.fake_stripe.realism import NetworkProfile

pytestmark = pytest.mark.django_db(transaction=True)


class HeldBack:
    """Stands in for the broker: the stored events wait for the threads below."""

    def __init__(self) -> None:
        self.pks: list[int] = []

    def delay(self, pk: int) -> None:
        self.pks.append(pk)


def test_paid_events_processed_on_threads_restore_each_subscription_exactly_once(sim, client, time_machine,
                                                                                  monkeypatch):
    time_machine.move_to("2026-12-01T09:00:00Z", tick=True)
    renewals = [failed_renewal(sim)[:2] for _ in range(8)]
    queue = HeldBack()
    monkeypatch.setattr(intake.EVENT_HANDOFF, "task", queue)
    for customer, invoice_id in renewals:
        sim.set_card(customer, "ok")
        sim.customer_pays(invoice_id)
    for event in sim.pending_events():
        if event["type"] == "invoice.paid":
            body, headers = sim.signed_payload(event["id"])
            response = client.post("/webhooks/stripe/", data=body, content_type="application/json",
                                   HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
            assert response.status_code == 200
    assert len(queue.pks) == 8 and all(cycle_of(i).state == "GRACE_ACTIVE" for _, i in renewals)
    refusals_before = Receipt.objects.filter(accepted=False).count()
    sim.network.configure(NetworkProfile(latency_ms=30, latency_spread_ms=10, read_rate=50, write_rate=50))

    # Each event handed to two threads (a redelivery), four threads as `-P threads -c 4` runs them.
    shares = [queue.pks[i::4] + queue.pks[(i + 1) % 4::4] for i in range(4)]
    # The eager result is read in the calling thread, not in a task; Celery's guard against a task
    # waiting on another would otherwise trip on state an earlier test left in this process.
    def run_share(share: list[int]) -> list[object]:
        return [process_provider_event.apply(args=(pk,)).get(disable_sync_subtasks=False) for pk in share]

    results = run_together([lambda share=share: run_share(share) for share in shares], timeout=120)

    assert sum(len(r) for r in results) == 16
    for _, invoice_id in renewals:
        cycle = cycle_of(invoice_id)
        assert cycle.state == "RECOVERED"
        assert cycle.subscription.entitlement_profile == "FULL"
        recovered = Receipt.objects.filter(cycle=cycle, accepted=True, to_state="RECOVERED")
        assert recovered.count() == 1, list(recovered.values_list("edge", "cause_ref"))
    assert Receipt.objects.filter(accepted=False).count() == refusals_before, "a redelivery is not asked twice"
    events = ProviderEvent.objects.filter(pk__in=queue.pks)
    assert all(e.processed_at is not None and e.outcome == EventOutcome.APPLIED for e in events), [
        (e.pk, e.outcome, e.error) for e in events]
