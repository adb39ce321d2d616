"""``python -m bench.agentpay_upstream PORT``: the upstream API of the gateway bench.

Any POST answers 200 with a small JSON body at once; ``GET /status/<ful_id>`` answers the
status-query contract with "succeeded". Every answer closes its connection (the gateway opens one
per call).

It stands for a remote API, so it is fast and light on purpose: the bench measures what the gateway
adds over calling it directly, and this process shares the machine's two cores with the gateway
it is measured through. An asyncio protocol that reads the request head and Content-Length body
and writes prebuilt bytes costs a fraction of a web framework's CPU a request (aiohttp's server
took 0.33-0.44 ms of CPU a call on 2026-12-04, taken from the gateway's workers at 200/s).
tests/bench/test_agentpay_upstream.py drives it over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import sys

MAX_HEAD = 64 * 1024


def answer(status: int, payload: dict[str, str]) -> bytes:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


def respond(head: bytes) -> bytes:
    """The answer to a request whose head (request line and headers, without the blank line) is
    `head`; the body does not change it."""
    request_line, _, header_block = head.partition(b"\r\n")
    parts = request_line.split()
    if len(parts) != 3:
        return answer(400, {"error": "bad request line"})
    method, target = parts[0], parts[1].decode("latin-1")
    if method == b"POST":
        return answer(200, {"result": "ok", "key": _header(header_block, b"idempotency-key")})
    if method == b"GET" and target.startswith("/status/") and len(target) > len("/status/"):
        return answer(200, {"fulfillment_id": target[len("/status/"):], "status": "succeeded"})
    if method == b"GET":
        return answer(404, {"error": "not found"})
    return answer(405, {"error": "method not allowed"})


def _header(block: bytes, name: bytes) -> str:
    for line in block.split(b"\r\n"):
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


def _content_length(head: bytes) -> int:
    value = _header(head.partition(b"\r\n")[2], b"content-length")
    return int(value) if value.isdigit() else 0


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""
        self.head: bytes | None = None
        self.missing = 0

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._finish(answer(400, {"error": "head too large"}))
                return
            self.head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            self.missing = _content_length(self.head)
        if len(self.buffer) >= self.missing:
            self._finish(respond(self.head))

    def _finish(self, raw: bytes) -> None:
        self.transport.write(raw)
        self.transport.close()


async def serve(port: int, host: str = "127.0.0.1") -> asyncio.base_events.Server:
    return await asyncio.get_running_loop().create_server(Upstream, host, port, backlog=1024)


def main() -> None:
    async def run() -> None:
        server = await serve(int(sys.argv[1]))
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
