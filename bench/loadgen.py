"""Signed webhook deliveries from an asyncio client (aiohttp).

`open_loop`: a fixed offered rate. Request i is due at start + i/rate whatever happened to the
earlier ones (no coordinated omission); its latency is measured both from its due time (what a
sender at that rate sees, queueing in the client included) and from the moment it was sent.
Each result is (seconds from due, seconds from send, status, index, due time as a Unix epoch). The
bodies are signed before the timed window, each with its due time as the signature's timestamp (what
a sender signing at that moment would send), so the loop itself only sends; the client's own CPU time
and how late it sent (its event loop's lag) come back with the results, to tell a slow server from a
slow client.
`burst`: every delivery at once, `concurrency` in flight; returns each one's wall-clock send time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from bench.common import without_collector_pauses


def sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
    ts = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def synthetic_event(event_id: str, invoice_id: str, account: str) -> bytes:
    return json.dumps({
        "id": event_id, "object": "event", "type": "invoice.paid", "created": int(time.time()),
        "api_version": "2026-10-28.endive", "livemode": False, "account": account,
        "data": {"object": {"id": invoice_id, "object": "invoice", "status": "paid"}},
    }).encode()


async def _post(session: Any, url: str, body: bytes, secret: str, signature: str = "") -> int:
    headers = {"Content-Type": "application/json", "Stripe-Signature": signature or sign(body, secret)}
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()
        return response.status


def open_loop(url: str, bodies: list[bytes], rate: float, secret: str,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    import aiohttp

    async def go() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=30)
        results: list[tuple[float, float, int, int, float]] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            # Due times start 0.2 s from now plus the time signing takes (a few µs a body).
            start_epoch = time.time() + 0.2 + 2e-5 * len(bodies)
            signatures = [sign(body, secret, int(start_epoch + i / rate)) for i, body in enumerate(bodies)]
            start = loop.time() + (start_epoch - time.time())
            to_epoch = time.time() - loop.time()  # each due time on the wall clock the database stamps with
            cpu_before = time.process_time()

            async def one(i: int, body: bytes) -> None:
                due = start + i / rate
                await asyncio.sleep(max(0.0, due - loop.time()))
                sent = loop.time()
                try:
                    status = await _post(session, url, body, secret, signatures[i])
                except Exception:  # noqa: BLE001 - a failed request is counted, not raised
                    status = 0
                done = loop.time()
                results.append((done - due, done - sent, status, i, due + to_epoch))
                if progress and len(results) % max(1, int(rate)) == 0:
                    progress(f"{len(results)}/{len(bodies)} deliveries answered")

            await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
            wall = loop.time() - start
            cpu = time.process_time() - cpu_before
        late = sorted(r[0] - r[1] for r in results)
        return {"results": results, "wall": wall, "client_cpu_seconds": cpu,
                "client_late_p99_ms": 1000 * late[int(0.99 * (len(late) - 1))] if late else 0.0}

    with without_collector_pauses():
        return asyncio.run(go())


def burst(url: str, items: list[tuple[str, bytes]], secret: str, concurrency: int = 32,
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """POST every (key, body) as fast as `concurrency` allows; returns {key: (send epoch, status)}."""
    import aiohttp

    async def go() -> dict[str, tuple[float, int]]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        sent: dict[str, tuple[float, int]] = {}
        gate = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def one(key: str, body: bytes) -> None:
                async with gate:
                    at = time.time()
                    try:
                        status = await _post(session, url, body, secret)
                    except Exception:  # noqa: BLE001
                        status = 0
                    sent[key] = (at, status)
                    if progress and len(sent) % 100 == 0:
                        progress(f"{len(sent)}/{len(items)} deliveries sent")

            await asyncio.gather(*(one(k, b) for k, b in items))
        return sent

    return asyncio.run(go())
