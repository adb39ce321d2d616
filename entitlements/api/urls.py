"""REST API routes (SPEC §13), included at /api/ by config/urls.py."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from entitlements.api import schema  # noqa: F401  (registers the auth scheme extension)
from entitlements.api.views_read import (
    CycleDetailView,
    CycleTransitionsView,
    SubscriptionDetailView,
    SubscriptionEntitlementView,
)
from entitlements.api.views_usage import (
    SubscriptionUsageExportCsvView,
    SubscriptionUsageExportJsonView,
    SubscriptionUsageListView,
    UsageRecordBatchView,
    UsageRecordCreateView,
)
from entitlements.api.views_write import (
    AlertAcknowledgeView,
    AlertListView,
    AlertResolveView,
    CycleExceptionView,
    CycleRetryView,
    EventReprocessView,
    PolicyListView,
)

app_name = "api"

urlpatterns = [
    path("v1/subscriptions/<str:ref>/entitlement", SubscriptionEntitlementView.as_view(),
         name="subscription-entitlement"),
    path("v1/subscriptions/<str:ref>/usage/", SubscriptionUsageListView.as_view(), name="subscription-usage"),
    path("v1/subscriptions/<str:ref>/usage/export.csv", SubscriptionUsageExportCsvView.as_view(),
         name="subscription-usage-export-csv"),
    path("v1/subscriptions/<str:ref>/usage/export.json", SubscriptionUsageExportJsonView.as_view(),
         name="subscription-usage-export-json"),
    path("v1/usage-records/", UsageRecordCreateView.as_view(), name="usage-records"),
    path("v1/usage-records/batch/", UsageRecordBatchView.as_view(), name="usage-records-batch"),
    path("v1/subscriptions/<str:ref>", SubscriptionDetailView.as_view(), name="subscription-detail"),
    path("v1/cycles/<str:ref>", CycleDetailView.as_view(), name="cycle-detail"),
    path("v1/cycles/<str:ref>/transitions", CycleTransitionsView.as_view(), name="cycle-transitions"),
    path("v1/cycles/<str:ref>/exception", CycleExceptionView.as_view(), name="cycle-exception"),
    path("v1/cycles/<str:ref>/retry", CycleRetryView.as_view(), name="cycle-retry"),
    path("v1/policies", PolicyListView.as_view(), name="policies"),
    path("v1/events/<str:event_id>/reprocess", EventReprocessView.as_view(), name="event-reprocess"),
    path("v1/alerts", AlertListView.as_view(), name="alerts"),
    path("v1/alerts/<str:alert_id>/acknowledge", AlertAcknowledgeView.as_view(), name="alert-acknowledge"),
    path("v1/alerts/<str:alert_id>/resolve", AlertResolveView.as_view(), name="alert-resolve"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
]
