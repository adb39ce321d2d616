"""Scheduled jobs (SPEC §10). Each is a Celery beat task and runnable once with
`manage.py run_jobs`; dunning.jobs.catalog names them all."""
