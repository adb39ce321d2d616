"""A Stripe-compatible HTTP simulator for tests and the demo (SPEC §8–§9).

The real ``stripe`` SDK talks to it over HTTP on loopback. It keeps invoices in all five statuses,
subscriptions as contracts (trials, cancel now or at the period end, paused collection, price
changes; see ``contract``), honours idempotency keys, signs webhooks like Stripe, injects faults
on demand, and its ledger of successful charges is the monetary truth tests check against.
"""

from tests.verification.fake_stripe.billing import HARD_DECLINES, AttemptResult
from tests.verification.fake_stripe.errors import CardDeclined, InvalidTransition, SimError
from tests.verification.fake_stripe.rendering import DEFAULT_API_VERSION, NEW_SHAPE_SINCE, is_legacy
from tests.verification.fake_stripe.simulator import StripeSimulator
from tests.verification.fake_stripe.webhooks import Delivery, signature_header

__all__ = [
    "DEFAULT_API_VERSION", "HARD_DECLINES", "NEW_SHAPE_SINCE", "AttemptResult", "CardDeclined", "Delivery",
    "InvalidTransition", "SimError", "StripeSimulator", "is_legacy", "signature_header",
]
