"""Run scheduled jobs once: all of them in catch-up order, or one with --job."""

from __future__ import annotations

from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from dunning.jobs.framework import JOBS, job_run
from dunning.jobs.schedule import CATCH_UP_ORDER


def _parse_now(text: str | None) -> datetime | None:
    if not text:
        return None
    parsed = parse_datetime(text)
    if parsed is None or parsed.tzinfo is None:
        raise CommandError(f"--now must be an ISO-8601 time with a UTC offset, e.g. 2026-12-01T09:00:00Z; got {text!r}")
    return parsed


class Command(BaseCommand):
    help = ("Run the scheduled jobs once (SPEC §10), in catch-up order, or one job with --job. "
            "Each run is recorded as a JobRun. Exit status 1 when a job failed or hit errors.")

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--job", action="append", help="job name (repeatable); default: all in catch-up order")
        parser.add_argument("--now", help="trusted time to evaluate guards at (ISO-8601 with offset); default: now. "
                                          "Fresh receipts are still stamped by the clock, so restriction and "
                                          "cancellation refuse unless --now is within the freshness window")
        parser.add_argument("--list", action="store_true", help="list the jobs and exit")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        if options["list"]:
            for name in CATCH_UP_ORDER:
                self.stdout.write(f"{name:18} {JOBS[name].description}")
            return
        names = options["job"] or list(CATCH_UP_ORDER)
        unknown = [n for n in names if n not in JOBS]
        if unknown:
            raise CommandError(f"unknown job(s) {', '.join(unknown)}; known: {', '.join(CATCH_UP_ORDER)}")
        now = _parse_now(options["now"])
        failed = False
        for name in names:
            self.stdout.write(f"→ {name} …")
            try:
                run = job_run(name, now=now, progress=lambda line: self.stdout.write(f"  {line}"))
            except Exception as exc:  # recorded FAILED on the JobRun
                self.stderr.write(self.style.ERROR(f"  {name} FAILED: {type(exc).__name__}: {exc}"))
                failed = True
                continue
            style = self.style.SUCCESS if run.status == "OK" else self.style.WARNING
            self.stdout.write(style(f"  {name} {run.status}: examined {run.examined}, changed {run.changed}, "
                                    f"refused {run.refused}, errors {run.errors}"))
            failed = failed or run.status != "OK"
        if failed:
            raise SystemExit(1)
