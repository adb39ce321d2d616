"""An Alipay-compatible HTTP simulator for tests and the demo (issue 20; docs/alipay_simulator.md).

python-alipay-sdk talks to it over HTTP on loopback: ``/gateway.do`` verifies the app's RSA2
request signature and answers signed like Alipay (``alipay.trade.pay`` with an agreement,
``alipay.trade.query``, ``alipay.user.agreement.query`` / ``.unsign``, the trade-bill download);
notifications are signed with Alipay's key and retried on Alipay's schedule; faults on demand."""

from tests.verification.fake_alipay.core import BALANCE_NOT_ENOUGH, AlipaySimulatorCore
from tests.verification.fake_alipay.keys import (
    AlipayKeys,
    generate_key_pair,
    generate_keys,
    session_keys,
    sign_rsa2,
    signing_string,
    verify_rsa2,
)
from tests.verification.fake_alipay.notify import MAX_DELIVERIES, RETRY_DELAYS, NotifyDelivery
from tests.verification.fake_alipay.server import AlipaySimulator

__all__ = [
    "BALANCE_NOT_ENOUGH", "MAX_DELIVERIES", "RETRY_DELAYS", "AlipayKeys", "AlipaySimulator", "AlipaySimulatorCore",
    "NotifyDelivery", "generate_key_pair", "generate_keys", "session_keys", "sign_rsa2", "signing_string",
    "verify_rsa2",
]
