"""AgentPay (seed 004): AI agents pay per call for upstream APIs through our gateway.

Its own app because seed 003 keeps usage billing apart from subscription debt: nothing here
writes a dunning cycle; it only reads entitlements (see `agentpay.bridge`).
"""
