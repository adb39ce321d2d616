from django.contrib import admin

from dunning.admin_base import ViewOnlyAdmin
from entitlements.models import EntitlementSnapshot


@admin.register(EntitlementSnapshot)
class EntitlementSnapshotAdmin(ViewOnlyAdmin):
    list_display = ("subscription", "generation", "profile", "reason", "issued_at")
    list_filter = ("profile",)
    list_select_related = ("subscription",)
    search_fields = ("subscription__provider_subscription_id",)
    show_full_result_count = False
