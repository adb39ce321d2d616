"""A server process's startup heap is frozen out of the garbage collector (config/startup_heap.py):
the WSGI application once loaded, and a Celery worker once ready, in its own process and in each
prefork pool process. Each runs in a fresh interpreter, as the server would start it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from config.startup_heap import ENV

REPORT = "import gc, json, sys; print(json.dumps({'frozen': gc.get_freeze_count(), 'walked': len(gc.get_objects()), "\
         "'urls': 'config.urls' in sys.modules, 'views': 'agentpay.api.views' in sys.modules}))"


def _fresh_interpreter(code: str, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != ENV}
    environment.update(env)
    environment.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    done = subprocess.run([sys.executable, "-c", f"{code}\n{REPORT}"], env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_wsgi_application_loads_its_views_and_freezes_what_it_loaded():
    loaded = _fresh_interpreter("import config.wsgi")
    assert loaded["urls"] and loaded["views"], "the URLconf is loaded before the freeze, not on the first request"
    assert loaded["frozen"] > 50_000
    # A full collection walks what is not frozen: a small part of the loaded heap.
    assert loaded["walked"] < loaded["frozen"] / 10


def test_switched_off_nothing_is_frozen():
    loaded = _fresh_interpreter("import config.wsgi", **{ENV: "0"})
    assert loaded["frozen"] == 0
    assert loaded["walked"] > 50_000


@pytest.mark.parametrize("signal", ["worker_ready", "worker_process_init"])
def test_a_celery_worker_freezes_its_heap_when_ready_and_in_each_pool_process(signal):
    started = _fresh_interpreter(
        "import django; django.setup()\n"
        "import gc; from config.celery import app; app.loader.import_default_modules()\n"
        "assert gc.get_freeze_count() == 0\n"
        f"from celery import signals; signals.{signal}.send(sender=None)")
    assert started["frozen"] > 50_000


def test_loading_the_wsgi_application_opens_no_connection_and_starts_no_thread():
    """The README runs gunicorn with --preload: the master loads config.wsgi, then forks the workers.
    A socket (a database or Redis connection) or a thread made while loading would be shared by every
    worker or lost in them; there must be none. Checked with the database and Redis reachable."""
    code = ("import os, threading\n"
            "import config.wsgi\n"
            "fds = []\n"
            "for fd in os.listdir('/proc/self/fd'):\n"
            "    try: fds.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
            "    except OSError: pass\n"
            "from django.db import connections\n"
            "print(__import__('json').dumps({'sockets': [f for f in fds if f.startswith('socket:')],\n"
            "    'threads': [t.name for t in threading.enumerate() if t is not threading.main_thread()],\n"
            "    'open_connections': [c.alias for c in connections.all() if c.connection is not None]}))\n")
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"sockets": [], "threads": [], "open_connections": []}
