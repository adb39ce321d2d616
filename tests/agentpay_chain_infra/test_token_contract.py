"""The EIP-3009 token as settlement will use it: a payer's signed authorization moves exactly its
value once, through either overload, and every refusal is USDC's revert string."""

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import to_checksum_address

from agentpay.chain import rpc, token
from agentpay.chain.rpc import ChainRejected


def _submit(chain, data: str) -> dict:
    return chain.wait_receipt(chain.send(chain.submitter, to=chain.token_address, data=data))


def _vrs_calldata(auth: dict) -> str:
    sig = bytes.fromhex(auth["signature"][2:])
    r, s, v = sig[:32], sig[32:64], sig[64]
    return token._calldata(token.TRANSFER_WITH_AUTHORIZATION_VRS, [
        to_checksum_address(auth["from"]), to_checksum_address(auth["to"]), int(auth["value"]), int(auth["validAfter"]),
        int(auth["validBefore"]), bytes.fromhex(auth["nonce"][2:]), v, r, s])


@pytest.fixture
def network(chain, db):
    return chain.make_network()


@pytest.mark.parametrize("form", ["bytes", "vrs"])
def test_authorization_pays_once_and_is_then_used(chain, network, form):
    payer = chain.payers[1]
    auth = chain.sign_authorization(payer, value=12_345)
    data = token.transfer_with_authorization_calldata(auth) if form == "bytes" else _vrs_calldata(auth)
    assert token.authorization_state(network, payer.address, auth["nonce"]) is False

    receipt = _submit(chain, data)

    assert int(receipt["status"], 16) == 1
    assert chain.balance(payer.address) == chain.minted_per_payer - 12_345
    assert chain.balance(chain.pay_to.address) == 12_345
    assert token.authorization_state(network, payer.address, auth["nonce"]) is True
    logs = token.authorization_used_logs(network, payer.address, auth["nonce"])
    assert [log["transactionHash"] for log in logs] == [receipt["transactionHash"].lower()]
    assert logs[0]["blockHash"] == receipt["blockHash"].lower()
    assert logs[0]["blockNumber"] == int(receipt["blockNumber"], 16)
    # Another payer's or another nonce's logs are not this one's.
    assert token.authorization_used_logs(network, chain.payers[0].address, auth["nonce"]) == []

    # The same authorization again: USDC's "used or canceled", nothing moves.
    with pytest.raises(ChainRejected, match="FiatTokenV2: authorization is used or canceled"):
        rpc.eth_call(network, chain.token_address, data)
    assert int(_submit(chain, data)["status"], 16) == 0
    assert chain.balance(payer.address) == chain.minted_per_payer - 12_345


@pytest.mark.parametrize(("change", "reason"), [
    ({"valid_before_offset": -10}, "FiatTokenV2: authorization is expired"),
    ({"valid_after_offset": 3600}, "FiatTokenV2: authorization is not yet valid"),
    ({"tamper_value": True}, "FiatTokenV2: invalid signature"),
    ({"wrong_signer": True}, "FiatTokenV2: invalid signature"),
])
def test_refusals_are_usdc_revert_strings(chain, network, change, reason):
    payer = chain.payers[0]
    now = chain.latest_timestamp()
    auth = chain.sign_authorization(
        payer if not change.get("wrong_signer") else chain.payers[2], value=500,
        valid_after=now + change.get("valid_after_offset", -3600) if "valid_after_offset" in change else 0,
        valid_before=now + change.get("valid_before_offset", 3600))
    auth["from"] = payer.address
    if change.get("tamper_value"):
        auth["value"] = "501"
    with pytest.raises(ChainRejected, match=reason) as caught:
        rpc.eth_call(network, chain.token_address, token.transfer_with_authorization_calldata(auth))
    assert caught.value.code is not None
    assert chain.balance(payer.address) == chain.minted_per_payer


def test_transfer_and_mint_only_by_owner(chain, network):
    payer = chain.payers[3]
    receipt = _submit(chain, token.mint_calldata(payer.address, 1))
    assert int(receipt["status"], 16) == 0  # the submitter is not the owner
    receipt = chain.wait_receipt(chain.send(payer, to=chain.token_address,
                                            data=token.transfer_calldata(chain.pay_to.address, 40)))
    assert int(receipt["status"], 16) == 1
    assert token.balance_of(network, chain.pay_to.address) == 40
    assert token.balance_of(network, payer.address) == chain.minted_per_payer - 40


def _cancel_signature(chain, payer, nonce: str) -> bytes:
    typed = {
        "types": {
            "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                             {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"}],
            "CancelAuthorization": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}],
        },
        "primaryType": "CancelAuthorization",
        "domain": {"name": "USD Coin", "version": "2", "chainId": chain.chain_id,
                   "verifyingContract": to_checksum_address(chain.token_address)},
        "message": {"authorizer": to_checksum_address(payer.address), "nonce": bytes.fromhex(nonce[2:])},
    }
    return Account.sign_message(encode_typed_data(full_message=typed), payer.key).signature


def test_a_canceled_authorization_cannot_pay(chain, network):
    payer = chain.payers[2]
    auth = chain.sign_authorization(payer, value=700)
    cancel = token._calldata("cancelAuthorization(address,bytes32,bytes)", [
        to_checksum_address(payer.address), bytes.fromhex(auth["nonce"][2:]),
        _cancel_signature(chain, payer, auth["nonce"])])
    receipt = _submit(chain, cancel)
    assert int(receipt["status"], 16) == 1
    assert receipt["logs"][0]["topics"][0] == token.AUTHORIZATION_CANCELED_TOPIC
    assert token.authorization_state(network, payer.address, auth["nonce"]) is True
    # Canceled is not used: no AuthorizationUsed log, and the transfer refuses.
    assert token.authorization_used_logs(network, payer.address, auth["nonce"]) == []
    with pytest.raises(ChainRejected, match="authorization is used or canceled"):
        rpc.eth_call(network, chain.token_address, token.transfer_with_authorization_calldata(auth))


def test_receive_with_authorization_only_by_the_payee(chain, network):
    payer = chain.payers[1]
    auth = chain.sign_authorization(payer, value=80, primary_type="ReceiveWithAuthorization")
    data = token._calldata("receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)", [
        to_checksum_address(auth["from"]), to_checksum_address(auth["to"]), 80, 0, int(auth["validBefore"]),
        bytes.fromhex(auth["nonce"][2:]), bytes.fromhex(auth["signature"][2:])])
    assert int(_submit(chain, data)["status"], 16) == 0  # the submitter is not the payee
    receipt = chain.wait_receipt(chain.send(chain.pay_to, to=chain.token_address, data=data))
    assert int(receipt["status"], 16) == 1
    assert chain.balance(chain.pay_to.address) == 80
    # A receive authorization is not a transfer authorization (another type hash).
    other = chain.sign_authorization(payer, value=80, primary_type="ReceiveWithAuthorization")
    with pytest.raises(ChainRejected, match="FiatTokenV2: invalid signature"):
        rpc.eth_call(network, chain.token_address, token.transfer_with_authorization_calldata(other))
