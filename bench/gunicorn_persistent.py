"""Gunicorn config for the bench's informational webhook variant: persistent database
connections (CONN_MAX_AGE=60) in each worker, i.e. what the proposed settings change would do.
The judged webhook figure runs without this file, on the product's settings as they are."""


def post_worker_init(worker):  # noqa: ANN001, ANN201 - gunicorn hook signature
    from django.conf import settings
    from django.db import connections

    settings.DATABASES["default"]["CONN_MAX_AGE"] = 60
    settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    connections["default"].settings_dict["CONN_MAX_AGE"] = 60
    connections["default"].settings_dict["CONN_HEALTH_CHECKS"] = True
