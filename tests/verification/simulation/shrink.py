"""Shortest replay of a failing schedule: cut at the first violating step, then delta-debug
(ddmin) the step list, keeping a candidate only when it still shows the same violation code."""

from __future__ import annotations

from collections.abc import Callable

from tests.verification.simulation.engine import Simulation
from tests.verification.simulation.schedule import Schedule


def _fails(schedule: Schedule, code: str) -> bool:
    result = Simulation(schedule).run()
    return any(v.code == code for v in result.violations)


def shrink(schedule: Schedule, code: str, *, failing_step: int | None = None, budget: int = 40,
           log: Callable[[str], None] | None = None) -> Schedule:
    steps = list(schedule.steps[: failing_step + 1] if failing_step is not None and failing_step >= 0
                 else schedule.steps)
    runs = 0
    n = 2
    while len(steps) >= 2 and runs < budget:
        chunk = max(len(steps) // n, 1)
        reduced = False
        for start in range(0, len(steps), chunk):
            candidate = steps[:start] + steps[start + chunk:]
            runs += 1
            if _fails(schedule.with_steps(candidate), code):
                steps = candidate
                n = max(n - 1, 2)
                reduced = True
                if log:
                    log(f"  shrink: {len(steps)} steps still show {code}")
                break
            if runs >= budget:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(n * 2, len(steps))
    return schedule.with_steps(steps)
