"""manage.py dunning_gates — the release gates of SPEC §15, measured from the database.

Exit status 0 when every gate passes, 1 when any fails. `--json` prints the report as JSON
(and nothing else on stdout); `--now` evaluates the time-relative rules at another instant.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dunning.gates import GATE_DEFINITIONS, GatesReport, gates_evaluate


def _parse_now(text: str) -> datetime:
    value = parse_datetime(text)
    if value is None:
        raise CommandError(f"--now {text!r} is not an ISO 8601 date-time (e.g. 2026-01-31T12:00:00Z)")
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_current_timezone())
    return value


class Command(BaseCommand):
    help = ("Print the release gates (SPEC §15) computed from the database. Exit status 0 when all pass, "
            "1 when any fails.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="Print the report as JSON instead of a table.")
        parser.add_argument("--now", metavar="ISO-TIME",
                            help="Clock for the time-relative rules (default: the trusted clock).")
        parser.add_argument("--definitions", action="store_true",
                            help="Print each gate's exact definition after the table.")

    def handle(self, *args, as_json: bool = False, now: str | None = None, definitions: bool = False, **options):
        report = gates_evaluate(now=_parse_now(now) if now else None)
        if as_json:
            self.stdout.write(_dumps(report))
        else:
            self._table(report, definitions=definitions)
        if not report.passed:
            failed = ", ".join(g.key for g in report.failed)
            raise CommandError(f"{len(report.failed)} release gate(s) failed: {failed}", returncode=1)

    def _table(self, report: GatesReport, *, definitions: bool) -> None:
        rows = [(g.name, g.display, g.threshold, "PASS" if g.passed else "FAIL") for g in report.gates]
        headers = ("Gate", "Figure", "Target", "Result")
        widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) for i in range(4)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        self.stdout.write(f"Release gates (SPEC §15), evaluated at {report.evaluated_at.isoformat()}")
        self.stdout.write(line.format(*headers))
        self.stdout.write(line.format(*("-" * w for w in widths)))
        for gate, row in zip(report.gates, rows, strict=True):
            text = line.format(*row)
            self.stdout.write(self.style.SUCCESS(text) if gate.passed else self.style.ERROR(text))
            if not gate.passed and gate.detail:
                more = gate.offending - len(gate.detail)
                self.stdout.write(f"    offending: {'; '.join(gate.detail)}" + (f" (+{more} more)" if more > 0 else ""))
        passed = len(report.gates) - len(report.failed)
        overall = f"Overall: {'PASS' if report.passed else 'FAIL'} ({passed}/{len(report.gates)} gates pass)"
        self.stdout.write(self.style.SUCCESS(overall) if report.passed else self.style.ERROR(overall))
        if definitions:
            self.stdout.write("")
            for key, text in GATE_DEFINITIONS.items():
                self.stdout.write(f"- {key}: {text}")


def _dumps(report: GatesReport) -> str:
    return json.dumps(report.as_dict(), indent=2, ensure_ascii=False)
