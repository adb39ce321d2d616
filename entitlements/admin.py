from django.contrib import admin, messages

from dunning.admin.base import ViewOnlyAdmin
from entitlements.api.tokens import service_token_revoke
from entitlements.models import (
    EntitlementDelivery,
    EntitlementSnapshot,
    EntitlementSubscriber,
    IdempotencyRecord,
    ServiceToken,
)


@admin.register(EntitlementSnapshot)
class EntitlementSnapshotAdmin(ViewOnlyAdmin):
    list_display = ("subscription", "generation", "profile", "reason", "issued_at")
    list_filter = ("profile",)
    list_select_related = ("subscription",)
    search_fields = ("subscription__provider_subscription_id",)
    show_full_result_count = False


@admin.register(ServiceToken)
class ServiceTokenAdmin(ViewOnlyAdmin):
    """Tokens are created with `manage.py create_service_token` (shown once); here they are
    listed and revoked."""

    list_display = ("name", "prefix", "scopes", "provider_account", "cohort", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix")
    exclude = ("token_hash",)
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        revoked = sum(service_token_revoke(token=token) for token in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)

    def has_revoke_permission(self, request) -> bool:
        return request.user.is_superuser


@admin.register(EntitlementSubscriber)
class EntitlementSubscriberAdmin(admin.ModelAdmin):
    list_display = ("name", "url", "cohort", "active", "created_at")
    list_filter = ("active",)


@admin.register(EntitlementDelivery)
class EntitlementDeliveryAdmin(ViewOnlyAdmin):
    list_display = ("message", "subscriber", "status", "attempts", "last_status_code", "next_attempt_at",
                    "delivered_at")
    list_filter = ("status", "subscriber")
    list_select_related = ("message", "subscriber")
    show_full_result_count = False


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ViewOnlyAdmin):
    list_display = ("principal", "key", "state", "response_status", "created_at", "expires_at")
    list_filter = ("state",)
    search_fields = ("principal", "key")
    show_full_result_count = False
