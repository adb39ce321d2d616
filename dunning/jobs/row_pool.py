"""A sweep's rows worked on several threads of one worker, so the provider's latency overlaps
(issue 21): a fresh fetch is 100–500 ms of waiting on Stripe against a few ms of our own work.

Threads, not gevent or the SDK's async client: everything between two fetches (the reads, the
acceptance service, the receipts) is synchronous Django, and Django gives each thread its own
database connection, so each thread's acceptances are ordinary transactions on their own session
with the compare-and-set still the last word. gevent would need the PostgreSQL driver patched for
cooperative I/O and the whole worker monkey-patched; the async client would leave the ORM work
synchronous between awaits. The GIL costs nothing here: the threads mostly wait on the network.

The calling thread keeps today's order and claims: it walks the due rows in (due, pk) order and
takes each row's claim (the session advisory lock of dunning.claims) on its own connection before
handing the row to a thread, and it releases the claim once that row's work is done. So rows are
claimed in due order exactly as before, a row another worker holds is skipped as before, and no
row is handed out twice; only completion interleaves. At most `window` rows are in flight, so
memory does not grow with the sweep. Each row's work counts into a JobReport of its own, merged
into the run's by the calling thread, so the counters and notes stay exact. Every thread closes its
connection when the pool ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from types import TracebackType

from django.db import connection, connections

from dunning.claims import claim_release, claim_try
from dunning.jobs.framework import JobReport, job_setting

RowWork = Callable[[JobReport, int], None]
_STOP = -1  # no row has a negative primary key


def provider_io_threads() -> int:
    """How many rows a worker works on at once (settings.DUNNING_PROVIDER_IO_THREADS). One when the
    job runs inside a transaction (its threads would not see the caller's uncommitted rows) or on
    SQLite (one writer: threads would only wait on its lock)."""
    if connection.in_atomic_block or connection.vendor != "postgresql":
        return 1
    return max(1, int(job_setting("DUNNING_PROVIDER_IO_THREADS", 1)))


def claimed_in_threads(run: JobReport, pks: Iterable[int], claim_name: str, work: RowWork, *,
                       threads: int) -> None:
    """Claim each of `pks` in order (counting it examined, ticking the progress) and run
    `work(part, pk)` on one of `threads` threads while the claim is held; a row already claimed
    elsewhere is skipped. An exception raised by a row's work stops the sweep: the rows in flight
    finish, their claims are released, and it is raised here."""
    with _RowPool(run, claim_name, work, threads=threads) as pool:
        for pk in pks:
            run.examined += 1
            run.tick()
            if claim_try(claim_name, pk):
                pool.submit(pk)


class _RowPool:
    def __init__(self, run: JobReport, claim_name: str, work: RowWork, *, threads: int) -> None:
        self.run, self.claim_name, self.work = run, claim_name, work
        self.window = 2 * threads  # each thread has its next row waiting when it finishes one
        self.todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[tuple[int, JobReport, BaseException | None]] = queue.SimpleQueue()
        self.in_flight = 0
        self.failed: BaseException | None = None
        self.threads = [threading.Thread(target=self._serve, name=f"{run.job}-io-{i}", daemon=True)
                        for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def __enter__(self) -> _RowPool:
        return self

    def submit(self, pk: int) -> None:
        """Hand a claimed row to a thread, first waiting (and merging) while the window is full."""
        while self.in_flight >= self.window or not self.done.empty():
            self._collect_one()
        if self.failed is not None:
            claim_release(self.claim_name, pk)
            raise self.failed
        self.in_flight += 1
        self.todo.put(pk)

    def _collect_one(self) -> None:
        pk, part, exc = self.done.get()
        self.in_flight -= 1
        claim_release(self.claim_name, pk)
        self.run.absorb(part)
        if exc is not None and self.failed is None:
            self.failed = exc

    def _serve(self) -> None:
        try:
            while (pk := self.todo.get()) != _STOP:
                part = JobReport(job=self.run.job, now=self.run.now)
                try:
                    self.work(part, pk)
                except BaseException as exc:  # handed to the calling thread, which raises it
                    self.done.put((pk, part, exc))
                else:
                    self.done.put((pk, part, None))
        finally:
            connections.close_all()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        while self.in_flight:
            self._collect_one()
        for _ in self.threads:
            self.todo.put(_STOP)
        for thread in self.threads:
            thread.join()
        if exc is None and self.failed is not None:
            raise self.failed
