"""RSA2 keys and signatures as Alipay uses them: PKCS#1 v1.5 over SHA-256, base64 without newlines,
over the parameters sorted by name and joined ``k=v`` with ``&`` (empty values left out)."""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from Cryptodome.Hash import SHA256
from Cryptodome.PublicKey import RSA
from Cryptodome.Signature import pkcs1_15


def generate_key_pair(bits: int = 2048) -> tuple[str, str]:
    """A fresh RSA key pair as PEM text: (private key, public key)."""
    key = RSA.generate(bits)
    return key.export_key().decode("ascii"), key.publickey().export_key().decode("ascii")


@dataclass(frozen=True)
class AlipayKeys:
    """The two key pairs of one run: the merchant app's (it signs requests; the simulator knows its
    public key) and Alipay's (the simulator signs answers and notifications; the product verifies)."""

    app_private_pem: str
    app_public_pem: str
    alipay_private_pem: str
    alipay_public_pem: str


def generate_keys() -> AlipayKeys:
    app_private, app_public = generate_key_pair()
    alipay_private, alipay_public = generate_key_pair()
    return AlipayKeys(app_private, app_public, alipay_private, alipay_public)


@functools.cache
def session_keys() -> AlipayKeys:
    """Keys generated once per process (two 2048-bit keys cost about a second)."""
    return generate_keys()


def signing_string(params: Mapping[str, str], exclude: Iterable[str] = ("sign",)) -> str:
    """``k=v&k=v`` of ``params`` sorted by key, without ``exclude`` and without empty values."""
    skip = set(exclude)
    return "&".join(f"{k}={v}" for k, v in sorted(params.items()) if k not in skip and v not in ("", None))


def sign_rsa2(private_pem: str, text: str) -> str:
    digest = SHA256.new(text.encode("utf-8"))
    return base64.b64encode(pkcs1_15.new(RSA.import_key(private_pem)).sign(digest)).decode("ascii")


def verify_rsa2(public_pem: str, text: str, signature: str) -> bool:
    try:
        raw = base64.b64decode(signature, validate=False)
        pkcs1_15.new(RSA.import_key(public_pem)).verify(SHA256.new(text.encode("utf-8")), raw)
    except (ValueError, TypeError, binascii.Error):
        return False
    return True
