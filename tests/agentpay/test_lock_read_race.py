"""The one-statement lock read against a concurrent acceptance (agentpay/services/locking.py):
its snapshot is taken before it waits, so a hold taken by the acceptance it waited for is not in
that snapshot. The lock read must still return the settlement with its hold, never "no hold"."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from agentpay.bridge import trusted_now
from agentpay.services import acceptance
from agentpay.services.intents import intent_open
from agentpay.services.locking import lock_intent
from agentpay.services.results import Cause, Step


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # pg_locks, not pg_stat_activity: the statistics views are a snapshot per transaction.
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True)
def test_a_hold_taken_while_the_lock_read_waited_is_read_with_its_settlement(funded, routes):
    intent = intent_open(tenant=funded, route=routes["ok"], rail="wallet", idempotency_key="race", digest="d",
                         forward_path="", forward_query="", content_type="", body=b"", request_id=uuid.uuid4(),
                         now=trusted_now()).intent
    assert acceptance.intent_accept(intent_id=intent.intent_id, steps=[Step("intent", "payload_verified")],
                                    cause=Cause.system("test")).accepted
    seen: dict = {}

    def reader() -> None:
        try:
            seen["started"] = True
            with transaction.atomic(), CaptureQueriesContext(connection) as captured:
                _, settlement, _, _ = lock_intent(intent.intent_id, wallet=False)
                seen["hold"] = settlement.hold
                seen["queries"] = len(captured.captured_queries)
        except BaseException as exc:  # noqa: BLE001 - the main thread reports it
            seen["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=reader)
    with transaction.atomic():  # the concurrent acceptance: holds the intent's lock while it takes the hold
        acceptance._accept_locked(intent.intent_id, [Step("settlement", "hold_acquired")], Cause.system("race"),
                                  None, trusted_now())
        thread.start()
        deadline = time.monotonic() + 30
        while not _waiting_on_a_lock():
            assert time.monotonic() < deadline, f"the lock read never waited: {seen}"
            time.sleep(0.02)
    thread.join(30)
    assert seen["hold"] is not None and seen["hold"].kind == "pending" and seen["hold"].intent_id == intent.pk
    assert seen["queries"] == 2  # the lock read, then the hold its snapshot could not see
