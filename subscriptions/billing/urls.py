"""Customer billing page routes, under billing/."""

from django.contrib.auth import views as auth_views
from django.urls import path

from subscriptions.billing import views

urlpatterns = [
    path("billing/", views.billing_home, name="billing-home"),
    path("billing/<int:pk>/", views.subscription_page, name="billing-subscription"),
    path("billing/<int:pk>/usage.csv", views.usage_export, name="billing-usage-export"),
    path("billing/<int:pk>/invoices/<int:cycle_pk>/retry/", views.retry_now, name="billing-retry-now"),
    path("billing/<int:pk>/invoices/<int:cycle_pk>/pay/", views.pay_now, name="billing-pay-now"),
    path("billing/login/", auth_views.LoginView.as_view(template_name="registration/login.html",
                                                        redirect_authenticated_user=True), name="billing-login"),
    path("billing/logout/", auth_views.LogoutView.as_view(next_page="billing-login"), name="billing-logout"),
]
