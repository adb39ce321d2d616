"""Input and output shapes of the usage-record endpoints (issue 19 item 4)."""

from __future__ import annotations

from rest_framework import serializers

from subscriptions.models import UsageMetric, UsageRecord

_MAX_BIGINT = 2**63 - 1


class UsageRecordRequestSerializer(serializers.Serializer):
    producer_record_id = serializers.CharField(
        max_length=255, trim_whitespace=False,
        help_text="Your own id for this record. With your token it is the idempotency key: sending it again with "
                  "the same body answers the stored record (200); with a different body, 422.")
    subscription = serializers.CharField(max_length=255, help_text="Local subscription id or the provider's (sub_…).")
    metric = serializers.ChoiceField(choices=UsageMetric.choices)
    quantity = serializers.IntegerField(min_value=1, max_value=_MAX_BIGINT, help_text="How many tokens or calls.")
    cost = serializers.IntegerField(min_value=0, max_value=_MAX_BIGINT,
                                    help_text="What the usage costs, in minor units (cents) of `currency`.")
    currency = serializers.RegexField(r"^[A-Za-z]{3}$", help_text="ISO 4217, the subscription's billing currency.")
    occurred_at = serializers.DateTimeField(help_text="When the usage happened; not in the future.")


class UsageRecordSerializer(serializers.ModelSerializer):
    producer = serializers.CharField(source="producer.name", help_text="The API client that reported it.")
    subscription = serializers.IntegerField(source="subscription_id")
    provider_subscription_id = serializers.CharField(source="subscription.provider_subscription_id")
    invoiced = serializers.SerializerMethodField()

    class Meta:
        model = UsageRecord
        fields = ["id", "producer", "producer_record_id", "subscription", "provider_subscription_id", "metric",
                  "quantity", "cost", "currency", "occurred_at", "received_at", "body_digest", "invoiced",
                  "invoiced_at", "provider_invoice_id"]
        read_only_fields = fields

    def get_invoiced(self, record: UsageRecord) -> bool:
        return record.invoiced_at is not None


class UsageMetricTotalSerializer(serializers.Serializer):
    metric = serializers.CharField()
    records = serializers.IntegerField()
    quantity = serializers.IntegerField()
    cost = serializers.IntegerField()
    uninvoiced_quantity = serializers.IntegerField()
    uninvoiced_cost = serializers.IntegerField()
    invoiced_quantity = serializers.IntegerField()
    invoiced_cost = serializers.IntegerField()


class UsageExportRecordSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    producer = serializers.CharField()
    producer_record_id = serializers.CharField()
    metric = serializers.CharField()
    quantity = serializers.IntegerField()
    cost = serializers.IntegerField()
    currency = serializers.CharField()
    occurred_at = serializers.DateTimeField()
    received_at = serializers.DateTimeField()
    invoiced_at = serializers.DateTimeField(allow_null=True)
    provider_invoice_id = serializers.CharField(allow_blank=True)
    body_digest = serializers.CharField()


class UsageExportSerializer(serializers.Serializer):
    subscription = serializers.IntegerField()
    provider_subscription_id = serializers.CharField()
    entitlement_profile = serializers.CharField(help_text="Shown for context: export works in every profile.")
    exported_at = serializers.DateTimeField()
    currency = serializers.CharField(allow_blank=True)
    totals = UsageMetricTotalSerializer(many=True)
    records = UsageExportRecordSerializer(many=True)


BATCH_MAX_RECORDS = 500


class UsageBatchRequestSerializer(serializers.Serializer):
    records = UsageRecordRequestSerializer(many=True, allow_empty=False, max_length=BATCH_MAX_RECORDS)


class UsageBatchItemSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Position of the record in the request.")
    status = serializers.ChoiceField(choices=[201, 200, 422],
                                     help_text="201 recorded; 200 already recorded, identical; 422 the id was "
                                               "recorded with a different body (nothing changed).")
    record = UsageRecordSerializer(allow_null=True, help_text="The stored record (null for a conflict).")
    detail = serializers.CharField(allow_blank=True)


class UsageBatchResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    replayed = serializers.IntegerField()
    conflicts = serializers.IntegerField()
    results = UsageBatchItemSerializer(many=True)
