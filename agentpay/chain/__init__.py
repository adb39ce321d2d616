"""AgentPay's on-chain rail (issue 18): the EIP-3009 token we settle in, its committed build
artifact, the JSON-RPC client wrappers (`rpc`), the token's calls (`token`) and the signing keys
(`keys`). Settlement and reconciliation live in `settlement` / `reconcile`."""
