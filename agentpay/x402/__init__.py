"""The x402 protocol, version 2, as the gateway speaks it (issue 18; seed 004 §3.1).

Pure code, no database and no network: the headers (`headers`), the EIP-3009 authorization and
its EIP-712 signature (`eip3009`), and the checks a presented payment must pass against the
challenge we issued (`verify`). The official SDK (`x402`) supplies the pydantic types, the
header names and the EIP-712 hashing; what the SDK leaves to a server (the Django side, the
strict decoding of what an agent sends, our own reasons) is here.
"""
