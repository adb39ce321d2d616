"""A crashed worker does not break the payment → recovery gate (issue 15, item 10).

The fault as it happened: every Celery worker process killed (`kill -9`) during a burst of paid
webhooks and started again about 10 s later. The killed worker's tasks stay unacknowledged in
Redis until the broker's visibility timeout (an hour), so their events are orphaned: nothing
redelivers them within the gate. The inbox sweep, run as beat runs it, must find them within
seconds (nobody holds their claim), and every subscription must be FULL again with every
payment → recovery under 60 s.

A real worker process (`celery worker -P prefork`) runs against Redis and the test database
(committed rows: a transactional test), talking to the Stripe-compatible simulator over loopback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from django.db import connection

from config.celery import app as celery_app
from dunning.claims import claim
from dunning.gates import gates_evaluate
from dunning.jobs.framework import job_run
from dunning.jobs.schedule import beat_schedule
from dunning.models import EventOutcome, JobRun, ProviderEvent
from dunning.tasks import process_provider_event
from entitlements.profiles import FULL
from subscriptions.models import Subscription
from tests.support.broker import tasks_through
from tests.support.scenarios import cycle_of, failed_renewal, lose_pending_webhooks

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DUNNING_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
OWNER_MARK = "dunning-tests:orphaned-events"
SUBSCRIPTIONS = 5
PROVIDER_LATENCY_SECONDS = 0.8  # each invoice fetch: the worker is surely mid-task when it is killed
DOWN_SECONDS = 10
DEADLINE_SECONDS = 45  # after the burst; the gate is 60 s


def _test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    """`celery worker` in its own process group, so one kill reaches the parent and its children."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.proc, self.starts = env, log, None, 0

    def start(self) -> None:
        self.starts += 1
        argv = [str(Path(sys.executable).parent / "celery"), "-A", "config", "worker", "-P", "prefork", "-c", "2",
                "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"orphans{os.getpid()}-{self.starts}@%h"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"celery worker exited ({self.proc.returncode}):\n{self.tail()}")
            if self.log.read_text(errors="replace").count(" ready.") >= self.starts:
                return
            time.sleep(0.1)
        raise AssertionError(f"celery worker not ready after {timeout} s:\n{self.tail()}")

    def kill9(self) -> None:
        """SIGKILL to every process of the worker: no shutdown, no ack, no cleanup."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the test is over; nothing to finish
            self.proc.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def broker():
    """The Redis database this test owns for its run; refused if it holds someone else's keys."""
    r = redis.Redis.from_url(REDIS_URL)
    size = r.dbsize()
    if size and r.get(OWNER_MARK) is None:
        pytest.fail(f"{REDIS_URL} holds {size} keys that are not this test's; set DUNNING_TEST_REDIS_URL to a free "
                    f"Redis database")
    r.flushdb()
    r.set(OWNER_MARK, "1")
    yield r
    r.flushdb()


@pytest.fixture
def worker(broker, sim, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=_test_database_url(), REDIS_URL=REDIS_URL,
               STRIPE_API_BASE=sim.base_url, STRIPE_ACCOUNT="acct_demo", STRIPE_WEBHOOK_SECRETS="whsec_local",
               STRIPE_TIMEOUT_SECONDS="10", DUNNING_CLOCK_OVERRIDE="APPLICATION", LOG_LEVEL="WARNING",
               PYTHONUNBUFFERED="1")
    w = Worker(env, tmp_path / "celery.log")
    yield w
    w.stop()


def _settled(paid: list[str]) -> bool:
    """Every subscription FULL, every paid event processed, and no sweep run still going."""
    return (not Subscription.objects.exclude(entitlement_profile=FULL).exists()
            and not ProviderEvent.objects.filter(event_id__in=paid, processed_at__isnull=True).exists()
            and not JobRun.objects.filter(job="inbox_sweep", finished_at__isnull=True).exists())


def tasks_through_redis():
    """This process hands tasks to Redis as the web process does (the suite runs them in process)."""
    return tasks_through(REDIS_URL)


def test_events_orphaned_by_a_killed_worker_recover_inside_the_gate(sim, worker, broker):
    worker.start()  # starts while the scenario is built
    payers = [failed_renewal(sim)[:2] for _ in range(SUBSCRIPTIONS)]
    subscriptions = list(Subscription.objects.all())
    assert len(subscriptions) == SUBSCRIPTIONS and all(s.entitlement_profile != FULL for s in subscriptions)
    for customer, invoice_id in payers:
        sim.set_card(customer, "ok")
        sim.customer_pays(invoice_id)
    # One paid event per subscription, so each recovery depends on its own event's fate.
    paid = [e["id"] for e in sim.pending_events() if e["type"] == "invoice.paid"]
    assert len(paid) == SUBSCRIPTIONS
    lose_pending_webhooks(sim)
    sim.faults.latency("GET /v1/invoices/*", PROVIDER_LATENCY_SECONDS, count=10 * SUBSCRIPTIONS)
    worker.wait_ready()
    sweep = beat_schedule()["dunning:inbox_sweep"]

    with tasks_through_redis():
        burst_at = time.monotonic()
        for event_id in paid:  # the burst: each webhook stored, acknowledged, handed to Redis
            (delivery,) = sim.deliver(event_id)
            assert delivery.ok, delivery
        while broker.hlen("unacked") < 2 and time.monotonic() < burst_at + 10:
            time.sleep(0.05)  # until the worker holds tasks
        time.sleep(PROVIDER_LATENCY_SECONDS / 2)  # ... and is inside them
        worker.kill9()
        killed_at = time.monotonic()
        stranded = broker.hlen("unacked")
        assert stranded, f"the kill left no task unacknowledged in Redis; nothing was orphaned:\n{worker.tail()}"

        # Beat goes on (it is its own process) and queues the sweep on its cadence; the worker is
        # started again DOWN_SECONDS after the kill.
        next_sweep, restarted = burst_at + sweep["schedule"], False
        while time.monotonic() < burst_at + DEADLINE_SECONDS:
            now = time.monotonic()
            if now >= next_sweep:
                celery_app.send_task(sweep["task"], args=sweep["args"], **sweep["options"])
                next_sweep += sweep["schedule"]
            if not restarted and now >= killed_at + DOWN_SECONDS:
                worker.start()
                restarted = True
            if restarted and _settled(paid):
                break
            time.sleep(0.2)

    assert broker.hlen("unacked") >= stranded, "the broker redelivered nothing: only the sweep could recover them"
    behind = list(Subscription.objects.exclude(entitlement_profile=FULL).values_list("provider_subscription_id",
                                                                                      "entitlement_profile"))
    events = list(ProviderEvent.objects.filter(event_id__in=paid))
    assert not behind, (f"not FULL {DEADLINE_SECONDS} s after the burst: {behind}; events "
                        f"{[(e.event_id, e.outcome, e.attempts) for e in events]}\n{worker.tail()}")
    assert len(events) == SUBSCRIPTIONS, "every paid webhook was kept in the inbox"
    # APPLIED, or NO_CHANGE when the killed worker had committed the recovery but not the event's outcome.
    assert all(e.processed_at is not None and e.outcome in (EventOutcome.APPLIED, EventOutcome.NO_CHANGE)
               for e in events)
    assert all(e.attempts == 1 for e in events), "no event was processed twice"
    sweeps = list(JobRun.objects.filter(job="inbox_sweep").values_list("status", "examined", "changed", "detail"))
    assert sum(changed for _, _, changed, _ in sweeps) >= 1, f"the inbox sweep recovered the orphans: {sweeps}"
    gate = next(g for g in gates_evaluate().gates if g.key == "payment_to_recovery_p99")
    assert gate.passed and gate.figure < 60, gate
    assert gate.sample_size >= SUBSCRIPTIONS, gate


def test_the_sweep_leaves_an_event_a_live_worker_holds_and_takes_it_once_that_worker_is_gone(sim, settings,
                                                                                             monkeypatch):
    """In flight on a live worker (its claim held) versus orphaned (nobody holds it): the sweep and a
    second copy of the task leave the first alone, and the sweep takes the event once the claim goes
    with its worker's connection, seconds after receipt rather than a minute."""
    settings.DUNNING_INBOX_ORPHAN_SECONDS = 1
    customer, invoice_id, _ = failed_renewal(sim)
    monkeypatch.setattr("dunning.evidence.intake._enqueue", lambda pk: None)  # hand-off lost
    sim.set_card(customer, "ok")
    sim.customer_pays(invoice_id)
    (paid,) = [e["id"] for e in sim.pending_events() if e["type"] == "invoice.paid"]
    lose_pending_webhooks(sim)
    assert sim.deliver(paid)[0].ok
    event = ProviderEvent.objects.get(event_id=paid)
    held, release = threading.Event(), threading.Event()

    def live_worker() -> None:  # a worker in the middle of this event, on its own connection
        try:
            with claim("event", event.pk) as got:
                assert got
                held.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=live_worker)
    thread.start()
    try:
        assert held.wait(10)
        time.sleep(1.2)  # older than the orphan threshold
        run = job_run("inbox_sweep")
        assert (run.examined, run.changed) == (1, 0), "an event in flight on a live worker is left to it"
        assert process_provider_event.apply(args=(event.pk,)).result == "IN_FLIGHT", "a second copy does not run it"
        event.refresh_from_db()
        assert (event.attempts, event.processed_at, event.outcome) == (0, None, EventOutcome.PENDING)
    finally:
        release.set()
        thread.join(10)
    run = job_run("inbox_sweep")  # the worker is gone, and its claim with its connection
    event.refresh_from_db()
    assert (run.examined, run.changed) == (1, 1) and event.outcome == EventOutcome.APPLIED and event.attempts == 1
    assert cycle_of(invoice_id).state == "RECOVERED"
