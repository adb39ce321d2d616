"""``python -m bench.agentpay_upstream PORT``: the upstream API of the gateway bench (aiohttp).

Any POST answers 200 with a small JSON body at once; ``GET /status/<ful_id>`` answers the
status-query contract with "succeeded". Fast on purpose: the bench measures what the gateway
adds over calling it directly.
"""

from __future__ import annotations

import sys

from aiohttp import web


async def call(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"result": "ok", "key": request.headers.get("Idempotency-Key", "")})


async def status(request: web.Request) -> web.Response:
    return web.json_response({"fulfillment_id": request.match_info["ful"], "status": "succeeded"})


def main() -> None:
    app = web.Application()
    app.router.add_get("/status/{ful}", status)
    app.router.add_post("/{tail:.*}", call)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
