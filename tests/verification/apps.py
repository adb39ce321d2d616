from django.apps import AppConfig


class VerificationConfig(AppConfig):
    """Installed only in a checkout (config/settings.py): it carries `manage.py simulate` and `load_demo`."""

    name = "tests.verification"
    label = "verification"
