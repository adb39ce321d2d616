"""Publishing and binding dunning policies (SPEC §4)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from dunning.clock import trusted_now
from dunning.models import DunningPolicy
from dunning.policy.document import PolicyDocument, PolicyValidationError, load_policy
from dunning.storable import unstorable


class PolicyConflict(Exception):
    """A different document was published before under the same name@version."""


class NoPolicyError(LookupError):
    """No published policy matches and no default policy exists."""


def policy_publish(*, text: str, user: Any = None, now: datetime | None = None) -> tuple[DunningPolicy, bool]:
    """Validate and publish. Returns (policy, created). Re-publishing the same document is a no-op;
    a different document under an existing identity is refused (published policies are immutable)."""
    doc = _storable(load_policy(_storable_text(text)))
    existing = DunningPolicy.objects.filter(identity=doc.identity).first()
    if existing is not None:
        if existing.digest != doc.digest():
            raise PolicyConflict(
                f"{doc.identity} is already published with different content; publish a new version instead"
            )
        return existing, False
    try:
        with transaction.atomic():
            policy = DunningPolicy.objects.create(
                name=doc.name, version=doc.version, identity=doc.identity, document=doc.canonical,
                digest=doc.digest(), source_text=text, prices=list(doc.prices), cohort=doc.cohort,
                is_default=doc.is_default, mode=doc.mode, retry_authority=doc.retry_authority,
                published_at=now or trusted_now(), published_by=user,
            )
    except IntegrityError:
        return policy_publish(text=text, user=user, now=now)
    return policy, True


# PositiveIntegerField: PostgreSQL integer.
MAX_VERSION = 2**31 - 1


def _storable_text(text: str) -> str:
    """The document text as PostgreSQL can store it: a NUL (or a lone surrogate) is refused here,
    with a message, instead of failing the insert."""
    fault = unstorable(text, "document")
    if fault:
        raise PolicyValidationError([f"{fault}; a policy document is plain text"])
    return text


def _storable(doc: PolicyDocument) -> PolicyDocument:
    """Refuse what the validator accepts but the columns cannot hold: a NUL (an escaped one, \\u0000
    in JSON or "\\0" in YAML) in any value or key, and a name, cohort or version beyond its column."""
    errors = []
    fault = unstorable(doc.canonical)
    if fault:
        errors.append(fault)
    for field, value in (("name", doc.name), ("identity", doc.identity), ("cohort", doc.cohort)):
        limit = DunningPolicy._meta.get_field(field).max_length
        if len(value) > limit:
            where = "applies_to.cohort" if field == "cohort" else "policy"
            errors.append(f"{where}: {field} is {len(value)} characters long; at most {limit}")
    if doc.version > MAX_VERSION:
        errors.append(f"policy: version {doc.version} is above the largest version, {MAX_VERSION}")
    if errors:
        raise PolicyValidationError(errors)
    return doc


def policy_provider(policy: DunningPolicy) -> tuple[str, str]:
    """The (provider name, provider account) a published policy states in `provider`."""
    provider = (policy.document or {}).get("provider") or {}
    return str(provider.get("name") or ""), str(provider.get("account") or "")


def policy_for_price(price_id: str, *, provider: str, account: str = "", cohort: str = "default") -> DunningPolicy:
    """The newest published policy of `provider` whose applies_to lists the price (and cohort); else
    the newest default policy of `provider`. A legacy plan id is matched like a price id."""
    return policy_for_prices((price_id,), cohort=cohort, provider=provider, account=account)


def policy_for_prices(price_ids: Sequence[str], *, cohort: str, provider: str, account: str) -> DunningPolicy:
    """The policy for a set of prices (an invoice's lines, a subscription's items) of a subscription
    collected through `provider` (its name: "stripe", "alipay") on `account` (its provider account).

    Only policies whose `provider.name` is `provider` are candidates: a Stripe policy never binds an
    Alipay subscription, nor the reverse. Among them, those stating `account` come first (a price id
    belongs to one provider account), then those of other accounts; inside each group the order is
    the newest policy listing the first price that any policy lists, else the newest default policy.
    Raises NoPolicyError, naming the provider, when nothing applies."""
    policies = [p for p in DunningPolicy.objects.order_by("-published_at", "-version")
                if policy_provider(p)[0] == provider]
    same_account = [p for p in policies if policy_provider(p)[1] == account]
    other_accounts = [p for p in policies if policy_provider(p)[1] != account]
    for group in (same_account, other_accounts):
        chosen = _by_price_then_default(group, price_ids, cohort)
        if chosen is not None:
            return chosen
    shown = ", ".join(repr(p) for p in price_ids) or "no price"
    if not policies:
        raise NoPolicyError(f"no policy is published for provider {provider!r}, so nothing applies to {shown}")
    raise NoPolicyError(f"no published policy for provider {provider!r} applies to {shown} "
                        f"and there is no default policy for {provider!r}")


def _by_price_then_default(policies: list[DunningPolicy], price_ids: Sequence[str],
                           cohort: str) -> DunningPolicy | None:
    for price_id in price_ids:
        for policy in policies:
            if price_id in policy.prices and policy.cohort in (cohort, "*"):
                return policy
    for policy in policies:
        if policy.is_default:
            return policy
    return None
