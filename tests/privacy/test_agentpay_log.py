"""AgentPay's request log keeps the body desensitised; its digest and size are of the raw bytes."""

from __future__ import annotations

import hashlib
import json

from agentpay.models import GatewayRequest


def test_a_logged_gateway_request_body_is_masked_with_the_raw_digest(db, client):
    body = json.dumps({"prompt": "summarise", "customer_email": "jane.doe@example.com",
                       "billing_details": {"name": "Jane Doe", "phone": "+1 415 555 0100"}}).encode()
    response = client.post("/agentpay/v1/routes/summarise/run", data=body, content_type="application/json")
    assert response.status_code in (401, 403), response.content  # no API key: refused, still logged
    logged = GatewayRequest.objects.get()
    stored = bytes(logged.body)
    assert b"jane.doe@example.com" not in stored and b"Jane Doe" not in stored and b"555 0100" not in stored
    assert json.loads(stored)["prompt"] == "summarise"
    assert logged.body_digest == hashlib.sha256(body).hexdigest() and logged.body_size == len(body)
    assert logged.body_truncated is False
