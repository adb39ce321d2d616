"""The subscription as a contract: cancel (now or at the period end), pause and resume collection,
change the price, end a trial, and end the current period.

What Stripe does, and so what this does:

- Cancelling at once sets ``status=canceled``, ``canceled_at`` and ``ended_at`` and emits
  ``customer.subscription.deleted``. Stripe then stops automatic collection of the customer's
  finalized invoices: each open one gets ``auto_advance=false`` and ``next_payment_attempt=null``
  (``invoice.updated``) and stays open — the debt stays a debt, payable by API or by the customer.
- ``cancel_at_period_end`` sets ``cancel_at`` to the period end and ``canceled_at`` to the time of
  the request (the subscription stays as it is until then); at the period end it is canceled
  (``ended_at`` = the period end) instead of renewed.
- ``pause_collection`` (``keep_as_draft`` | ``mark_uncollectible`` | ``void``, optional
  ``resumes_at``) leaves the status alone; invoices created while it lasts are never attempted
  (kept as drafts with ``auto_advance=false``, marked uncollectible, or voided). Invoices issued
  before the pause keep their retries, as on Stripe.
- ``status=paused`` only comes from a trial that ended without a payment method; resuming it starts
  a new period at once with an invoice (``customer.subscription.resumed``).
- Any change emits ``customer.subscription.updated`` with ``previous_attributes``; entering and
  leaving ``status=paused`` also emit ``customer.subscription.paused`` / ``.resumed``.
- A price change moves the subscription item to the new price without proration; the next
  renewal invoice carries it, earlier invoices keep the price they were issued with. A new
  interval applies from the next period on (Stripe would reset the billing cycle at once).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.verification.fake_stripe.billing import add_interval, operation, to_unix
from tests.verification.fake_stripe.errors import InvalidTransition, SimError, not_found

PAUSE_BEHAVIORS = ("keep_as_draft", "mark_uncollectible", "void")
TRIAL_OUTCOMES = ("active", "paused", "canceled")
ENDED_STATUSES = ("canceled", "incomplete_expired")
CANCELED_IS_IMMUTABLE = "A canceled subscription can only update its cancellation_details and metadata."


class ContractMixin:
    """Needs from the host: lock, store, renderer, now_ts(), _emit(), _get(), _renew(), _settle_free()."""

    # ---- public operations
    @operation
    def cancel_subscription(self, subscription_id: str, *, at_period_end: bool = False) -> dict[str, Any]:
        """At once (``customer.subscription.deleted``; open invoices stop being retried) or, with
        ``at_period_end``, at the end of the current period (``customer.subscription.updated`` now).
        Cancelling one already canceled is refused as Stripe does: 404 "No such subscription"."""
        sub = self._get(subscription_id, "subscription")
        if sub["status"] in ENDED_STATUSES:
            raise not_found("subscription", subscription_id)
        if at_period_end:
            previous = self._schedule_cancel(sub, True)
            self._updated(sub, previous)
        else:
            self._cancel_now(sub, ended_at=self.now_ts())
        return copy.deepcopy(sub)

    @operation
    def pause_subscription(self, subscription_id: str, *, resumes_at: Any = None,
                           behavior: str = "void") -> dict[str, Any]:
        """Pause collection (``pause_collection``): the status stays; new invoices are not attempted."""
        sub = self._get(subscription_id, "subscription")
        previous = self._set_pause(sub, {"behavior": behavior, "resumes_at": to_unix(resumes_at)})
        self._updated(sub, previous)
        return copy.deepcopy(sub)

    @operation
    def resume_subscription(self, subscription_id: str) -> dict[str, Any]:
        """Clear ``pause_collection`` (``customer.subscription.updated``), or resume a ``status=paused``
        subscription: a new period starts now with its invoice (``customer.subscription.updated`` and
        ``customer.subscription.resumed``, then the invoice's events; the invoice is not attempted here)."""
        sub = self._get(subscription_id, "subscription")
        if sub["status"] == "paused":
            self._resume_paused(sub)
        elif sub.get("pause_collection"):
            self._updated(sub, self._set_pause(sub, None))
        else:
            self._check_mutable(sub)
            raise InvalidTransition(f"Subscription {subscription_id} is not paused (status {sub['status']}, "
                                    "no pause_collection).")
        return copy.deepcopy(sub)

    @operation
    def change_price(self, subscription_id: str, price_id: str, *, interval: str | None = None,
                     amount: int | None = None) -> dict[str, Any]:
        """Move the subscription item to ``price_id`` (``customer.subscription.updated``). A price the
        simulator does not know yet is made from ``amount`` and ``interval`` (default: the current
        price's); a known price keeps its own amount and interval."""
        sub = self._get(subscription_id, "subscription")
        previous = self._set_price(sub, price_id, interval=interval, amount=amount)
        self._updated(sub, previous)
        return copy.deepcopy(sub)

    @operation
    def end_trial(self, subscription_id: str, *, outcome: str = "active") -> str | None:
        """End a trial now. ``active``: a new period starts with its invoice (returned; attempted
        later, like any renewal); ``paused``: the trial ended without a payment method and
        ``missing_payment_method=pause`` (status ``paused``, no invoice); ``canceled``: likewise with
        ``missing_payment_method=cancel`` (``customer.subscription.deleted``)."""
        sub = self._get(subscription_id, "subscription")
        if outcome not in TRIAL_OUTCOMES:
            raise ValueError(f"outcome must be one of {TRIAL_OUTCOMES}, not {outcome!r}")
        if sub["status"] != "trialing":
            raise InvalidTransition(f"Subscription {subscription_id} is not trialing (status {sub['status']}).")
        trial_end = min(int(sub["trial_end"] or self.now_ts()), self.now_ts())
        return self._finish_trial(sub, trial_end, outcome)

    @operation
    def end_period(self, subscription_id: str) -> str | None:
        """The current period ends: a subscription set to cancel at the period end is canceled
        (``customer.subscription.deleted``; returns None); a trialing one starts paying; any other
        renews as ``create_renewal_invoice`` does. Returns the new invoice id."""
        sub = self._get(subscription_id, "subscription")
        status = sub["status"]
        if status in ENDED_STATUSES:
            raise InvalidTransition(f"Subscription {subscription_id} is {status}; it has no next period.")
        if status == "paused":
            raise InvalidTransition(f"Subscription {subscription_id} is paused; it does not renew until resumed.")
        if status == "incomplete":
            raise InvalidTransition(f"Subscription {subscription_id} is incomplete; its first invoice is unpaid.")
        if sub.get("cancel_at_period_end"):
            self._cancel_now(sub, ended_at=int(sub["current_period_end"]), requested=False)
            return None
        if status == "trialing":
            return self._finish_trial(sub, int(sub["current_period_end"]), "active")
        return self._renew(sub)["id"]

    # ---- building blocks (also used by the HTTP update, which emits one event per request)
    def _check_mutable(self, sub: dict[str, Any]) -> None:
        if sub["status"] in ENDED_STATUSES:
            raise InvalidTransition(CANCELED_IS_IMMUTABLE)

    def _updated(self, sub: dict[str, Any], previous: dict[str, Any]) -> None:
        """Store and emit ``customer.subscription.updated`` when something changed."""
        if previous:
            self.store.put(sub)
            self._emit("customer.subscription.updated", sub, previous=previous)

    def _schedule_cancel(self, sub: dict[str, Any], flag: bool) -> dict[str, Any]:
        self._check_mutable(sub)
        if bool(sub.get("cancel_at_period_end")) == flag:
            return {}
        previous = {"cancel_at_period_end": bool(sub.get("cancel_at_period_end")), "cancel_at": sub.get("cancel_at"),
                    "canceled_at": sub.get("canceled_at")}
        sub["cancel_at_period_end"] = flag
        sub["cancel_at"] = sub["current_period_end"] if flag else None
        sub["canceled_at"] = self.now_ts() if flag else None  # Stripe: the time of the request
        return previous

    def _set_pause(self, sub: dict[str, Any], pause: dict[str, Any] | None) -> dict[str, Any]:
        self._check_mutable(sub)
        if pause is not None and pause.get("behavior") not in PAUSE_BEHAVIORS:
            raise SimError(400, f"Invalid pause_collection[behavior]: must be one of {', '.join(PAUSE_BEHAVIORS)}",
                           param="pause_collection[behavior]")
        current = sub.get("pause_collection")
        if current == pause:
            return {}
        sub["pause_collection"] = dict(pause) if pause is not None else None
        return {"pause_collection": copy.deepcopy(current)}

    def _set_price(self, sub: dict[str, Any], price_id: str, *, interval: str | None = None,
                   amount: int | None = None) -> dict[str, Any]:
        self._check_mutable(sub)
        current = self.store.prices[sub["price"]]
        price = self.store.prices.get(price_id)
        if price is None:
            price = self.store.ensure_price(price_id, amount=current["unit_amount"] if amount is None else amount,
                                            currency=current["currency"],
                                            interval=interval or current["recurring"]["interval"])
        elif interval is not None and interval != price["recurring"]["interval"]:
            raise SimError(400, f"Price {price_id} recurs every {price['recurring']['interval']}, not {interval}.",
                           param="items[0][price]")
        if price_id == sub["price"]:
            return {}
        old = self.renderer.render(sub, self.webhook_api_version)
        sub["price"] = price_id
        sub["interval"] = price["recurring"]["interval"]
        return {"items": old["items"], "plan": old["plan"]}

    def _cancel_now(self, sub: dict[str, Any], *, ended_at: int, requested: bool = True) -> None:
        """``requested``: canceled by this request (``canceled_at`` = now); otherwise the period end
        carried out an earlier ``cancel_at_period_end``, whose request time ``canceled_at`` keeps."""
        sub["status"] = "canceled"
        if requested or not sub.get("canceled_at"):
            sub["canceled_at"] = self.now_ts()
        sub["ended_at"] = ended_at
        self.store.put(sub)
        self._emit("customer.subscription.deleted", sub)
        self._stop_collection(sub["customer"])

    def _stop_collection(self, customer_id: str) -> None:
        """Stripe stops automatic collection of the customer's finalized invoices when a subscription
        is canceled: no more retries, but the invoices stay open."""
        for inv in self.store.all_of("invoice"):
            if inv["customer"] != customer_id or inv["status"] != "open" or not inv["auto_advance"]:
                continue
            previous = {"auto_advance": True, "next_payment_attempt": inv["next_payment_attempt"]}
            inv.update(auto_advance=False, next_payment_attempt=None)
            self.store.put(inv)
            self._emit("invoice.updated", inv, previous=previous)

    def _finish_trial(self, sub: dict[str, Any], trial_end: int, outcome: str) -> str | None:
        previous: dict[str, Any] = {"status": sub["status"]}
        if sub.get("trial_end") != trial_end:
            previous["trial_end"] = sub.get("trial_end")
            sub["trial_end"] = trial_end
        if outcome == "canceled":
            sub["current_period_end"] = trial_end
            self._cancel_now(sub, ended_at=trial_end)
            return None
        if outcome == "paused":
            sub["status"] = "paused"
            self._updated(sub, previous)
            self._emit("customer.subscription.paused", sub, previous={"status": previous["status"]})
            return None
        previous.update(current_period_start=sub["current_period_start"], current_period_end=sub["current_period_end"])
        sub["status"] = "active"
        sub["billing_cycle_anchor"] = trial_end
        sub["current_period_start"], sub["current_period_end"] = trial_end, add_interval(trial_end, sub["interval"])
        self._updated(sub, previous)
        return self._renew(sub, start=trial_end)["id"]

    def _resume_paused(self, sub: dict[str, Any]) -> None:
        now = self.now_ts()
        previous = {"status": "paused", "current_period_start": sub["current_period_start"],
                    "current_period_end": sub["current_period_end"]}
        if sub.get("pause_collection"):
            previous["pause_collection"] = copy.deepcopy(sub["pause_collection"])
            sub["pause_collection"] = None
        sub["status"] = "active"
        sub["billing_cycle_anchor"] = now
        sub["current_period_start"], sub["current_period_end"] = now, add_interval(now, sub["interval"])
        self._updated(sub, previous)
        self._emit("customer.subscription.resumed", sub, previous={"status": "paused"})
        self._renew(sub, start=now)
