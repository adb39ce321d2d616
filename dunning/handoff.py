"""A Celery task a service hands stored rows to after commit.

The tasks module sits above the services (a task runs a service), so a service cannot import its
task; DunningConfig.ready names it here instead. The row is already safe when the hand-off
happens, so a broker that is down loses nothing: the hand-off logs and a sweeping job (named in
`fallback`) finds the row on its next run.

On a Redis broker the hand-off is one LPUSH of the message `task.delay(pk)` would send (Celery's
task protocol 2 in kombu's Redis envelope, built here). `delay` costs about 1.2 ms of CPU per call in
Celery and kombu (producer pool, routing, serialisation, publish retries) against under 0.1 ms for
the push itself, and the webhook intake hands off on every delivery. The worker receives exactly what
`delay` would have sent (tests/evidence/test_handoff.py compares the two messages); anything else
(eager mode, another transport, a key prefix, a route that is not the queue's own name) goes through
`delay`.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from celery.utils.nodenames import anon_nodename

log = logging.getLogger(__name__)


class TaskHandoff:
    def __init__(self, what: str, fallback: str) -> None:
        self.what = what
        self.fallback = fallback
        self.task: Any = None

    def set(self, task: Any) -> None:
        self.task = task

    def enqueue(self, pk: int) -> None:
        try:
            if self.task is None:
                raise RuntimeError(f"no {self.what} task registered (DunningConfig.ready sets it)")
            push = redis_push(self.task)
            if push is None:
                self.task.delay(pk)
            else:
                push.send(pk)
        except Exception:
            log.exception("%s %s stored but not handed to a worker; %s", self.what, pk, self.fallback)


@dataclass(frozen=True)
class RedisPush:
    """Sends `task.delay(pk)` as one LPUSH onto the list kombu's Redis transport keeps the task's
    queue in, with the headers, body and properties Celery 5.7 gives a task with no options."""

    client: redis.Redis
    task_name: str
    queue: str
    reply_to: str

    def send(self, pk: int) -> None:
        self.client.lpush(self.queue, json.dumps(self.message(pk)))

    def message(self, pk: int) -> dict[str, Any]:
        task_id = str(uuid.uuid4())
        body = json.dumps([[pk], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        headers = {
            "lang": "py", "task": self.task_name, "id": task_id, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
            "parent_id": None, "argsrepr": f"({pk!r},)", "kwargsrepr": "{}", "origin": anon_nodename(),
            "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        }
        properties = {
            "correlation_id": task_id, "reply_to": self.reply_to, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": self.queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        }
        return {"body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
                "content-type": "application/json", "headers": headers, "properties": properties}


# One client (and its connection pool, which redis-py renews after a fork) per broker URL and task.
_PUSHES: dict[tuple[str, str], RedisPush | None] = {}


def redis_push(task: Any) -> RedisPush | None:
    """The direct push for `task`, or None when `delay` must send it (eager mode, a broker other
    than plain Redis, options that would change where or how kombu writes the message, or no
    Celery app behind it)."""
    app = getattr(task, "app", None)
    if app is None or app.conf.task_always_eager:
        return None  # not a Celery task (a stand-in with its own delay), or one run in process
    conf = app.conf
    key = (str(conf.broker_url), task.name)
    if key not in _PUSHES:
        _PUSHES[key] = _direct_push(task)
    return _PUSHES[key]


def _direct_push(task: Any) -> RedisPush | None:
    conf = task.app.conf
    url = str(conf.broker_url)
    if not url.startswith("redis://") or (conf.broker_transport_options or {}).get("global_keyprefix"):
        return None
    if task.ignore_result or task.priority is not None or conf.task_default_priority is not None:
        return None  # headers or properties this message does not carry
    route = task.app.amqp.router.route({}, task.name, (), {})
    queue = route.get("queue")
    if set(route) != {"queue"} or queue is None or getattr(queue.exchange, "type", "") != "direct":
        return None
    # Celery sends to a direct exchange's queue through the anonymous exchange, routing key = queue
    # name, and kombu's Redis transport keeps that queue as a list under the same name.
    timeout = float(conf.broker_connection_timeout or 4.0)
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    return RedisPush(client=client, task_name=task.name, queue=queue.name, reply_to=task.app.thread_oid)
