from django.apps import AppConfig


class DunningConfig(AppConfig):
    name = "dunning"
    default_auto_field = "django.db.models.BigAutoField"
