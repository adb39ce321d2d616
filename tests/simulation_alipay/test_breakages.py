"""The auditor can fail: short schedules run against a deliberately broken adapter, and the
auditor names the rule the breakage violates."""

from __future__ import annotations

from unittest import mock

import pytest

from subscriptions.providers.alipay import adapter
from subscriptions.providers.alipay.records import AlipayTrade, TradeStatus
from subscriptions.providers.base import ProviderDeclined, ProviderIndeterminate
from tests.verification.alipay_sim import AlipaySimulation, Schedule, Step
from tests.verification.alipay_sim.schedule import PAY, Agreement


def _run(steps: list[Step], *patches) -> list[str]:  # noqa: ANN002
    schedule = Schedule(seed=0, agreements=[Agreement(balance_fen=20_000, period_ends_in=2 * 3600)], steps=steps)
    result = AlipaySimulation(schedule, gates=False, patches=patches).run()
    print("\n".join(map(str, result.violations)))
    return [v.code for v in result.violations]


@pytest.mark.django_db
def test_a_timeout_read_as_a_refusal_and_charged_again_is_a_blind_retry():
    original = adapter.AlipayProvider.pay_invoice

    def broken(provider, invoice_id, *, idempotency_key):  # noqa: ANN001, ANN202
        try:
            return original(provider, invoice_id, idempotency_key=idempotency_key)
        except ProviderIndeterminate:  # the breakage: no answer taken as "balance not enough"
            trade = AlipayTrade.objects.get(idempotency_key=idempotency_key)
            AlipayTrade.objects.filter(pk=trade.pk).update(status=TradeStatus.FAILED,
                                                           sub_code="ACQ.BUYER_BALANCE_NOT_ENOUGH")
            raise ProviderDeclined("broken", decline_code="ACQ.BUYER_BALANCE_NOT_ENOUGH",
                                   payment_ref=trade.out_trade_no) from None

    codes = _run([Step("gateway_fault", {"fault": "timeout", "method": PAY, "apply": True, "count": 1}),
                  Step("advance_hours", {"seconds": 3 * 3600, "deliver": False}),
                  Step("advance_hours", {"seconds": 7 * 3600, "deliver": False})],
                 mock.patch.object(adapter.AlipayProvider, "pay_invoice", broken))
    assert codes and codes[0] == "BLIND_RETRY", codes
    assert "PAID_ORDER_CHARGED_AGAIN" in codes and "DUPLICATE_CHARGE" in codes


@pytest.mark.django_db
def test_a_deduction_still_processing_read_as_paid_is_a_recovery_without_money():
    original = adapter._as_invoice

    def broken(order, trades, *, account):  # noqa: ANN001, ANN202
        for trade in trades:  # the breakage: Alipay's WAIT_BUYER_PAY read as paid (in memory only)
            if trade.status == TradeStatus.WAIT_BUYER_PAY:
                trade.status = TradeStatus.TRADE_SUCCESS
        return original(order, trades, account=account)

    codes = _run([Step("gateway_fault", {"fault": "in_progress", "method": PAY, "apply": False, "count": 1}),
                  Step("advance_hours", {"seconds": 3 * 3600, "deliver": True})],
                 mock.patch.object(adapter, "_as_invoice", broken))
    assert "RECOVERED_WITHOUT_MONEY" in codes, codes
