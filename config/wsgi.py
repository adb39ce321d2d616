import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from config.startup_heap import freeze_startup_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()
# The URLconf (and with it every view module) is imported on the first request otherwise: load it
# now, so it is part of the heap that is frozen (config/startup_heap.py).
get_resolver().url_patterns  # noqa: B018
freeze_startup_heap()
