from django.apps import AppConfig

from dunning.history_descriptor import cache_history_manager_classes
from dunning.psycopg_cache import widen_statement_cache
from dunning.psycopg_ints import register_range_checked_ints


class DunningConfig(AppConfig):
    name = "dunning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Both before the first statement of any process that loads the app (Django copies the
        # global adapters into its template once, at its first connection).
        widen_statement_cache()
        register_range_checked_ints()
        cache_history_manager_classes()
        # These modules import models, so they load once the app registry is ready. The job
        # modules register the scheduled jobs; the webhook intake hands stored events to the
        # worker task, which it cannot import itself (the task runs the processing service).
        from dunning.actions.alert_delivery import alert_delivery_worker_set
        from dunning.evidence.intake import event_worker_set
        from dunning.jobs import catalog  # noqa: F401
        from dunning.tasks import deliver_alert, process_provider_event

        event_worker_set(process_provider_event)
        alert_delivery_worker_set(deliver_alert)
