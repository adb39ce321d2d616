"""Run AgentPay's scheduled jobs once: all of them, or one with --job."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from agentpay.jobs import JOBS, agentpay_job_run


class Command(BaseCommand):
    help = "Run AgentPay's scheduled jobs once (challenge expiry, fulfillment status query, recovery deadline)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--job", action="append", choices=list(JOBS), help="job name (repeatable); default: all")
        parser.add_argument("--now", help="time to act at (ISO-8601 with offset); never ahead of the trusted clock")

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        now = None
        if options["now"]:
            now = parse_datetime(options["now"])
            if now is None or now.tzinfo is None:
                raise CommandError("--now must be ISO-8601 with a UTC offset, e.g. 2026-12-01T09:00:00Z")
        failed = False
        for name in options["job"] or list(JOBS):
            run = agentpay_job_run(name, now=now)
            self.stdout.write(f"{name}: examined {run.examined}, changed {run.changed}, refused {run.refused}, "
                              f"errors {run.errors}")
            for note in run.notes[:50]:
                self.stdout.write(f"  {note}")
            failed = failed or bool(run.errors)
        if failed:
            raise SystemExit(1)
