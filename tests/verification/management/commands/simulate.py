"""manage.py simulate --seed N --steps M: a seeded simulation of the product against the
Stripe-compatible simulator, audited after every step, ending with the release-gates report
over the simulated data.

It runs against the configured database (DATABASE_URL; migrations applied) inside one
transaction that is rolled back at the end, so by default nothing is left behind. Because it
still takes row and advisory locks there and runs the jobs over every row it can see, it
refuses to start unless the database name contains "sim" (e.g. dunning_sim) or --yes is given.
--keep commits the simulated data instead (for inspection in the admin).
"""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from dunning.management.commands.dunning_gates import Command as GatesCommand
from tests.verification.simulation import Simulation, generate
from tests.verification.simulation.shrink import shrink


class Command(BaseCommand):
    help = "Seeded, audited simulation (see README 'Simulation'); prints the gates report at the end."

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
        parser.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds (default 1)")
        parser.add_argument("--steps", type=int, default=500, help="steps per seed (default 500)")
        parser.add_argument("--subscriptions", type=int, default=None, help="subscriptions per seed (default 2–3)")
        parser.add_argument("--yes", action="store_true", help="run even if the database name has no 'sim' in it")
        parser.add_argument("--keep", action="store_true", help="commit the simulated data instead of rolling back")
        parser.add_argument("--no-shrink", action="store_true", help="do not search for a shorter failing replay")
        parser.add_argument("--http", action="store_true", help="talk HTTP to the simulator on loopback")

    def handle(self, *args, seed: int, seeds: int, steps: int, subscriptions: int | None, yes: bool, keep: bool,
               no_shrink: bool, http: bool, **options):
        name = str(connection.settings_dict.get("NAME") or "")
        if "sim" not in name.lower() and not yes:
            raise CommandError(f"refusing to simulate on database {name!r}: use a dedicated database whose name "
                               "contains 'sim' (e.g. DATABASE_URL=postgres://…/dunning_sim, then migrate) or --yes")
        failed = 0
        total_steps, total_seconds = 0, 0.0
        for current in range(seed, seed + seeds):
            schedule = generate(current, steps, subscriptions=subscriptions)
            last = [0.0]

            def progress(done: int, of: int, partial, current=current, last=last) -> None:
                now = time.perf_counter()
                if now - last[0] > 0.5 or done == of:
                    last[0] = now
                    bad = len(partial.violations) if partial else 0
                    sys.stderr.write(f"\rseed {current}: step {done}/{of}, violations {bad}   ")
                    sys.stderr.flush()

            simulation = Simulation(schedule, keep=keep, gates=True, progress=progress, http=http)
            result = simulation.run()
            sys.stderr.write("\n")
            total_steps += result.steps_run
            total_seconds += result.seconds
            self.stdout.write(f"seed {current}: {result.steps_run} steps in {result.seconds:.1f}s "
                              f"({result.steps_run / max(result.seconds, 1e-9):.1f} steps/s), "
                              f"{len(result.violations)} violation(s)")
            if result.gates is not None:
                GatesCommand(stdout=self.stdout, stderr=self.stderr)._table(result.gates, definitions=False)
            if result.ok and (result.gates is None or result.gates.passed):
                continue
            failed += 1
            for violation in result.violations:
                self.stdout.write(self.style.ERROR(f"  {violation}"))
            first = result.first
            if first is not None and not no_shrink:
                self.stdout.write(f"searching for the shortest replay of {first.code} (seed {current}) …")
                small = shrink(schedule, first.code, failing_step=first.step, log=self.stdout.write)
                self.stdout.write(f"replay ({len(small.steps)} steps) — paste into a test and run "
                                  f"Simulation(schedule).run():\n{small.as_python()}")
            self.stdout.write(self.style.ERROR(f"FAILED: seed {current} (replay: manage.py simulate --seed {current} "
                                               f"--steps {steps})"))
        self.stdout.write(f"{seeds} seed(s), {total_steps} steps in {total_seconds:.1f}s "
                          f"({total_steps / max(total_seconds, 1e-9):.1f} steps/s)")
        if failed:
            raise CommandError(f"{failed} seed(s) failed")
