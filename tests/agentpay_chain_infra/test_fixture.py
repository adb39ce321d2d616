"""The chain fixture itself: the token is deployed as the artifact says, payers hold their units,
and each test starts from the same chain whatever the previous one did."""

import pytest

from agentpay.chain import token


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
