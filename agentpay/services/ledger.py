"""Ledger moves: hold, capture (post), release (void) and credits. They join the caller's
transaction; a hold expects the wallet row already locked by the caller (the acceptance service
locks intent → settlement → fulfillment → wallet), a capture or release locks it by its UPDATE;
system accounts are always touched last, so two transactions never wait on each other in
opposite orders.

Totals move by UPDATE … SET x = x + amount, so the database adds, not Python; the CHECK on the
wallet backs up the balance test made under the lock. System account ids are cached per process
(no INSERT … ON CONFLICT + SELECT per hold); a stale id is noticed by its UPDATE moving no row.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import BigIntegerField, F, Value

from agentpay import ids
from agentpay.bridge import unsaved_row
from agentpay.models import AccountKind, LedgerAccount, PaymentIntent, Tenant, Transfer, TransferKind
from agentpay.services import ledger_writes
from agentpay.services.ledger_writes import hold_write, resolve_write


class StaleSystemAccount(Exception):
    """A hold written by its caller (ledger_hold write=False) found no system account under the
    cached id: the caller's transaction is rolled back and the id forgotten (`forget_system_ids`)."""


def forget_system_ids() -> None:
    _SYSTEM_IDS.clear()


class SystemAccountNotCached(StaleSystemAccount):
    """A guarded open's hold found its system account's id no longer cached (another thread forgot
    it): nothing was written, and the ids cached are not stale for it."""


