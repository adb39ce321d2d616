from agentpay.models.audit import CauseKind, GatewayRequest, IntentReceipt, OutboxMessage
from agentpay.models.chain import (
    ChainAuthorization,
    ChainNetwork,
    ChainTransaction,
    ChainTxPurpose,
    PaymentChallenge,
    RefundObligation,
    SettlementAuditFinding,
)
from agentpay.models.evidence import FulfillmentStatusQuery, StatusQueryAnswer
from agentpay.models.ledger import AccountKind, LedgerAccount, Transfer, TransferKind
from agentpay.models.payments import Fulfillment, PaymentIntent, ReviewQueueIntent, Settlement
from agentpay.models.permissions import AgentPayConsole
from agentpay.models.tenants import (
    HttpMethod,
    PricedRoute,
    Tenant,
    TenantApiKey,
    TenantCustomerLink,
    TenantStatus,
)
from agentpay.models.webhooks import TenantWebhookEndpoint, WebhookAttempt, WebhookDelivery

__all__ = [
    "AccountKind", "AgentPayConsole", "CauseKind", "ChainAuthorization", "ChainNetwork", "ChainTransaction",
    "ChainTxPurpose", "PaymentChallenge", "RefundObligation", "Fulfillment", "FulfillmentStatusQuery", "GatewayRequest",
    "HttpMethod", "IntentReceipt", "LedgerAccount", "OutboxMessage", "PaymentIntent", "PricedRoute",
    "ReviewQueueIntent", "Settlement", "SettlementAuditFinding", "StatusQueryAnswer", "Tenant", "TenantApiKey",
    "TenantCustomerLink", "TenantStatus", "TenantWebhookEndpoint", "Transfer", "TransferKind", "WebhookAttempt",
    "WebhookDelivery",
]
