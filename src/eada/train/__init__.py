"""The round-based training loop, evaluation passes and oracles.

Importing this package registers the baselines' training components with the trainer
(:mod:`eada.train.aux`, a plug-in the loop itself does not import).
"""

from eada.train import aux as _aux  # noqa: F401  (registers build_aux with the trainer)
from eada.train.loop import ActiveDATrainer, GateSchedule, RunResult, round_plan
from eada.train.oracle import Oracle, SimulatedOracle

__all__ = [
    "ActiveDATrainer",
    "GateSchedule",
    "Oracle",
    "RunResult",
    "SimulatedOracle",
    "round_plan",
]
