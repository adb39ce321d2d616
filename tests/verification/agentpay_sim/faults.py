"""Crashes between steps: the process dies right after a step committed, before its effect.

The real services run unchanged; the patches below only wrap the functions the gateway, the
wallet flow and the jobs call, run the real one, and then — when a crash is armed for that point
in this thread — raise `Crash`. `Crash` is a BaseException, so neither DRF nor Django turns it
into an answer: the request log stays unanswered and the processing lease is not released, as
when a worker is killed (the view's `finally` is made to skip the release for a crashed request).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from agentpay import jobs
from agentpay.api import views
from agentpay.services import recovery, wallet_flow


class Crash(BaseException):  # noqa: N818 — a kill, not an error
    """The simulated process died here."""


class Faults:
    def __init__(self) -> None:
        self._local = threading.local()
        self.crashes: list[str] = []

    def arm(self, point: str) -> None:
        self._local.armed = point

    def disarm(self) -> str:
        point, self._local.armed = getattr(self._local, "armed", ""), ""
        return point

    @property
    def crashed(self) -> bool:
        return getattr(self._local, "crashed", False)

    def reset_thread(self) -> None:
        self._local.crashed = False

    def hit(self, point: str) -> None:
        if getattr(self._local, "armed", "") == point:
            self._local.armed = ""
            self._local.crashed = True
            self.crashes.append(point)
            raise Crash(point)

    def _after_accept(self, real: Callable[..., Any], *, job: bool = False) -> Callable[..., Any]:
        def accept(*args: Any, **kwargs: Any) -> Any:
            outcome = real(*args, **kwargs)
            if outcome.accepted:
                steps = kwargs.get("steps") or []
                if job:
                    self.hit("job_accept")
                for step in steps:
                    self.hit(f"{step.line}.{step.event}")
                if any(s.line == "fulfillment" and s.event.startswith("upstream_") for s in steps):
                    self.hit("answer")
            return outcome

        return accept

    def _after_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """The gateway's intent_open: its steps on open (the wallet's authorize + hold, the chain's
        challenge) are accepted in the open's transaction, so a crash after one is a crash after it."""
        def open_(*args: Any, **kwargs: Any) -> Any:
            opened = real(*args, **kwargs)
            if opened.created and opened.intent.generation == 1:  # the steps were taken on open
                for step in kwargs.get("steps") or []:
                    self.hit(f"{step.line}.{step.event}")
            return opened

        return open_

    def _after(self, real: Callable[..., Any], point: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            self.hit(point)
            return result

        return call

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:

        real_release = views.intent_release_lease

        def release(**kwargs: Any) -> None:
            if not self.crashed:
                real_release(**kwargs)

        with contextlib.ExitStack() as stack:
            for target, name, wrapper in (
                (wallet_flow, "intent_accept", self._after_accept(wallet_flow.intent_accept)),
                (wallet_flow, "upstream_forward", self._after(wallet_flow.upstream_forward, "forward")),
                (recovery, "intent_accept", self._after_accept(recovery.intent_accept, job=True)),
                (recovery, "upstream_status_query", self._after(recovery.upstream_status_query, "status_query")),
                (jobs, "intent_accept", self._after_accept(jobs.intent_accept, job=True)),
                (views, "intent_open", self._after_open(views.intent_open)),
                (views, "intent_release_lease", release),
            ):
                stack.enter_context(mock.patch.object(target, name, wrapper))
            yield
