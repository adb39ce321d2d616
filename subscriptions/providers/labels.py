"""How each payment provider is shown to people: its label, the words for its objects and the
links into its own console. The one place that maps a provider name ("stripe", "alipay") to what
support staff, customers and API clients read; every surface uses it. An unknown name is shown
as it is, with no provider-specific link."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProviderTerms:
    label: str  # "Stripe"
    subscription: str  # what the provider's subscription id names
    invoice: str  # what the provider's invoice id names
    account: str  # what provider_account names
    dashboard: str = ""  # base URL of the provider's own console ("" for none we link to)


PROVIDERS: dict[str, ProviderTerms] = {
    "stripe": ProviderTerms("Stripe", "subscription", "invoice", "account", "https://dashboard.stripe.com"),
    "alipay": ProviderTerms("Alipay", "recurring deduction agreement", "deduction order", "app_id"),
}
KNOWN_PROVIDERS = tuple(PROVIDERS)
_DASHBOARD_PATHS = {"subscription": "subscriptions", "invoice": "invoices", "customer": "customers",
                    "event": "events"}


# The refusals of "Retry payment now" / "Pay now" whose product wording names a card, in the words
# of a provider that has none (dunning.actions.retry_now.REFUSAL_TEXT holds the card wording).
PROVIDER_REFUSALS: dict[str, dict[str, str]] = {
    "alipay": {
        "RETRY_AUTHORITY_IS_LOCAL": "We try the Alipay deduction again ourselves: use \u201cRetry payment now\u201d "
                                    "instead.",
        "NON_RETRYABLE_NO_RETRY": "Alipay refused this deduction in a way that cannot be retried: the recurring "
                                  "deduction agreement is no longer active. Please sign the deduction agreement "
                                  "again in Alipay.",
        "ATTEMPT_BUDGET_EXHAUSTED": "We have already tried the Alipay deduction as many times as allowed. Please "
                                    "check your Alipay balance or contact support.",
    },
}


def provider_refusal(name: str, code: str) -> str:
    """A refusal's text in the provider's own words; "" when the product's wording fits."""
    return PROVIDER_REFUSALS.get(name, {}).get(code, "")


def provider_label(name: str) -> str:
    """"Stripe", "Alipay"; an unknown name as it is."""
    terms = PROVIDERS.get(name)
    return terms.label if terms else name


def provider_with_account(name: str, account: str) -> str:
    """"Stripe · acct_test", "Alipay · 2021000000000001": a list column."""
    return f"{provider_label(name)} \u00b7 {account}" if account else provider_label(name)


def provider_terms(name: str) -> ProviderTerms:
    return PROVIDERS.get(name) or ProviderTerms(name, "subscription", "invoice", "account")


def provider_summary(name: str, account: str) -> dict[str, str]:
    """{"name", "label", "account"}: the provider as the API states it."""
    return {"name": name, "label": provider_label(name), "account": account}


def dashboard_url(name: str, kind: str, object_id: str) -> str:
    """A link to the object in the provider's own console; only Stripe has one ("" otherwise)."""
    terms = PROVIDERS.get(name)
    if not terms or not terms.dashboard or not object_id or kind not in _DASHBOARD_PATHS:
        return ""
    return f"{terms.dashboard}/{_DASHBOARD_PATHS[kind]}/{object_id}"


def id_tail(provider_id: str, digits: int = 4) -> str:
    """"…1234": the end of a long provider id, enough for a customer to recognise it."""
    return f"\u2026{provider_id[-digits:]}" if len(provider_id) > digits else provider_id
