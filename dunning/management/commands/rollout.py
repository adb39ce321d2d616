"""manage.py rollout status|promote|rollback|rebind|shadow — the rollout of SPEC §15 as a program.

    rollout status [--json]
    rollout promote POLICY COHORT MODE PERCENT --by USER --reason TEXT --ticket REF
    rollout rollback COHORT --by USER --reason TEXT --ticket REF [--pause-restrictions]
    rollout rebind COHORT POLICY --by USER --reason TEXT --ticket REF [--batch N]
    rollout shadow [--all]

POLICY is name@version (or its id). A refusal exits with a CommandError naming its code; nothing
changes. `rebind` prints its progress after every batch.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dunning.management.commands.dunning_gates import _parse_now
from dunning.rollout.errors import RolloutError
from dunning.rollout.promotion import rollout_promote
from dunning.rollout.rebinding import rollout_rebind_forward, rollout_rollback
from dunning.rollout.shadow_report import shadow_report
from dunning.rollout.status import rollout_status


def _decision_arguments(parser: CommandParser) -> None:
    parser.add_argument("--by", required=True, metavar="USERNAME", help="The billing lead deciding.")
    parser.add_argument("--reason", required=True)
    parser.add_argument("--ticket", required=True)
    parser.add_argument("--now", metavar="ISO-TIME", help="Trusted time of the decision (default: now).")


class Command(BaseCommand):
    help = "Show and drive the rollout of dunning policies: status, promote, rollback, rebind, shadow."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser),
                                    metavar="{status,promote,rollback,rebind,shadow}")
        status = sub.add_parser("status", help="Mode, percent and running time per policy and cohort.",
                                called_from_command_line=getattr(parser, "called_from_command_line", None))
        status.add_argument("--json", action="store_true", dest="as_json")
        status.add_argument("--now", metavar="ISO-TIME")
        promote = sub.add_parser("promote", help="Move a policy's cohort to a mode and percentage.",
                                 called_from_command_line=getattr(parser, "called_from_command_line", None))
        promote.add_argument("policy")
        promote.add_argument("cohort")
        promote.add_argument("mode")
        promote.add_argument("percent")
        _decision_arguments(promote)
        rollback = sub.add_parser("rollback", help="Rebind a cohort to the more permissive previous policy.",
                                  called_from_command_line=getattr(parser, "called_from_command_line", None))
        rollback.add_argument("cohort")
        rollback.add_argument("--pause-restrictions", action="store_true",
                              help="Also pause new restrictions for the cohort (incident switch).")
        _decision_arguments(rollback)
        rebind = sub.add_parser("rebind", help="Move a cohort forward to a newer policy version (new cycles).",
                                called_from_command_line=getattr(parser, "called_from_command_line", None))
        rebind.add_argument("cohort")
        rebind.add_argument("policy")
        rebind.add_argument("--batch", type=int, default=500)
        _decision_arguments(rebind)
        shadow = sub.add_parser("shadow", help="The shadow report: its disagreements (or --all cases).",
                                called_from_command_line=getattr(parser, "called_from_command_line", None))
        shadow.add_argument("--all", action="store_true", dest="show_all")

    def handle(self, *args, action: str, **options) -> None:
        try:
            getattr(self, f"_{action}")(**options)
        except RolloutError as exc:
            raise CommandError(str(exc)) from None

    def _now(self, text: str | None) -> datetime | None:
        return _parse_now(text) if text else None

    def _user(self, username: str):  # noqa: ANN202 - the user model
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"--by {username!r}: no such user")
        return user

    def _status(self, *, as_json: bool = False, now: str | None = None, **_: object) -> None:
        rows = rollout_status(self._now(now))
        if as_json:
            self.stdout.write(json.dumps([{
                "policy": r.policy, "cohort": r.cohort, "mode": r.mode, "percent": r.percent, "source": r.source,
                "since": r.since.isoformat(), "billing_cycles_elapsed": r.periods_elapsed, "interval": r.interval,
                "cycles_opened": r.cycles_opened, "subscriptions": r.subscriptions, "low_risk": r.low_risk,
                "gates_passed": r.gates_passed, "failed_gates": list(r.failed_gates)} for r in rows], indent=2))
            return
        headers = ("Policy", "Cohort", "Mode", "%", "Since", "Billing cycles", "Cycles opened", "Subs", "Gates")
        table = [(r.policy, r.cohort, r.mode, str(r.percent), f"{r.since:%Y-%m-%d} ({r.source})",
                  f"{r.periods_elapsed} {r.interval}(s)", str(r.cycles_opened), str(r.subscriptions),
                  "green" if r.gates_passed else "RED: " + ", ".join(r.failed_gates)) for r in rows]
        widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(headers)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        self.stdout.write(line.format(*headers))
        for row in table:
            self.stdout.write(line.format(*row))
        self.stdout.write("Billing cycles = whole billing periods elapsed since the stage began.")

    def _promote(self, *, policy: str, cohort: str, mode: str, percent: str, by: str, reason: str, ticket: str,
                 now: str | None = None, **_: object) -> None:
        stage = rollout_promote(policy=policy, cohort=cohort, to_mode=mode.upper(), percent=percent,
                                by=self._user(by), reason=reason, ticket=ticket, now=self._now(now))
        self.stdout.write(self.style.SUCCESS(
            f"{stage.policy.identity} for cohort {stage.cohort!r}: {stage.previous_mode} {stage.previous_percent} % "
            f"→ {stage.mode} {stage.percent} % (stage #{stage.pk}, {stage.ticket})"))

    def _rollback(self, *, cohort: str, by: str, reason: str, ticket: str, now: str | None = None,
                  pause_restrictions: bool = False, **_: object) -> None:
        outcome = rollout_rollback(cohort=cohort, by=self._user(by), reason=reason, ticket=ticket,
                                   now=self._now(now), pause_restrictions=pause_restrictions)
        if outcome.incident:
            self.stdout.write(f"new restrictions paused for cohort {cohort!r} ({outcome.incident.ticket})")
        for move in outcome.moves:
            self.stdout.write(f"{move.from_policy} → {move.to_policy}: {move.changed} rebound, "
                              f"{len(move.refused)} refused")
            for refusal in move.refused[:20]:
                self.stdout.write(f"    {refusal}")
        for kept in outcome.kept:
            self.stdout.write(f"kept: {kept}")

    def _rebind(self, *, cohort: str, policy: str, by: str, reason: str, ticket: str, batch: int = 500,
                now: str | None = None, **_: object) -> None:
        run = rollout_rebind_forward(cohort=cohort, to_policy=policy, by=self._user(by), reason=reason,
                                     ticket=ticket, now=self._now(now), batch=batch, progress=self.stdout.write)
        self.stdout.write(self.style.SUCCESS(
            f"job run #{run.pk} {run.status}: {run.examined} examined, {run.changed} rebound, {run.refused} refused"))

    def _shadow(self, *, show_all: bool = False, **_: object) -> None:
        cases = [c for c in shadow_report() if show_all or c.disagrees]
        self.stdout.write(f"{len(cases)} {'case(s)' if show_all else 'disagreement(s)'}")
        for c in cases:
            self.stdout.write(f"{c.subscription} cycle {c.cycle_id} [{c.policy}, {c.mode}]: shadow {c.shadow_state} "
                              f"(access {c.access_held}), ENFORCE {c.enforce_profile}, then {c.outcome}"
                              + (f" — {c.disagreement}" if c.disagreement else ""))
