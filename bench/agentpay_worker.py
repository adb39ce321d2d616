"""One AgentPay hold + capture worker (a spawned process with its own database connection).

Each iteration is one paid call through the real services, the path the gateway takes minus
HTTP: `intent_open` under a fresh key taking payload_verified, hold_acquired and dispatch as it
opens (wallet_flow.open_steps) on the wallet as read (its hold guarded), then
`intent_drive_wallet` — the upstream's 2xx accepted with capture, settlement_confirmed and the
lease cleared on the rows as opened (two statements, each committed alone; the two ledger moves
are the hold and the capture). The upstream call itself is answered in process
(`UpstreamAnswer("2xx")`): the gateway phase measures HTTP.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any


def run(database_url: str, tenant_pks: list[int], route_pk: int, ready: Any, start: Any, seconds: float,
        results: Any, profile: str = "") -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)
    from agentpay.bridge import ApiAccess, trusted_now
    from agentpay.models import AccountKind, LedgerAccount, PricedRoute, Tenant
    from agentpay.services import wallet_flow
    from agentpay.services.intents import intent_open, request_digest
    from agentpay.services.results import Cause
    from agentpay.upstream import UpstreamAnswer

    wallet_flow.upstream_forward = lambda **_: UpstreamAnswer("2xx", status=200, body=b"{}")
    route = PricedRoute.objects.get(pk=route_pk)
    tenants = list(Tenant.objects.filter(pk__in=tenant_pks))
    # The gateway reads the wallet with the API key (agentpay.api.front), unlocked: what the open
    # checks its hold on before the statement's guard decides. Read once here, as the worker reads
    # no key: a stale balance only makes the guard the one to refuse.
    wallets = {w.tenant_id: w for w in LedgerAccount.objects.filter(kind=AccountKind.WALLET, tenant__in=tenants,
                                                                      currency=route.currency)}
    rng = random.Random(os.getpid())
    access = ApiAccess(True)
    tag = uuid.uuid4().hex[:8]
    digest = request_digest(method="POST", route_slug=route.slug, path="", query="", content_type="", body=b"")

    def one(i: int) -> bool:
        tenant = tenants[rng.randrange(len(tenants))]
        request_id = uuid.uuid4()
        opened = intent_open(tenant=tenant, route=route, rail="wallet", idempotency_key=f"bench-{tag}-{i}",
                             digest=digest, forward_path="", forward_query="", content_type="", body=b"",
                             request_id=request_id, now=trusted_now(),
                             steps=wallet_flow.open_steps(route.price_minor), wallet_read=wallets.get(tenant.pk))
        cause = Cause.request(request_id, tenant.tenant_id)
        driven = wallet_flow.intent_drive_wallet(intent=opened.intent, cause=cause, access=access,
                                                 request_id=request_id, just_opened=opened.created,
                                                 opened_lines=opened.lines, opened_settlement=opened.settlement,
                                                 release_lease=True)
        return driven.outcome is not None and driven.outcome.accepted and driven.outcome.lines.intent == "completed"

    for i in range(3):  # warm the connection and the caches
        if not one(-1 - i):
            results.put({"error": "a warm-up call did not complete"})
            return
    from config.startup_heap import freeze_startup_heap

    freeze_startup_heap()  # as the gunicorn and Celery processes it stands for do (config/startup_heap.py)
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
    ready.put(os.getpid())
    start.wait()
    if profiler is not None:
        profiler.start()
    done = failed = i = 0
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        if one(i):
            done += 1
        else:
            failed += 1
        i += 1
    elapsed = time.perf_counter() - began
    if profiler is not None:
        profiler.stop()
        with open(profile, "w") as fh:
            fh.write(profiler.output_text(unicode=False, color=False))
    results.put({"pid": os.getpid(), "completed": done, "failed": failed, "seconds": elapsed})
