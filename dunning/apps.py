from django.apps import AppConfig


class DunningConfig(AppConfig):
    name = "dunning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The job modules import models, so they load once the app registry is ready.
        from dunning.jobs import catalog  # noqa: F401
