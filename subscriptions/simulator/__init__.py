"""A Stripe-compatible HTTP simulator for tests and the demo (SPEC §8–§9).

The real ``stripe`` SDK talks to it over HTTP on loopback. It keeps invoices in all five statuses,
subscriptions as contracts (trials, cancel now or at the period end, paused collection, price
changes; see ``contract``), honours idempotency keys, signs webhooks like Stripe, injects faults
on demand, and its ledger of successful charges is the monetary truth tests check against.
"""

from subscriptions.simulator.billing import HARD_DECLINES, AttemptResult
from subscriptions.simulator.errors import CardDeclined, InvalidTransition, SimError
from subscriptions.simulator.rendering import DEFAULT_API_VERSION, NEW_SHAPE_SINCE, is_legacy
from subscriptions.simulator.simulator import StripeSimulator
from subscriptions.simulator.webhooks import Delivery, signature_header

__all__ = [
    "DEFAULT_API_VERSION", "HARD_DECLINES", "NEW_SHAPE_SINCE", "AttemptResult", "CardDeclined", "Delivery",
    "InvalidTransition", "SimError", "StripeSimulator", "is_legacy", "signature_header",
]
