from django.apps import AppConfig


class EntitlementsConfig(AppConfig):
    name = "entitlements"
    default_auto_field = "django.db.models.BigAutoField"
