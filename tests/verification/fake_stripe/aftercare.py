"""Money movements after a successful charge: refunds and disputes (chargebacks)."""

from __future__ import annotations

from typing import Any

from tests.verification.fake_stripe.billing import operation
from tests.verification.fake_stripe.errors import InvalidTransition, SimError, not_found


class AftercareMixin:
    @operation
    def refund(self, charge_or_pi_id: str, amount: int | None = None, *, reason: str | None = None) -> str:
        """Full (default) or partial refund of a successful charge; ``charge.refunded`` + ``refund.created``."""
        charge = self._succeeded_charge(charge_or_pi_id)
        remaining = charge["amount"] - charge["amount_refunded"]
        if remaining <= 0:
            raise InvalidTransition(f"Charge {charge['id']} has already been refunded.", code="charge_already_refunded")
        amount = remaining if amount is None else int(amount)
        if amount <= 0 or amount > remaining:
            raise SimError(400, f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})",
                           code="amount_too_large", param="amount")
        refund = {"id": self.store.new_id("refund"), "object": "refund", "amount": amount, "charge": charge["id"],
                  "currency": charge["currency"], "payment_intent": charge["payment_intent"], "reason": reason,
                  "created": self.now_ts()}
        self.store.put(refund)
        previous = {"amount_refunded": charge["amount_refunded"], "refunded": charge["refunded"]}
        charge["amount_refunded"] += amount
        charge["refunded"] = charge["amount_refunded"] >= charge["amount"]
        self.store.put(charge)
        entry = self.store.ledger_entry(charge["id"])
        if entry is not None:
            entry["refunded"] = charge["amount_refunded"]
        self._emit("charge.refunded", charge, previous=previous)
        self._emit("refund.created", refund)
        return refund["id"]

    @operation
    def open_dispute(self, charge_id: str, *, reason: str = "fraudulent", amount: int | None = None) -> str:
        """A chargeback: ``charge.dispute.created`` then ``charge.dispute.funds_withdrawn``."""
        charge = self._succeeded_charge(charge_id)
        if charge["disputed"]:
            raise InvalidTransition(f"Charge {charge['id']} is already disputed.", code="charge_disputed")
        dispute = {"id": self.store.new_id("dispute"), "object": "dispute",
                   "amount": charge["amount"] if amount is None else int(amount), "currency": charge["currency"],
                   "charge": charge["id"], "payment_intent": charge["payment_intent"], "reason": reason,
                   "status": "needs_response", "created": self.now_ts()}
        self._dispute_funds(dispute, -dispute["amount"], "dispute")  # the chargeback withdraws the disputed amount
        self.store.put(dispute)
        charge["disputed"] = True
        self.store.put(charge)
        self._ledger_dispute(charge["id"], dispute)
        self._emit("charge.dispute.created", dispute)
        self._emit("charge.dispute.funds_withdrawn", dispute)
        return dispute["id"]

    @operation
    def close_dispute(self, dispute_id: str, won: bool) -> dict[str, Any]:
        """``charge.dispute.closed`` (status won/lost), plus ``charge.dispute.funds_reinstated`` when won."""
        dispute = self.store.get(dispute_id, "dispute")
        if dispute is None:
            raise not_found("dispute", dispute_id)
        if dispute["status"] in ("won", "lost"):
            raise InvalidTransition(f"Dispute {dispute_id} is already closed ({dispute['status']}).",
                                    code="dispute_already_closed")
        previous = {"status": dispute["status"]}
        dispute["status"] = "won" if won else "lost"
        if won:  # a won dispute gives the withdrawn funds back
            self._dispute_funds(dispute, dispute["amount"], "dispute_reversal")
        self.store.put(dispute)
        self._ledger_dispute(dispute["charge"], dispute)
        self._emit("charge.dispute.closed", dispute, previous=previous)
        if won:
            self._emit("charge.dispute.funds_reinstated", dispute)
        return dict(dispute)

    def _succeeded_charge(self, charge_or_pi_id: str) -> dict[str, Any]:
        obj = self.store.get(charge_or_pi_id)
        if obj is not None and obj["object"] == "payment_intent":
            obj = self.store.get(obj["latest_charge"] or "", "charge")
        if obj is None or obj["object"] != "charge":
            raise not_found("charge", charge_or_pi_id, "charge")
        if obj["status"] != "succeeded":
            raise InvalidTransition(f"Charge {obj['id']} did not succeed; there is nothing to refund or dispute.",
                                    code="charge_not_succeeded")
        return obj

    def _ledger_dispute(self, charge_id: str, dispute: dict[str, Any]) -> None:
        entry = self.store.ledger_entry(charge_id)
        if entry is not None:
            entry["dispute"] = dispute["id"]
            entry["dispute_status"] = dispute["status"]
            movements = dispute.get("balance_transactions") or []
            entry["dispute_withdrawn"] = -sum(t["amount"] for t in movements if t["amount"] < 0)
            entry["dispute_reinstated"] = sum(t["amount"] for t in movements if t["amount"] > 0)

    def _dispute_funds(self, dispute: dict[str, Any], amount: int, category: str) -> None:
        """One balance transaction of the dispute, as Stripe lists them on the dispute object:
        negative when funds are withdrawn, positive when they are reinstated (the fee stays apart)."""
        fee = 1500 if amount < 0 else 0
        dispute.setdefault("balance_transactions", []).append({
            "id": self.store.new_id("txn"), "object": "balance_transaction", "amount": int(amount),
            "currency": dispute["currency"], "created": self.now_ts(), "fee": fee, "net": int(amount) - fee,
            "reporting_category": category, "status": "available", "type": "adjustment",
            "description": f"Chargeback {'withdrawal' if amount < 0 else 'reversal'} for {dispute['charge']}",
            "source": dispute["id"],
        })
