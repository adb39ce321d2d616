"""The verification package: the Stripe-compatible simulator (fake_stripe), the seeded simulation
(simulation), the localstripe runner and the demo data set, with the `simulate` and `load_demo`
commands. Test doubles live with the tests; no product module imports this package."""
