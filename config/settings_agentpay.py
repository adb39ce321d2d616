"""AgentPay settings (seed 004, SPEC §16). Imported at the end of config/settings.py."""

import os

# An unknown fulfillment is resolved only by the upstream's status query; past this deadline the
# intent goes to needs_review and a billing lead owns it (within AGENTPAY_REVIEW_OWNER_SECONDS).
AGENTPAY_RECOVERY_DEADLINE_SECONDS = int(os.environ.get("AGENTPAY_RECOVERY_DEADLINE_SECONDS", "900"))
AGENTPAY_REVIEW_OWNER_SECONDS = int(os.environ.get("AGENTPAY_REVIEW_OWNER_SECONDS", "3600"))
AGENTPAY_REVIEW_OWNER_GROUPS = ("Billing leads",)
# seed §4.1: an x402 challenge not answered within this many seconds expires.
AGENTPAY_CHALLENGE_TTL_SECONDS = int(os.environ.get("AGENTPAY_CHALLENGE_TTL_SECONDS", "300"))
# A hold whose call was never dispatched (the agent's request died and it never retried) is
# released after this many seconds (hold_expired; wallet-ledger-spec §5.5): the seed's TTL.
AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS = int(os.environ.get("AGENTPAY_UNDISPATCHED_HOLD_TTL_SECONDS",
                                                            str(AGENTPAY_CHALLENGE_TTL_SECONDS)))
# wallet-ledger-spec §3.1: each system account (revenue, top-up clearing, staff credit) of a
# currency is split into this many rows; a wallet's transfers use shard wallet id mod N.
AGENTPAY_SYSTEM_ACCOUNT_SHARDS = int(os.environ.get("AGENTPAY_SYSTEM_ACCOUNT_SHARDS", "16"))
# A request driving an intent holds it this long beyond the route's timeouts (then 409 stops).
AGENTPAY_PROCESSING_LEASE_MARGIN_SECONDS = int(os.environ.get("AGENTPAY_PROCESSING_LEASE_MARGIN_SECONDS", "30"))
# Bodies kept in the request log are cut here; larger forwarded bodies are refused (413).
AGENTPAY_MAX_BODY_BYTES = int(os.environ.get("AGENTPAY_MAX_BODY_BYTES", str(1024 * 1024)))
AGENTPAY_LOGGED_BODY_BYTES = int(os.environ.get("AGENTPAY_LOGGED_BODY_BYTES", str(64 * 1024)))
AGENTPAY_STATUS_QUERY_TIMEOUT_SECONDS = float(os.environ.get("AGENTPAY_STATUS_QUERY_TIMEOUT_SECONDS", "5"))
# Every tenant gets a wallet in this currency when it is set up (services.tenants.tenant_create).
AGENTPAY_DEFAULT_CURRENCY = os.environ.get("AGENTPAY_DEFAULT_CURRENCY", "usd").lower()
# Tenant callbacks (services/webhooks.py): the signing secrets are derived from this key (default:
# SECRET_KEY) and each endpoint's salt; changing it invalidates every tenant's secret.
AGENTPAY_WEBHOOK_SIGNING_KEY = os.environ.get("AGENTPAY_WEBHOOK_SIGNING_KEY", "")
# A tenant's callback URL must resolve to public addresses (no loopback, private ranges or the
# cloud metadata address): checked when it is set and again on every connection. Only a
# deployment whose tenants live on its own network (and the tests' loopback receiver) opts out.
AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = os.environ.get("AGENTPAY_WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "") == "1"
AGENTPAY_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("AGENTPAY_WEBHOOK_TIMEOUT_SECONDS", "5"))

# --- x402 (issue 18): the on-chain rail at the gateway ---
# How far past the challenge's expiry a signed authorization's validBefore may reach (agentpay/x402/verify.py).
AGENTPAY_X402_VALID_BEFORE_SLACK_SECONDS = int(os.environ.get("AGENTPAY_X402_VALID_BEFORE_SLACK_SECONDS", "300"))

# --- chain (issue 18): the on-chain rail's signing keys -----------------------------------------
# A JSON object address → private key (the submitter, pay_to for refunds), read from the env var of
# the same name; agentpay.chain.keys parses it (a dict here is fine too: the test fixture sets one).
AGENTPAY_CHAIN_KEYS = os.environ.get("AGENTPAY_CHAIN_KEYS", "{}")

# --- settle (issue 18): on-chain settlement, fulfillment after confirmation, refunds ---
# How long a gateway request waits for its settlement to be decided before answering 202 (the
# agent replays the same Idempotency-Key to resume), and how often it asks the chain meanwhile.
AGENTPAY_ONCHAIN_WAIT_SECONDS = float(os.environ.get("AGENTPAY_ONCHAIN_WAIT_SECONDS", "10"))
AGENTPAY_ONCHAIN_POLL_SECONDS = float(os.environ.get("AGENTPAY_ONCHAIN_POLL_SECONDS", "0.25"))
# Gas for our own transactions (transferWithAuthorization, a refund's transfer): fixed, so signing
# needs no estimate from the node (an estimate of a failing call would refuse to sign at all).
AGENTPAY_CHAIN_GAS_LIMIT = int(os.environ.get("AGENTPAY_CHAIN_GAS_LIMIT", "200000"))
# The reconcile job asks about an undecided transaction again after 1, 2, 4 … seconds, at most this.
AGENTPAY_CHAIN_REQUERY_MAX_SECONDS = int(os.environ.get("AGENTPAY_CHAIN_REQUERY_MAX_SECONDS", "60"))
# How many undecided transactions one reconcile run takes, and how many it asks about at once.
AGENTPAY_CHAIN_RECONCILE_BATCH = int(os.environ.get("AGENTPAY_CHAIN_RECONCILE_BATCH", "2000"))
AGENTPAY_CHAIN_RECONCILE_THREADS = int(os.environ.get("AGENTPAY_CHAIN_RECONCILE_THREADS", "8"))
# The confirmed audit: a reorganisation deeper than the confirmation depth can take a confirmed
# transaction of ours off the chain after we delivered (or refunded). Confirmed transactions are
# read again every AUDIT_EVERY seconds for AUDIT_WINDOW seconds after they were confirmed.
AGENTPAY_CONFIRMED_AUDIT_WINDOW_SECONDS = int(os.environ.get("AGENTPAY_CONFIRMED_AUDIT_WINDOW_SECONDS", "86400"))
AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS = int(os.environ.get("AGENTPAY_CONFIRMED_AUDIT_EVERY_SECONDS", "600"))
AGENTPAY_CONFIRMED_AUDIT_BATCH = int(os.environ.get("AGENTPAY_CONFIRMED_AUDIT_BATCH", "500"))
