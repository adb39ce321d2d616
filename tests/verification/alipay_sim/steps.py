"""What each schedule step does (mixed into ``AlipaySimulation``). A step that finds nothing to act
on (no waiting trade for that agreement, an agreement already revoked) does nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from tests.verification.fake_alipay.notify import Notification
from tests.verification.fake_alipay.state import TRADE_SUCCESS, yuan

HOLD = 0.5  # seconds the simulator holds a timed-out connection (the product gives up after 0.3)


class StepHandlers:
    sim: Any
    users: list[str]
    agreement_nos: list[str]

    def step_advance_minutes(self, seconds: int, deliver: bool) -> None:
        self.advance(seconds, deliver)

    step_advance_hours = step_advance_days = step_advance_minutes

    def step_balance(self, agreement: int, fen: int) -> None:
        self.sim.set_balance(self.users[agreement], fen)

    def step_revoke(self, agreement: int) -> None:
        if self.sim.agreement(self.agreement_nos[agreement])["status"] == "NORMAL":
            self.sim.revoke_agreement(self.agreement_nos[agreement])
            self.bump("revoked")

    def step_gateway_fault(self, fault: str, method: str, apply: bool, count: int) -> None:
        self.sim.faults.arm(fault, method, count=count, apply=apply, hold_seconds=HOLD)

    def _trades_of(self, agreement: int, status: str) -> list[dict[str, Any]]:
        return [t for t in self.sim.trade_list() if t["agreement_no"] == self.agreement_nos[agreement]
                and t["trade_status"] == status]

    def step_settle_trade(self, agreement: int, success: bool) -> None:
        waiting = self._trades_of(agreement, "WAIT_BUYER_PAY")
        if waiting:
            self.sim.settle_trade(waiting[0]["app_id"], waiting[0]["out_trade_no"], success=success)
            self.bump("trade_settled_" + ("paid" if success else "closed"))

    def step_finish_trade(self, agreement: int) -> None:
        paid = self._trades_of(agreement, TRADE_SUCCESS)
        if paid:
            self.sim.finish_trade(paid[0]["app_id"], paid[0]["out_trade_no"])
            self.bump("trade_finished")

    def step_notify_fault(self, fault: str, count: int, seconds: int = 0) -> None:
        if fault == "duplicate":
            self.sim.faults.duplicate_notifications(count)
        elif fault == "drop":
            self.sim.faults.drop_notifications(count)
        else:
            self.sim.faults.delay_notifications(seconds, count)

    def step_relay(self) -> None:
        self.relay()

    def step_outage(self, seconds: int) -> None:
        """The scheduler is down: no job runs until the outage ends (notifications still arrive)."""
        self.outage_until = self.now() + timedelta(seconds=seconds)

    def step_catch_up(self, back: int) -> None:
        """A worker that was held up runs every job once with a `now` in the past."""
        if not self.in_outage():
            self.run_jobs(at=self.now() - timedelta(seconds=back))

    def step_hostile(self, variant: str) -> None:
        """A forged notification about one of the run's trades: a broken signature, a correctly
        signed one with the wrong amount, or another merchant's. Refused, and access unchanged."""
        trades = self.sim.trade_list()
        if not trades:
            return
        trade = trades[self.step_index % len(trades)]
        with self.sim.lock:
            params = self.sim._trade_params(self.sim.trades[(trade["app_id"], trade["out_trade_no"])])
        params |= {"trade_status": TRADE_SUCCESS, "gmt_payment": params["gmt_create"]}
        amount = params["total_amount"]
        if variant == "wrong_amount":
            amount = yuan(int(trade["amount_fen"]) // 10)
        elif variant == "foreign_app":
            params |= {"app_id": "2021000000009999", "auth_app_id": "2021000000009999"}
        params |= {"total_amount": amount, "receipt_amount": amount, "buyer_pay_amount": amount}
        note = Notification(self.sim.ids.notify_id(self.sim.now()), "trade_status_sync", "", params,
                            self.sim.now(), self.sim.now())
        form = self.sim.signed_form(note, self.sim.now())
        if variant == "bad_signature":
            form["total_amount"] = form["receipt_amount"] = form["buyer_pay_amount"] = yuan(
                int(trade["amount_fen"]) * 2)
        status, answer = self.post(urlencode(form).encode("utf-8"))
        self.bump(f"hostile_{variant}")
        if status == 200:
            self.auditor.report("FORGED_NOTIFICATION_ACCEPTED", f"{variant} notification for "
                                                                f"{trade['out_trade_no']} answered {status} {answer!r}")
