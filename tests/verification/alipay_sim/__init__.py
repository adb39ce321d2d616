"""The seeded Alipay simulation (issue 20): the product against the Alipay simulator on loopback,
a schedule generated from a seed, and an auditor after every step (docs/alipay.md)."""

from tests.verification.alipay_sim.engine import AlipaySimulation, RunResult
from tests.verification.alipay_sim.schedule import Schedule, Step, generate

__all__ = ["AlipaySimulation", "RunResult", "Schedule", "Step", "generate"]
