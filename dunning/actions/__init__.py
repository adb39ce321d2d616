"""Staff and customer decisions and the outbox consumers: support, incidents, retries, alerts, unknown-
payment owners, notifications, provider cancellation, entitlement changes."""
