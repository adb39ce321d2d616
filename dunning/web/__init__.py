"""The HTTP edge: the Stripe webhook view, hostile-input guards, problem documents."""
