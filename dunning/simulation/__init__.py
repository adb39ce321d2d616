"""Seeded simulation of the dunning product against the Stripe-compatible simulator, with an
auditor checking the money and access invariants after every step (see README "Simulation")."""

from dunning.simulation.auditor import CODES, Auditor, Violation
from dunning.simulation.engine import EPOCH, RunResult, SimulatedCrash, Simulation
from dunning.simulation.schedule import WEIGHTS, Schedule, Step, generate

__all__ = ["CODES", "EPOCH", "WEIGHTS", "Auditor", "RunResult", "Schedule", "SimulatedCrash", "Simulation", "Step",
           "Violation", "generate"]
