"""Alipay recurring deduction (issue 20): `gateway.AlipayGateway` is the only module that talks HTTP to
Alipay; `money` converts between Alipay's yuan strings and the product's fen (minor units)."""
