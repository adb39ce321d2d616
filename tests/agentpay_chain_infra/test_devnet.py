"""The demo's chain set-up (bin/demo): on a node whose dev accounts hold ETH it deploys the token,
mints to the demo payer and points the ChainNetwork row at the node; run twice it updates the row."""

from eth_account import Account

from agentpay.chain import devnet, token
from agentpay.models.chain import ChainNetwork


def test_devnet_setup_deploys_mints_and_writes_the_network(chain, db):
    # The fixture's anvil has its own accounts; give the dev accounts ETH as a default anvil would.
    addresses = [Account.from_key(key).address for key in devnet.DEV_KEYS]
    if chain.kind == "anvil":
        for address in addresses:
            chain.rpc("anvil_setBalance", [address, hex(10**20)])
    else:
        chain.node.fallback.fund(addresses, 10**20)
    keys = devnet.devnet_setup(chain.rpc_url)
    network = ChainNetwork.objects.get(caip2="eip155:31337")
    assert network.rpc_url == chain.rpc_url and network.token_address != chain.token_address
    payer = Account.from_key(devnet.DEV_KEYS[3]).address
    assert token.balance_of(network, payer) == devnet.DEMO_PAYER_UNITS
    assert set(keys) == {network.submitter, network.pay_to}
    devnet.devnet_setup(chain.rpc_url)
    assert ChainNetwork.objects.filter(caip2="eip155:31337").count() == 1
