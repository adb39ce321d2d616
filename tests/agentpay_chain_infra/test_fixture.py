"""The chain fixture itself: the token is deployed as the artifact says, payers hold their units,
and each test starts from the same chain whatever the previous one did."""

import pytest

from agentpay.chain import token
from tests.support import chain as chain_support
from tests.support import chain_node as chain_node_support


def test_token_deployed_with_usdc_domain_and_minted_payers(chain):
    contract = chain.w3.eth.contract(address=chain.w3.to_checksum_address(chain.token_address), abi=token.abi())
    assert contract.functions.name().call() == "USD Coin"
    assert contract.functions.version().call() == "2"
    assert contract.functions.decimals().call() == 6
    assert int(chain.rpc("eth_chainId"), 16) == chain.chain_id == 31337
    for payer in chain.payers:
        assert chain.balance(payer.address) == chain.minted_per_payer
    assert chain.eth_balance(chain.submitter.address) > 10**18


@pytest.mark.parametrize("round_", [1, 2])
def test_each_test_starts_from_the_deployed_state(chain, round_):
    # Both rounds move tokens and pause mining; the second sees none of the first's changes.
    payer = chain.payers[0]
    assert chain.balance(payer.address) == chain.minted_per_payer
    start = chain.block_number()
    chain.wait_receipt(chain.send(payer, to=chain.token_address, data=token.transfer_calldata(chain.pay_to.address, 5)))
    assert chain.balance(payer.address) == chain.minted_per_payer - 5
    assert chain.block_number() == start + 1
    chain.set_automine(False)
    chain.send(payer, to=chain.token_address, data=token.transfer_calldata(chain.pay_to.address, 7))


def test_an_anvil_that_will_not_start_falls_back_loudly(monkeypatch, tmp_path, capsys):
    broken = tmp_path / "anvil"
    broken.write_text("#!/bin/sh\necho 'cannot run here' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.delenv("AGENTPAY_CHAIN_UNAVAILABLE", raising=False)
    monkeypatch.setenv("AGENTPAY_ANVIL_BIN", str(broken))
    monkeypatch.setattr(chain_node_support, "FALLBACK_REASONS", [])
    node = chain_support.start_node()
    try:
        assert node.kind == "eth-tester"
        assert "would not start" in node.why_not_anvil and "exited with 3" in node.why_not_anvil
        assert "FALLING BACK to eth-tester" in capsys.readouterr().err
        assert [node.why_not_anvil] == chain_node_support.FALLBACK_REASONS
        assert node.token_address and int(chain_support.rpc_call(node.rpc_url, "eth_chainId"), 16) == 31337
    finally:
        node.stop()


def test_a_missing_anvil_path_is_named(monkeypatch):
    monkeypatch.delenv("AGENTPAY_CHAIN_UNAVAILABLE", raising=False)
    monkeypatch.setenv("AGENTPAY_ANVIL_BIN", "/nonexistent/anvil")
    assert chain_support.find_anvil() == (None, "AGENTPAY_ANVIL_BIN=/nonexistent/anvil is not executable")
    monkeypatch.setenv("AGENTPAY_CHAIN_UNAVAILABLE", "npm is not installed")
    assert chain_support.find_anvil() == (None, "npm is not installed")
