"""`unsaved_row(Model, **values)` builds the instance `Model(**values)` builds, without Django's per-field
walk: the same attributes, the same defaults (a called default called again), the same cached
related objects, the same state; and Django's own __init__ where the short way could differ."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Model
from django.db.models.signals import post_init

from agentpay.bridge import trusted_now, unsaved_row
from agentpay.models import (
    Fulfillment,
    GatewayRequest,
    IntentReceipt,
    OutboxMessage,
    PaymentIntent,
    PricedRoute,
    Settlement,
    Transfer,
)
from agentpay.services.tenants import tenant_create

pytestmark = pytest.mark.django_db


def _built(obj: Model, generated: tuple[str, ...] = ()) -> dict[str, Any]:
    """The instance as a value: its attributes (a called default's value by its type only, as two
    calls differ), its state and the related objects it caches."""
    attributes = {k: (type(v) if k in generated else v) for k, v in obj.__dict__.items() if k != "_state"}
    return {"attributes": attributes, "adding": obj._state.adding, "db": obj._state.db,
            "cached": dict(obj._state.fields_cache)}


@pytest.fixture
def world() -> dict[str, Any]:
    tenant = tenant_create(name="unsaved rows")
    route = PricedRoute.objects.create(slug="rows", name="rows", upstream_base_url="http://127.0.0.1:9",
                                       upstream_path="/x", method="POST", price_minor=3, currency="usd",
                                       rails_allowed=["wallet"])
    now = trusted_now()
    saved = PaymentIntent.objects.create(tenant=tenant, idempotency_key="k-saved", request_digest="d", rail="wallet",
                                         route=route, amount=3, currency="usd", created_at=now, state_changed_at=now,
                                         first_request_id=uuid.uuid4())
    user = get_user_model().objects.create_user("lead", password="x" * 12)
    return {"tenant": tenant, "route": route, "now": now, "saved": saved, "user": user}


def _intent_values(w: dict[str, Any]) -> dict[str, Any]:
    now = w["now"]
    return dict(tenant=w["tenant"], idempotency_key="k-1", request_digest="d" * 64, rail="wallet", route=w["route"],
                amount=3, currency="usd", created_at=now, state_changed_at=now, first_request_id=uuid.uuid4(),
                processing_until=now + timedelta(seconds=30), forward_path="run", forward_query="",
                forward_content_type="application/json", forward_body=b'{"q": 1}')


def _cases(w: dict[str, Any]) -> list[tuple[type[Model], dict[str, Any], tuple[str, ...]]]:
    """(model, values, attnames with a called default) in the shapes the gateway's services build."""
    now, saved = w["now"], w["saved"]
    unsaved = PaymentIntent(**_intent_values(w))
    receipt = dict(line="fulfillment", event="upstream_2xx", accepted=True, from_state="in_progress",
                   to_state="succeeded", generation=2, data={"status": 200}, cause_kind="request", actor="tenant:t",
                   request_id=uuid.uuid4(), reason="", ticket="", trusted_time=now)
    return [
        (PaymentIntent, _intent_values(w), ("intent_id",)),
        (Settlement, dict(intent=unsaved, rail="wallet", created_at=now, state_changed_at=now), ("settlement_id",)),
        (Fulfillment, dict(intent=saved, state_changed_at=now), ("fulfillment_id",)),
        (IntentReceipt, dict(intent=unsaved, actor_user=None, **receipt), ()),
        (IntentReceipt, dict(intent=saved, actor_user=w["user"], **receipt), ()),
        (IntentReceipt, dict(intent_id=saved.pk, **receipt), ()),  # by the id: nothing cached
        (IntentReceipt, dict(intent=saved, line="intent", event="opened", accepted=True), ()),  # `data` defaulted
        (OutboxMessage, dict(topic="agentpay.intent.changed", dedupe_key="pi_x:1", intent=saved, created_at=now,
                             payload={"generation": 1}), ()),
        (Transfer, dict(transfer_id="hld_1", kind="pending", debit_account_id=7, credit_account_id=None, amount=3,
                        currency="usd", intent=unsaved, actor="tenant:t", created_at=now, reason="hold"), ()),
        (Transfer, dict(transfer_id="trf_1", kind="posted", debit_account_id=7, credit_account_id=8, amount=3,
                        currency="usd", pending=Transfer(transfer_id="hld_2", intent=saved), intent_id=saved.pk,
                        actor="tenant:t", created_at=now, reason="capture", ticket=""), ()),
        (GatewayRequest, dict(request_id=uuid.uuid4(), received_at=now, method="POST", path="/agentpay/v1/x",
                              query="", headers={"content-type": "application/json"}, body=b"{}", body_size=2,
                              body_digest="0" * 64, body_truncated=False, idempotency_key="k"), ()),
        (GatewayRequest, dict(request_id=uuid.uuid4(), received_at=now), ("headers",)),  # `headers` defaulted
    ]


def test_it_builds_what_djangos_init_builds(world: dict[str, Any]) -> None:
    for model, values, generated in _cases(world):
        ours, djangos = unsaved_row(model, **values), model(**values)
        assert type(ours) is model
        assert _built(ours, generated) == _built(djangos, generated), model.__name__


def test_a_called_default_is_called_for_each_row(world: dict[str, Any]) -> None:
    first, second = (unsaved_row(PaymentIntent, **_intent_values(world)) for _ in range(2))
    assert first.intent_id.startswith("pi_") and first.intent_id != second.intent_id
    one, other = (unsaved_row(IntentReceipt, intent=world["saved"], line="intent", event="opened") for _ in range(2))
    assert one.data == {} and one.data is not other.data  # a fresh dict each, never one shared


def test_the_row_saves_as_djangos_does(world: dict[str, Any]) -> None:
    receipt = unsaved_row(IntentReceipt, intent=world["saved"], line="intent", event="opened", accepted=True,
                          from_state="", to_state="authorized", generation=1, trusted_time=world["now"])
    receipt.save(force_insert=True)
    stored = IntentReceipt.objects.get(pk=receipt.pk)
    assert (stored.intent_id, stored.event, stored.data, stored.to_state) == (world["saved"].pk, "opened", {},
                                                                                "authorized")


def test_a_property_or_an_unknown_name_takes_djangos_init(world: dict[str, Any]) -> None:
    by_pk = unsaved_row(Transfer, pk=41, transfer_id="trf_1")
    assert (by_pk.pk, by_pk.id, by_pk.transfer_id) == (41, 41, "trf_1")
    with pytest.raises(TypeError, match="unexpected keyword"):
        unsaved_row(Transfer, no_such_field=1)


def test_a_model_with_an_init_receiver_takes_djangos_init(world: dict[str, Any]) -> None:
    seen: list[Model] = []

    def receiver(sender: type[Model], instance: Model, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Fulfillment)
    try:
        row = unsaved_row(Fulfillment, intent=world["saved"], state_changed_at=world["now"])
    finally:
        post_init.disconnect(receiver, sender=Fulfillment)
    assert seen == [row]
