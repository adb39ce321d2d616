import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("dunning")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Every job of SPEC §10 on the beat schedule; `manage.py run_jobs` runs the same jobs once.
from agentpay.schedule import beat_schedule as agentpay_beat_schedule  # noqa: E402
from dunning.jobs.schedule import beat_schedule  # noqa: E402

app.conf.beat_schedule = {**beat_schedule(), **agentpay_beat_schedule()}