class LedgerRefusal(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


def _ensure(kind: str, currency: str, tenant: Tenant | None, shard: int = 0) -> LedgerAccount:
    # ON CONFLICT DO NOTHING: two first calls at once both succeed; neither poisons its transaction.
    LedgerAccount.objects.bulk_create([LedgerAccount(kind=kind, currency=currency, tenant=tenant, shard=shard)],
                                      ignore_conflicts=True)
    return LedgerAccount.objects.get(kind=kind, currency=currency, tenant=tenant, shard=shard)


def wallet_ensure(*, tenant: Tenant, currency: str) -> LedgerAccount:
    return _ensure(AccountKind.WALLET, currency, tenant)


def system_shard(wallet_id: int) -> int:
    """The shard of the system accounts a wallet's transfers use (wallet-ledger-spec §3.1)."""
    return wallet_id % max(1, settings.AGENTPAY_SYSTEM_ACCOUNT_SHARDS)


def system_account(kind: str, currency: str, shard: int = 0) -> LedgerAccount:
    if kind == AccountKind.WALLET:
        raise ValueError("a wallet is a tenant's account, not a system account")
    account = _ensure(kind, currency, None, shard)
    _SYSTEM_IDS[(kind, currency, shard)] = account.pk
    return account


# System account ids per process: (kind, currency, shard) → pk. A system account is never
# deleted in production; a stale id (a test flushed the table, or the transaction that made the
# account rolled back) moves no row, which `_move_system` notices, and the id is looked up again.
_SYSTEM_IDS: dict[tuple[str, str, int], int] = {}


def _move(account_id: int, **deltas: int) -> int:
    # The amount typed as the bigint column it adds to: left to Django, a bare int is an Int4,
    # which psycopg's server-side binding wraps past 2**31 (tests/agentpay/test_large_amounts.py).
    return LedgerAccount.objects.filter(pk=account_id).update(
        **{name: F(name) + Value(amount, output_field=BigIntegerField()) for name, amount in deltas.items()})


def _move_system(kind: str, currency: str, shard: int, **deltas: int) -> int:
    """Move a system account's totals (touched last: after the wallet); returns its pk."""
    account_id = _SYSTEM_IDS.get((kind, currency, shard))
    if account_id is not None and _move(account_id, **deltas) == 1:
        return account_id
    account_id = system_account(kind, currency, shard).pk
    if _move(account_id, **deltas) != 1:
        raise LookupError(f"the {kind} {currency} account vanished")
    return account_id


def hold_deferrable(wallet: LedgerAccount) -> bool:
    """Whether ledger_hold(write=False) on `wallet` makes its hold unsaved, for the caller's statement
    (its revenue account's id is cached in this process)."""
    revenue = (AccountKind.REVENUE, wallet.currency, system_shard(wallet.pk))
    return ledger_writes.one_statement() and revenue in _SYSTEM_IDS


def ledger_hold(*, wallet: LedgerAccount, amount: int, intent: PaymentIntent, actor: str,
                now: datetime, write: bool = True) -> Transfer:
    """A pending transfer wallet → revenue (`hld_…`). `wallet` must be locked by the caller.
    `write=False`: when it would be one statement (the revenue account's id cached), the hold is
    checked and made, unsaved (no pk), for the caller to write with ledger_writes.hold_ctes, and
    to raise StaleSystemAccount, rolling its transaction back, when that moved no row; otherwise
    it is written here as always."""
    if wallet.available < amount:
        raise LedgerRefusal("INSUFFICIENT_BALANCE", f"available {wallet.available} {wallet.currency}, "
                                                    f"the call costs {amount}")
    shard = system_shard(wallet.pk)
    revenue_id = _SYSTEM_IDS.get((AccountKind.REVENUE, wallet.currency, shard))
    hold = unsaved_row(
        Transfer, transfer_id=ids.new_id(ids.HOLD), kind=TransferKind.PENDING, debit_account=wallet,
        credit_account_id=revenue_id, amount=amount, currency=wallet.currency, intent=intent, actor=actor,
        created_at=now, reason=f"hold for {intent.intent_id}")
    if revenue_id is not None and ledger_writes.one_statement() and (not write or hold_write(hold)):
        return hold
    if intent._state.adding:  # a guarded open's (open_writes): its id forgotten since it was checked
        raise SystemAccountNotCached(f"no cached {AccountKind.REVENUE} {wallet.currency} account id for shard {shard}")
    # Through the ORM (the embedded demo), or the first hold on a revenue shard this process has
    # not seen (its id is looked up, and the account made if there is none yet).
    with transaction.atomic(savepoint=False):
        _move(wallet.pk, debits_pending=amount)
        hold.credit_account_id = _move_system(AccountKind.REVENUE, wallet.currency, shard, credits_pending=amount)
        hold.save(force_insert=True)
    return hold


def _resolve(hold: Transfer, kind: str, actor: str, now: datetime, reason: str, ticket: str,
             write: bool = True) -> Transfer:
    if hold.kind != TransferKind.PENDING:
        raise LedgerRefusal("NOT_A_HOLD", f"{hold.transfer_id} is a {hold.kind} transfer")
    resolution = unsaved_row(
        Transfer, transfer_id=ids.new_id(ids.TRANSFER), kind=kind, debit_account_id=hold.debit_account_id,
        credit_account_id=hold.credit_account_id, amount=hold.amount, currency=hold.currency, pending=hold,
        intent_id=hold.intent_id, actor=actor, created_at=now, reason=reason, ticket=ticket)
    if not write:
        return resolution
    # The unique `pending` decides "already resolved" (no SELECT first), in both paths.
    resolved = resolve_write(resolution) if ledger_writes.one_statement() else _resolve_orm(resolution)
    if not resolved:
        raise LedgerRefusal("HOLD_ALREADY_RESOLVED", f"{hold.transfer_id} was already posted or voided")
    return resolution


def _resolve_orm(resolution: Transfer) -> bool:
    """The resolution through the ORM (the embedded SQLite demo): False when the hold is resolved."""
    try:
        with transaction.atomic():  # a savepoint: the refusal leaves the caller's transaction usable
            resolution.save(force_insert=True)
    except IntegrityError:
        return False
    amount = resolution.amount
    if resolution.kind == TransferKind.POST_PENDING:
        _move(resolution.debit_account_id, debits_pending=-amount, debits_posted=amount)
        _move(resolution.credit_account_id, credits_pending=-amount, credits_posted=amount)
    else:
        _move(resolution.debit_account_id, debits_pending=-amount)
        _move(resolution.credit_account_id, credits_pending=-amount)
    return True


def ledger_capture(*, hold: Transfer, actor: str, now: datetime, reason: str = "", ticket: str = "",
                   write: bool = True) -> Transfer:
    """Post the hold: the call is billed. Exactly once (HOLD_ALREADY_RESOLVED otherwise).
    `write=False`: the resolution is checked and made, unsaved; the caller writes it with
    ledger_writes.resolution_ctes and refuses HOLD_ALREADY_RESOLVED when its INSERT was skipped."""
    return _resolve(hold, TransferKind.POST_PENDING, actor, now, reason or "capture", ticket, write)


def ledger_release(*, hold: Transfer, actor: str, now: datetime, reason: str = "", ticket: str = "",
                   write: bool = True) -> Transfer:
    """Void the hold: the call is not billed. Exactly once (HOLD_ALREADY_RESOLVED otherwise).
    `write=False`: as ledger_capture's."""
    return _resolve(hold, TransferKind.VOID_PENDING, actor, now, reason or "release", ticket, write)


def ledger_credit_wallet(*, tenant: Tenant, currency: str, amount: int, source: str, actor: str, now: datetime,
                         reason: str, ticket: str = "", external_ref: str = "") -> Transfer:
    """A posted transfer from a system account (`source`: top-up clearing or staff credit) into the
    tenant's wallet. Joins the caller's transaction; locks wallet then the system account."""
    if amount <= 0:
        raise LedgerRefusal("AMOUNT_NOT_POSITIVE", f"a credit must be a positive amount; got {amount}")
    with transaction.atomic(savepoint=False):
        wallet = LedgerAccount.objects.select_for_update().get(pk=wallet_ensure(tenant=tenant, currency=currency).pk)
        # The totals first (wallet, then the system account), the transfer last: a refusal
        # leaves this block by an exception, which rolls the whole transaction back.
        _move(wallet.pk, credits_posted=amount)
        clearing_id = _move_system(source, currency, system_shard(wallet.pk), debits_posted=amount)
        try:
            with transaction.atomic():
                credit = Transfer.objects.create(
                    transfer_id=ids.new_id(ids.TRANSFER), kind=TransferKind.POSTED, debit_account_id=clearing_id,
                    credit_account=wallet, amount=amount, currency=currency, actor=actor, created_at=now,
                    reason=reason, ticket=ticket, external_ref=external_ref)
        except IntegrityError:
            raise LedgerRefusal("ALREADY_CREDITED", f"{external_ref} was already credited") from None
    return credit
