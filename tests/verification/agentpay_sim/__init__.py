"""Seeded simulation of AgentPay's wallet rail (issue 17 item 8) with an auditor checking the
ledger and the three state lines after every step (README, AgentPay section)."""

from tests.verification.agentpay_sim.auditor import CODES, Auditor, Violation
from tests.verification.agentpay_sim.engine import EPOCH, RunResult, Simulation
from tests.verification.agentpay_sim.schedule import WEIGHTS, Schedule, Step, generate

__all__ = ["CODES", "EPOCH", "WEIGHTS", "Auditor", "RunResult", "Schedule", "Simulation", "Step", "Violation",
           "generate"]
