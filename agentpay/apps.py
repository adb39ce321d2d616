from django.apps import AppConfig


class AgentPayConfig(AppConfig):
    name = "agentpay"
    verbose_name = "AgentPay (pay-per-call gateway)"
    default_auto_field = "django.db.models.BigAutoField"
