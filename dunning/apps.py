from django.apps import AppConfig


class DunningConfig(AppConfig):
    name = "dunning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # These modules import models, so they load once the app registry is ready. The job
        # modules register the scheduled jobs; the webhook intake hands stored events to the
        # worker task, which it cannot import itself (the task runs the processing service).
        from dunning.actions.alert_delivery import alert_delivery_worker_set
        from dunning.evidence.intake import event_worker_set
        from dunning.jobs import catalog  # noqa: F401
        from dunning.tasks import deliver_alert, process_provider_event

        event_worker_set(process_provider_event)
        alert_delivery_worker_set(deliver_alert)
