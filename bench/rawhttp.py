"""A minimal HTTP/1.1 client for the open-loop load generators: one connection per request
(`Connection: close`, as gunicorn's sync workers answer anyway), the request written in one piece,
the answer read to EOF, its status returned.

Why not aiohttp: the bench runs the load generator on the same two cores as the server it measures,
and aiohttp's client cost 1.1-1.3 ms of CPU per request on the 2026-12-04 machine (session,
connector, cookie jar, header multidicts, response object), a quarter of a core at 200/s taken
from the server under test. Writing prebuilt bytes and reading the answer cost 0.7 ms (most of it
the connection's set-up and the event loop), measured the same way.
"""

from __future__ import annotations

import asyncio


def request_bytes(method: str, host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()
              if name.lower() not in ("host", "content-length", "connection")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP/1.x answer; ValueError when it is not one."""
    head = answer.split(b"\r\n", 1)[0].split()
    if len(head) < 2 or not head[0].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP answer: {answer[:80]!r}")
    return int(head[1])


async def send(host: str, port: int, raw: bytes) -> tuple[int, bytes]:
    """Write `raw` on a new connection and read the answer to EOF: (status, the whole answer)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        answer = await reader.read()
    finally:
        writer.close()
    return status_of(answer), answer
