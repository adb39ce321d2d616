"""Input parsing and output shapes of the API. Outputs are read-only views of stored rows."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from dunning.models import DunningCycle, DunningPolicy, TransitionReceipt
from dunning.policy.publishing import policy_provider
from entitlements.profiles import PROFILES
from subscriptions.providers.labels import provider_summary

# --- outputs ---------------------------------------------------------------------------------------


class CapabilitiesSerializer(serializers.Serializer):
    read = serializers.BooleanField()
    write = serializers.BooleanField()
    export = serializers.BooleanField()
    api_tokens = serializers.CharField()
    background_jobs = serializers.CharField()
    excess_resources = serializers.BooleanField()
    limits = serializers.DictField()
    export_via_support = serializers.BooleanField()
    safety_and_legal_obligations = serializers.BooleanField()


class ProviderSerializer(serializers.Serializer):
    """Who collects the subscription (subscriptions.providers.labels)."""

    name = serializers.CharField(help_text='The provider\'s name: "stripe", "alipay".')
    label = serializers.CharField(help_text='How people read it: "Stripe", "Alipay".')
    account = serializers.CharField(help_text="The provider account: a Stripe acct_…, an Alipay app_id.")


class EntitlementSerializer(serializers.Serializer):
    subscription = serializers.IntegerField(help_text="Local subscription id.")
    provider_subscription_id = serializers.CharField(
        help_text="The provider's subscription id (Stripe sub_…, an Alipay agreement_no).")
    provider = ProviderSerializer()
    generation = serializers.IntegerField(help_text="Never decreases; a holder of a higher one keeps it.")
    profile = serializers.ChoiceField(choices=list(PROFILES))
    capabilities = CapabilitiesSerializer()
    reason = serializers.CharField(allow_blank=True)
    issued_at = serializers.DateTimeField()


class CycleSerializer(serializers.ModelSerializer):
    subscription = serializers.CharField(source="subscription.provider_subscription_id")
    invoice = serializers.CharField(source="invoice.provider_invoice_id")
    invoice_status = serializers.CharField(source="invoice.status")
    policy = serializers.CharField(source="policy.identity")
    unknown_owner = serializers.CharField(source="unknown_owner.get_username", allow_null=True, default=None)

    class Meta:
        model = DunningCycle
        fields = [
            "id", "cycle_id", "subscription", "invoice", "invoice_status", "amount", "currency", "policy", "state",
            "generation", "failure_class", "decline_code", "customer_action_required", "retry_budget_used",
            "next_attempt_at", "grace_started_at", "grace_expires_at", "restricted_at", "cancel_requested_at",
            "settled_at", "exception_expires_at", "exception_owner", "exception_reason", "exception_ticket",
            "exception_profile", "conflict_reason", "unknown_owner", "unknown_since", "opened_at",
        ]
        read_only_fields = fields


class VerdictSerializer(serializers.Serializer):
    status = serializers.CharField()
    blockers = serializers.ListField(child=serializers.DictField())


class ContractSerializer(serializers.Serializer):
    """The contract line: the provider subscription as last fetched, and what access it allows."""

    status = serializers.CharField(help_text="The provider's status as last fetched.")
    phase = serializers.CharField(help_text="The state access was decided on; an ended contract reads canceled.")
    price_id = serializers.CharField()
    billing_interval = serializers.CharField()
    cancel_at_period_end = serializers.BooleanField()
    current_period_end = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    paused = serializers.CharField(allow_blank=True, help_text="The pause behaviour; empty when not paused.")
    pause_resumes_at = serializers.DateTimeField(allow_null=True)
    trial_end = serializers.DateTimeField(allow_null=True)
    revision = serializers.IntegerField()
    provider_cancellation = serializers.ChoiceField(
        choices=["requested", "confirmed"], allow_null=True,
        help_text="A dunning cancellation carried to the provider: requested until the provider confirms it.")


class SubscriptionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    provider = serializers.CharField(help_text='The provider\'s name: "stripe", "alipay".')
    provider_label = serializers.CharField(help_text='How people read the provider: "Stripe", "Alipay".')
    provider_account = serializers.CharField()
    provider_subscription_id = serializers.CharField()
    provider_status = serializers.CharField()
    cohort = serializers.CharField()
    policy = serializers.CharField()
    outstanding_cycle_root = serializers.CharField()
    entitlement_profile = serializers.CharField()
    entitlement_generation = serializers.IntegerField()
    blocking_cycles = CycleSerializer(many=True)
    verdict = VerdictSerializer(allow_null=True)
    contract = ContractSerializer()


class TransitionSerializer(serializers.ModelSerializer):
    cycle_id = serializers.UUIDField(source="cycle.cycle_id", allow_null=True, default=None)

    class Meta:
        model = TransitionReceipt
        fields = [
            "id", "cycle_id", "edge", "accepted", "from_state", "to_state", "rejection_reason", "detail",
            "cause_kind", "cause_ref", "actor", "reason", "ticket", "cycle_generation", "root_before", "root_after",
            "decision_profile", "entitlement_generation", "trusted_time",
        ]
        read_only_fields = fields


class PolicySerializer(serializers.ModelSerializer):
    provider = serializers.SerializerMethodField()

    class Meta:
        model = DunningPolicy
        fields = ["id", "identity", "name", "version", "cohort", "is_default", "mode", "retry_authority", "prices",
                  "digest", "published_at", "document", "provider"]
        read_only_fields = fields

    @extend_schema_field(ProviderSerializer)
    def get_provider(self, policy: DunningPolicy) -> dict[str, str]:
        """The provider (and account) the policy binds subscriptions of."""
        return provider_summary(*policy_provider(policy))


class TransitionResultSerializer(serializers.Serializer):
    accepted = serializers.BooleanField()
    edge = serializers.CharField()
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    cycle_generation = serializers.IntegerField(allow_null=True)
    profile = serializers.CharField()
    entitlement_generation = serializers.IntegerField(allow_null=True)
    snapshot_issued = serializers.BooleanField()
    receipt_id = serializers.IntegerField(allow_null=True)


class RetryResultSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["PAID", "DECLINED", "UNKNOWN"])
    detail = serializers.CharField(allow_blank=True)
    code = serializers.CharField(allow_blank=True)


class PolicyPublishResultSerializer(serializers.Serializer):
    created = serializers.BooleanField(help_text="False when the identical document was already published.")
    policy = PolicySerializer()


# --- inputs ----------------------------------------------------------------------------------------


class _NoExtraFields(serializers.Serializer):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class ExceptionGrantSerializer(_NoExtraFields):
    expires_at = serializers.DateTimeField(help_text="When the exception ends; bounded by the policy.")
    reason = serializers.CharField(max_length=2000, help_text="Why (audited).")
    ticket = serializers.CharField(max_length=128, help_text="Support ticket reference (audited).")
    profile = serializers.ChoiceField(choices=list(PROFILES), required=False,
                                      help_text="Profile while the exception runs; default FULL.")
    owner = serializers.CharField(max_length=150, required=False, help_text="Default: the acting user.")


class RetryRequestSerializer(_NoExtraFields):
    reason = serializers.CharField(max_length=2000, help_text="Why support retries now (audited).")
    ticket = serializers.CharField(max_length=128, help_text="Support ticket reference (audited).")


class PolicyPublishSerializer(_NoExtraFields):
    text = serializers.CharField(max_length=200_000, trim_whitespace=False,
                                 help_text="The policy document, YAML or JSON (subscription.dunningPolicy.v1).")


# --- operations: held provider events and alerts (issue 15) ----------------------------------------


class ProviderEventSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    event_id = serializers.CharField(help_text="The provider's event id (evt_…).")
    event_type = serializers.CharField()
    outcome = serializers.CharField(help_text="What processing decided, as it stands now.")
    outcome_detail = serializers.CharField(allow_blank=True, help_text="Why (for a held event: why it was held).")
    held = serializers.BooleanField(help_text="QUARANTINED or UNATTRIBUTABLE: it changed nobody's access.")
    subscription = serializers.CharField(source="subscription.provider_subscription_id", allow_null=True,
                                         default=None)
    invoice = serializers.CharField(source="invoice.provider_invoice_id", allow_null=True, default=None)
    received_at = serializers.DateTimeField()
    processed_at = serializers.DateTimeField(allow_null=True)


class EventReprocessingSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    actor = serializers.CharField(help_text="Who asked.")
    reason = serializers.CharField()
    ticket = serializers.CharField()
    requested_at = serializers.DateTimeField()
    previous_outcome = serializers.CharField(help_text="The outcome the event held before (kept on record).")
    previous_detail = serializers.CharField(allow_blank=True)
    previous_processed_at = serializers.DateTimeField(allow_null=True)
    status = serializers.ChoiceField(choices=["STARTED", "DONE", "PROVIDER_UNAVAILABLE", "FAILED", "ABANDONED"])
    new_outcome = serializers.CharField(allow_blank=True)
    new_detail = serializers.CharField(allow_blank=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class EventReprocessResultSerializer(serializers.Serializer):
    still_held = serializers.BooleanField(help_text="True when the fresh fetch held the event again.")
    summary = serializers.CharField(help_text="What happened, in plain words.")
    event = ProviderEventSerializer()
    reprocessing = EventReprocessingSerializer(help_text="The audit row of this request (before and after).")


class AlertActionSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["ACKNOWLEDGE", "RESOLVE"])
    actor = serializers.CharField(help_text='A username, or "job:<name>" when a job saw the condition clear.')
    note = serializers.CharField(allow_blank=True)
    previous_owner = serializers.CharField(allow_blank=True)
    at = serializers.DateTimeField()


class AlertSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    title = serializers.CharField(source="get_kind_display")
    detail = serializers.CharField()
    figures = serializers.DictField()
    subscription = serializers.CharField(source="subscription.provider_subscription_id", allow_null=True,
                                         default=None)
    invoice = serializers.CharField(source="invoice.provider_invoice_id", allow_null=True, default=None)
    raised_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    occurrences = serializers.IntegerField()
    open = serializers.SerializerMethodField()
    needs_a_person = serializers.BooleanField(
        help_text="Only a person resolves this kind (duplicate charge, failure-rate spike, reconciliation "
                  "mismatch); the others are also resolved by the job when the condition clears.")
    owner = serializers.CharField(source="owner.get_username", allow_null=True, default=None)
    acknowledged_at = serializers.DateTimeField(allow_null=True)
    resolved_at = serializers.DateTimeField(allow_null=True)
    resolved_by = serializers.CharField(allow_blank=True)
    resolution_note = serializers.CharField(allow_blank=True)
    actions = AlertActionSerializer(many=True, source="actions.all", help_text="The audit trail, oldest first.")

    def get_open(self, alert: Any) -> bool:
        return alert.resolved_at is None


class AlertAcknowledgeSerializer(_NoExtraFields):
    note = serializers.CharField(max_length=4000, required=False, allow_blank=True,
                                 help_text="Optional: what you are about to do (audited).")


class AlertResolveSerializer(_NoExtraFields):
    note = serializers.CharField(max_length=4000, help_text="What was done (required, audited).")


class EventReprocessRequestSerializer(_NoExtraFields):
    reason = serializers.CharField(max_length=2000, help_text="Why the event is fetched again (audited).")
    ticket = serializers.CharField(max_length=128, help_text="Support ticket reference (audited).")
