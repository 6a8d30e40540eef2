"""The round-based training loop, evaluation passes and oracles."""

from eada.train.loop import ActiveDATrainer, RunResult
from eada.train.oracle import Oracle, SimulatedOracle

__all__ = ["ActiveDATrainer", "Oracle", "RunResult", "SimulatedOracle"]
