"""Our own transactions on chain: sign once, persist, broadcast the same bytes, and read the
evidence of what became of them (seed 004 §4.2; issue 18 item 3).

Shared by the settlement (transferWithAuthorization from the submitter) and the refund (a token
transfer from pay_to back to the payer). Nothing here moves a state line: the callers turn an
`Evidence` into the steps of their line. Network calls happen only outside transactions; the
bookkeeping of a ChainTransaction changes only in `chain_tx_record`.

Sender nonces: the next nonce is the larger of the node's pending count and our highest
persisted nonce + 1, taken under a lock on the ChainNetwork row, so two workers never sign two
transactions for one nonce (and the unique constraint would refuse the second anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from eth_account import Account
from web3 import Web3

from agentpay.chain import keys, rpc, token
from agentpay.models import ChainAuthorization, ChainNetwork, ChainTransaction

# A node's answers to eth_sendRawTransaction that mean "these bytes can never be mined": the
# only definite rejections. Anything else it refuses leaves the outcome to the queries (a
# "nonce too low" may be our own earlier broadcast that landed).
DEFINITE_REJECTIONS = ("invalid signature", "invalid sender", "intrinsic gas too low", "exceeds block gas limit",
                       "invalid chain id", "chain id mismatch", "transaction type not supported")
# "The node has these bytes already": the broadcast did what we asked.
ALREADY_KNOWN = ("already known", "known transaction", "already imported", "already in the mempool")
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def lower(value: Any) -> str:
    text = value.hex() if isinstance(value, bytes | bytearray) else str(value)
    text = text.lower()
    return text if text.startswith("0x") else "0x" + text


def chain_tx_sign(*, network: ChainNetwork, sender: str, to: str, data: str, owner: dict[str, Any],
                  purpose: str, now: datetime) -> ChainTransaction:
    """Sign one transaction from `sender` and persist it (raw bytes + hash) in its own committed
    transaction; returns the row. `owner` is {"settlement": …} or {"refund": …}: when that owner
    already has a transaction, that one is returned and nothing is signed (never re-sign)."""
    existing = ChainTransaction.objects.filter(**owner).first()
    if existing is not None:
        return existing
    # Read the node before taking any lock: no network call inside a transaction.
    pending = rpc.transaction_count(network, sender, "pending")
    gas_price = rpc.gas_price(network)
    key = keys.private_key_for(sender)
    with transaction.atomic(durable=True):
        ChainNetwork.objects.select_for_update().get(pk=network.pk)
        existing = ChainTransaction.objects.filter(**owner).first()
        if existing is not None:  # another worker signed it while we read the node
            return existing
        highest = (ChainTransaction.objects.filter(network=network, sender=sender)
                   .aggregate(n=Max("sender_nonce"))["n"])
        nonce = max(pending, 0 if highest is None else highest + 1)
        signed = Account.sign_transaction({
            "to": _checksum(to), "data": data, "value": 0, "gas": settings.AGENTPAY_CHAIN_GAS_LIMIT,
            "gasPrice": gas_price, "nonce": nonce, "chainId": network.chain_id}, key)
        return ChainTransaction.objects.create(
            purpose=purpose, network=network, sender=sender, sender_nonce=nonce,
            raw_tx=lower(bytes(signed.raw_transaction)), tx_hash=lower(bytes(signed.hash)), signed_at=now,
            next_query_at=now, **owner)


def _checksum(address: str) -> str:
    return Web3.to_checksum_address(address)


@dataclass(frozen=True)
class Broadcast:
    kind: str  # "ok" | "timeout" | "rejected" (definite) | "refused" (not definite: queries decide)
    detail: str = ""


def chain_tx_broadcast(tx: ChainTransaction, *, now: datetime) -> Broadcast:
    """Send the persisted bytes (the only retransmission there is) and record the attempt."""
    try:
        answer = Broadcast("ok", rpc.send_raw_transaction(tx.network, tx.raw_tx))
    except rpc.ChainTimeout as exc:
        answer = Broadcast("timeout", f"no answer: {exc}")
    except rpc.ChainRejected as exc:
        message = (getattr(exc, "message", "") or str(exc)).lower()
        if any(s in message for s in ALREADY_KNOWN):
            answer = Broadcast("ok", f"the node has it already: {message}")
        elif any(s in message for s in DEFINITE_REJECTIONS):
            answer = Broadcast("rejected", message)
        else:
            answer = Broadcast("refused", message)
    chain_tx_record(tx, broadcast=answer, now=now)
    return answer


def chain_tx_record(tx: ChainTransaction, *, now: datetime, broadcast: Broadcast | None = None,
                    evidence: Evidence | None = None, terminal: bool = False) -> None:
    """The one writer of a ChainTransaction's bookkeeping: a broadcast attempt or a query round.
    Under the row's lock, compare-and-set on the counters (a concurrent round is counted, never
    lost). `terminal`: its line reached a terminal state, so nobody needs to ask again."""
    with transaction.atomic():
        locked = ChainTransaction.objects.select_for_update().get(pk=tx.pk)
        changes: dict[str, Any] = {}
        if broadcast is not None:
            changes.update(broadcast_attempts=F("broadcast_attempts") + 1, last_broadcast_at=now,
                           last_broadcast_answer=f"{broadcast.kind}: {broadcast.detail}"[:2000])
        if evidence is not None:
            changes.update(queries=F("queries") + 1, last_query_at=now,
                           last_query_answer=f"{evidence.kind}: {evidence.detail}"[:2000])
            if evidence.block_number is not None:
                changes.update(block_number=evidence.block_number, block_hash=evidence.block_hash,
                               receipt_status=evidence.receipt_status)
            wait = min(settings.AGENTPAY_CHAIN_REQUERY_MAX_SECONDS, 2 ** min(locked.queries, 6))
            changes["next_query_at"] = None if terminal else now + timedelta(seconds=wait)
        elif terminal:
            changes["next_query_at"] = None
        changed = ChainTransaction.objects.filter(pk=tx.pk, queries=locked.queries,
                                                  broadcast_attempts=locked.broadcast_attempts).update(**changes)
        assert changed == 1, "the row is locked: the compare-and-set cannot miss"


@dataclass(frozen=True)
class Evidence:
    """What one round of queries saw about one of our transactions.

    kind: "confirmed" (mined, canonical, at depth), "seen" (in the mempool or in a block not yet
    deep enough), "failed" (can never pay: reverted at depth, or the authorization expired or was
    canceled unused), "dropped" (the node does not know it and it may still land: send the same
    bytes again), "timeout" (no answer), "review" (the chain shows something a person must look
    at; the line stays where it is).
    """

    kind: str
    detail: str
    block_number: int | None = None
    block_hash: str = ""
    receipt_status: int | None = None
    reverted: bool = False  # failed with a receipt of ours (the table's `reverted`)
    carried_by: str = ""  # the transaction that carried the payment, when it was not ours


def _field(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def _canonical(network: ChainNetwork, number: int, block_hash: Any) -> bool:
    """A block is ours to count only while the chain still has it at that height (reorgs)."""
    return lower(rpc.block_hash(network, number) or "") == lower(block_hash)


def chain_tx_evidence(tx: ChainTransaction, authorization: ChainAuthorization | None = None) -> Evidence:
    """One round of evidence (receipt by hash, the node's mempool, and for a settlement the
    token's authorizationState and AuthorizationUsed). Never raises for a chain fault."""
    network = tx.network
    try:
        head = rpc.block_number(network)
        receipt = rpc.get_receipt(network, tx.tx_hash)
        reorged = ""
        if receipt is not None:
            number, block = int(_field(receipt, "blockNumber")), _field(receipt, "blockHash")
            if not _canonical(network, number, block):
                reorged, receipt = f"the receipt's block {number} is no longer canonical; ", None
        if receipt is not None:
            status, depth = int(_field(receipt, "status")), head - number + 1
            at = {"block_number": number, "block_hash": lower(block), "receipt_status": status}
            if depth < network.confirmations:
                return Evidence("seen", f"in block {number}, {depth} of {network.confirmations} confirmations", **at)
            if status == 1:
                return Evidence("confirmed", f"status 1 in block {number}, {depth} confirmations", **at)
            if authorization is not None and token.authorization_state(network, authorization.payer,
                                                                       authorization.nonce):
                # "authorization is used or canceled": our revert is no rejection of the payment;
                # whoever used it, the chain says where the money went.
                return _authorization_used(tx, authorization, head, f"our tx reverted in block {number}; ")
            return Evidence("failed", f"reverted (status 0) in block {number}", reverted=True, **at)
        if authorization is not None and token.authorization_state(network, authorization.payer,
                                                                   authorization.nonce):
            return _authorization_used(tx, authorization, head, reorged)
        if rpc.get_transaction(network, tx.tx_hash) is not None:
            return Evidence("seen", reorged + "known to the node, not mined yet")
        if authorization is not None:
            now_on_chain = rpc.chain_time(network)
            if now_on_chain >= int(authorization.valid_before):
                return Evidence("failed", reorged + f"unknown to the node, authorization unused and expired "
                                                    f"(chain time {now_on_chain} ≥ validBefore "
                                                    f"{authorization.valid_before})")
        elif rpc.transaction_count(network, tx.sender, "latest") > tx.sender_nonce:
            # A refund's nonce spent by another transaction: these bytes can never be mined.
            return Evidence("failed", reorged + f"nonce {tx.sender_nonce} of {tx.sender} was used by another "
                                                f"transaction")
        return Evidence("dropped", reorged + "unknown to the node")
    except rpc.ChainTimeout as exc:
        return Evidence("timeout", f"no answer: {exc}")
    except rpc.ChainRejected as exc:
        return Evidence("timeout", f"the node refused the query: {getattr(exc, 'message', exc)}")


def _authorization_used(tx: ChainTransaction, authorization: ChainAuthorization, head: int, note: str) -> Evidence:
    """authorizationState says used or canceled: the AuthorizationUsed log tells which, and by
    which transaction. Only a canonical log at depth counts."""
    network = tx.network
    logs = token.authorization_used_logs(network, authorization.payer, authorization.nonce, from_block=0)
    logs = [log for log in logs if _canonical(network, int(_field(log, "blockNumber")), _field(log, "blockHash"))]
    if not logs:
        return Evidence("failed", note + "authorization canceled by the payer (used, no AuthorizationUsed log)")
    log = logs[0]
    number, carrier = int(_field(log, "blockNumber")), lower(_field(log, "transactionHash"))
    at = {"block_number": number, "block_hash": lower(_field(log, "blockHash")), "receipt_status": 1}
    depth = head - number + 1
    if depth < network.confirmations:
        return Evidence("seen", note + f"authorization used in block {number}, {depth} of "
                                       f"{network.confirmations} confirmations", **at)
    if carrier == tx.tx_hash:
        return Evidence("confirmed", note + f"AuthorizationUsed by our tx in block {number}", **at)
    # Another transaction carried the payer's signed authorization (it was public once
    # broadcast). Its Transfer to pay_to of the value is the payment we asked for.
    if _transfer_in(network, carrier, authorization):
        return Evidence("confirmed", note + f"AuthorizationUsed by tx {carrier} in block {number}, with the "
                                            f"transfer to pay_to", carried_by=carrier, **at)
    return Evidence("review", note + f"authorization used by tx {carrier} without the expected transfer",
                    carried_by=carrier)


def _transfer_in(network: ChainNetwork, tx_hash: str, authorization: ChainAuthorization) -> bool:
    receipt = rpc.get_receipt(network, tx_hash)
    if receipt is None or int(_field(receipt, "status")) != 1:
        return False
    for log in _field(receipt, "logs"):
        topics = [lower(t) for t in _field(log, "topics")]
        if (lower(_field(log, "address")) == authorization.token_address and len(topics) == 3
                and topics[0] == TRANSFER_TOPIC and topics[1][-40:] == authorization.payer[2:]
                and topics[2][-40:] == authorization.pay_to[2:]
                and int(lower(_field(log, "data")), 16) == int(authorization.value)):
            return True
    return False


def authorization_calldata(authorization: ChainAuthorization) -> str:
    return token.transfer_with_authorization_calldata({
        "from": authorization.payer, "to": authorization.pay_to, "value": int(authorization.value),
        "validAfter": int(authorization.valid_after), "validBefore": int(authorization.valid_before),
        "nonce": authorization.nonce, "signature": authorization.signature})
