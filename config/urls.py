from django.contrib import admin
from django.urls import include, path

from dunning.web.metrics import metrics_view
from dunning.web.webhooks import provider_webhook

admin.site.site_header = "Dunning & entitlement grace — support console"
admin.site.site_title = "Dunning support"

urlpatterns = [
    path("admin/", admin.site.urls),
    # One route per provider adapter (subscriptions.providers.registry): /webhooks/stripe/, /webhooks/alipay/.
    path("webhooks/<str:provider_name>/", provider_webhook, name="provider-webhook"),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (issue 19 item 2)
    path("api/", include("entitlements.api.urls")),
    path("agentpay/", include("agentpay.api.urls")),
    path("", include("subscriptions.billing.urls")),
]
