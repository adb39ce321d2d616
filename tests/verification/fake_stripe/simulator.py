"""``StripeSimulator``; its state and behaviour live in `core` (moving, see the next commit)."""

from tests.verification.fake_stripe.core import StripeSimulator

__all__ = ["StripeSimulator"]
