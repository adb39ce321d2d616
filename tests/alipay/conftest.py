"""The product against the Alipay-compatible simulator: the adapter's SDK talks to the simulator's
gateway over loopback with this session's keys, and the simulator's signed notifications (caught
by a loopback receiver) are posted, byte for byte, to the product's /webhooks/alipay/."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from dunning.policy.publishing import policy_publish
from subscriptions.models import AlipayAgreement, Subscription
from subscriptions.providers.alipay import billing
from tests.support.alipay import APP_ID, AlipaySimHandle

ALIPAY_POLICY = Path("dunning/policy/shipped/alipay-monthly.yaml")


@dataclass
class AlipayWorld:
    handle: AlipaySimHandle
    client: Client
    capture: object
    relayed: int = 0
    answers: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def sim(self):  # noqa: ANN201
        return self.handle.sim

    def post(self, body: bytes, content_type: str = "application/x-www-form-urlencoded; charset=utf-8"):  # noqa: ANN201
        with self.capture(execute=True):
            return self.client.post("/webhooks/alipay/", data=body, content_type=content_type)

    def relay(self) -> list[tuple[int, bytes]]:
        """Deliver what the simulator has due, and hand each delivery on to the product."""
        self.sim.deliver_due()
        received = self.handle.receiver.received[self.relayed:]
        self.relayed += len(received)
        answers = []
        for note in received:
            response = self.post(note.body)
            answers.append((response.status_code, response.content))
        self.answers.extend(answers)
        return answers

    def sign_up(self, *, balance_fen: int = 10_000, email: str = "li.wei@example.com",
                price_id: str = "alipay_monthly", now: datetime | None = None) -> Subscription:
        """A customer signs a deduction agreement: our terms first, then Alipay's agreement and its
        dut_user_sign notification, which imports the subscription."""
        terms = billing.agreement_begin(customer_email=email, price_id=price_id, app_id=APP_ID,
                                        plans=settings.ALIPAY_PLANS, now=now or datetime.now(UTC))
        user_id = self.sim.create_user(balance_fen)
        agreement_no = self.sim.sign_agreement(APP_ID, user_id, terms.external_agreement_no)
        assert self.relay()[-1] == (200, b"success")
        assert AlipayAgreement.objects.get(pk=terms.pk).agreement_no == agreement_no
        return Subscription.objects.get(provider="alipay", provider_subscription_id=agreement_no)


@pytest.fixture
def alipay_policy(db):
    return policy_publish(text=ALIPAY_POLICY.read_text(), now=datetime(2026, 1, 1, tzinfo=UTC))[0]


@pytest.fixture
def alipay(settings, alipay_sim, alipay_policy, shipped_policies, client, django_capture_on_commit_callbacks):
    settings.ALIPAY_APP_ID = APP_ID
    settings.ALIPAY_GATEWAY_URL = alipay_sim.gateway_url
    settings.ALIPAY_APP_PRIVATE_KEY = alipay_sim.keys.app_private_pem
    settings.ALIPAY_PUBLIC_KEY = alipay_sim.keys.alipay_public_pem
    settings.ALIPAY_NOTIFY_URL = alipay_sim.receiver.url
    settings.ALIPAY_TIMEOUT_SECONDS = 1.0
    return AlipayWorld(alipay_sim, client, django_capture_on_commit_callbacks)
