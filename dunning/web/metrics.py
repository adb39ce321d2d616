"""`GET /metrics`: the Prometheus endpoint (issue 19 item 2; figures in dunning/web/metrics_collector.py).

Access: with METRICS_TOKEN set, only `Authorization: Bearer <token>` is answered (401 otherwise);
without it only loopback clients are (403 otherwise), so a fresh install does not publish its
figures. Behind a reverse proxy on the same host every client looks like loopback: set the token.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_http_methods
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dunning.web.metrics_collector import DunningCollector

REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(DunningCollector())


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _refusal(request: HttpRequest) -> HttpResponse | None:
    token = str(getattr(settings, "METRICS_TOKEN", "") or "")
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            response = HttpResponse("metrics need Authorization: Bearer <METRICS_TOKEN>\n", status=401,
                                    content_type="text/plain; charset=utf-8")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return None
    if not _is_loopback(request.META.get("REMOTE_ADDR", "")):
        return HttpResponse("metrics are served to loopback only; set METRICS_TOKEN to scrape from elsewhere\n",
                            status=403, content_type="text/plain; charset=utf-8")
    return None


@require_http_methods(["GET", "HEAD"])
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _refusal(request)
    if refused is not None:
        return refused
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(REGISTRY), content_type=content_type)
