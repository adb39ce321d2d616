from dunning.models.alert_delivery import (
    ALERT_RAISED_TOPIC,
    AlertChannel,
    AlertDelivery,
    AlertDeliveryAttempt,
    AlertDeliveryStatus,
)
from dunning.models.audit import ENTITLEMENT_CHANGED_TOPIC, CauseKind, OutboxMessage, TransitionReceipt
from dunning.models.cycle import AttemptOrigin, DunningCycle, PaymentAttempt
from dunning.models.duties import (
    CompensationAction,
    CompensationCase,
    SampleReview,
    SampleReviewItem,
    SampleVerdict,
)
from dunning.models.evidence import (
    PAID_EVENT_TYPES,
    EventOutcome,
    FactKind,
    MonetaryFact,
    ProviderEvent,
    ProviderReceipt,
)
from dunning.models.inbox import Verification, WebhookDelivery
from dunning.models.operations import (
    Alert,
    AlertKind,
    IncidentSwitch,
    JobRun,
    NotificationDelivery,
    ReconciliationReport,
)
from dunning.models.permissions import SupportConsole
from dunning.models.policy import DunningPolicy
from dunning.models.rollout import RolloutStage

__all__ = [
    "ALERT_RAISED_TOPIC", "AlertChannel", "AlertDelivery", "AlertDeliveryAttempt", "AlertDeliveryStatus",
    "Alert", "AlertKind", "IncidentSwitch", "JobRun", "NotificationDelivery", "ReconciliationReport",
    "AttemptOrigin", "CauseKind", "DunningCycle", "DunningPolicy", "ENTITLEMENT_CHANGED_TOPIC", "EventOutcome",
    "FactKind", "MonetaryFact", "OutboxMessage", "PAID_EVENT_TYPES", "PaymentAttempt", "ProviderEvent",
    "ProviderReceipt", "RolloutStage", "SupportConsole", "TransitionReceipt", "Verification", "WebhookDelivery",
    "CompensationAction", "CompensationCase", "SampleReview", "SampleReviewItem", "SampleVerdict",
]
