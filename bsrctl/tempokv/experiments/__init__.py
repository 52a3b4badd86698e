"""TempoKV experiments: the paper's figures on the simulated stack, its claims as stated
expectations, and the oracle each causal policy is measured against."""

from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.experiments.run import STACKS, run_tempokv

__all__ = ["STACKS", "run_tempokv", "simulate_policy"]
