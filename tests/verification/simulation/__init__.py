"""Seeded simulation of the dunning product against the Stripe-compatible simulator, with an
auditor checking the money and access invariants after every step (see README "Simulation")."""

from tests.verification.simulation.auditor import CODES, Auditor, Violation
from tests.verification.simulation.engine import EPOCH, RunResult, SimulatedCrash, Simulation
from tests.verification.simulation.schedule import WEIGHTS, Schedule, Step, generate

__all__ = ["CODES", "EPOCH", "WEIGHTS", "Auditor", "RunResult", "Schedule", "SimulatedCrash", "Simulation", "Step",
           "Violation", "generate"]
