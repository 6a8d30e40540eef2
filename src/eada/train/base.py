"""What the trainer's parts share: the attributes of an :class:`~eada.train.loop.ActiveDATrainer`
(declared once in :class:`TrainerBase`, which the step, selection, evaluation and state mixins
extend), the training-components plug-in interface, and the records a run returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from eada import energy as energy_ops
from eada.config import ExperimentConfig
from eada.data.tasks import Task
from eada.strategies import PoolOutputs, Selection
from eada.train.oracle import Oracle
from eada.train.plan import GateSchedule
from eada.train.streams import BatchStream


class TrainingComponents(Protocol):
    """What the trainer calls on the parts that train beside the classifier (the baselines'
    discriminator, committee, ...: :class:`eada.train.aux.AuxTraining`)."""

    def loss(
        self, trainer: Any, xs: torch.Tensor, ys: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Their loss for one step (added to the classifier's) and values to log; ``trainer`` is
        the :class:`~eada.train.loop.ActiveDATrainer` calling."""
        ...

    def parameters(self) -> Iterator[nn.Parameter]:
        """Their parameters (gradients averaged over the ranks)."""
        ...

    def zero_grad(self) -> None:
        """Clear their gradients."""
        ...

    def step(self) -> None:
        """One optimiser step on their parameters."""
        ...

    def after_step(self, trainer: Any) -> dict[str, float]:
        """Their own optimiser steps after the step (LADA's MME and CDAC), values to log."""
        ...

    def pool_scores(self, embeddings: np.ndarray, device: torch.device) -> dict[str, np.ndarray]:
        """Per-sample scores on the pool's embeddings (``PoolOutputs.extra``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Their state, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


ComponentsBuilder = Callable[[Any], TrainingComponents | None]
"""A function of the trainer (an :class:`~eada.train.loop.ActiveDATrainer`) that builds its
training components, or returns ``None`` when its strategy needs none."""

COMPONENT_BUILDERS: list[ComponentsBuilder] = []
"""Who builds a trainer's training components: the first builder that returns some wins.
:mod:`eada.train.aux` registers its :func:`~eada.train.aux.build_aux` when :mod:`eada.train` is
imported (the trainer does not import its plug-ins)."""


def register_components_builder(builder: ComponentsBuilder) -> ComponentsBuilder:
    """Add ``builder`` to :data:`COMPONENT_BUILDERS` (once)."""
    if builder not in COMPONENT_BUILDERS:
        COMPONENT_BUILDERS.append(builder)
    return builder


@dataclass
class Proposal:
    """What :meth:`ActiveDATrainer.propose` chose: pool positions ``pool_idx`` (target indices
    of the unlabeled pool), the ``chosen`` target indices, the pool outputs and the strategy's
    :class:`~eada.strategies.Selection` (per-sample scores over the pool), and timings."""

    pool_idx: torch.Tensor
    chosen: torch.Tensor
    outputs: PoolOutputs
    selection: Selection
    scoring_seconds: float
    selection_seconds: float


@dataclass
class RunResult:
    """Everything a run measured (JSON-ready via :meth:`to_dict`)."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    labeled_indices: list[int] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for ``json.dump``."""
        return {
            "plan": self.plan,
            "rounds": self.rounds,
            "history": self.history,
            "final": self.final,
            "labeled_indices": self.labeled_indices,
            "seconds": self.seconds,
            "warnings": self.warnings,
        }


class TrainerBase:
    """The state every part of the trainer reads, set by
    :meth:`eada.train.loop.ActiveDATrainer.__init__` (see there for what each holds)."""

    cfg: ExperimentConfig
    task: Task
    device: torch.device
    plan: list[dict[str, Any]]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world: int
    _step: nn.Module
    cuda_graphs: bool
    step_setup: dict[str, Any]
    oracle: Oracle
    delta: energy_ops.DeltaEstimator
    alignment_log: list[dict[str, float]]
    alignment_warnings: list[dict[str, Any]]
    fea_weight: float
    gate_schedule: GateSchedule | None
    strategy_rng: np.random.Generator
    labeled_mask: torch.Tensor
    target_labels: torch.Tensor
    source_stream: BatchStream
    unlabeled_stream: BatchStream
    labeled_stream: BatchStream
    generator: torch.Generator
    last_proposal: Proposal | None
    _run_state: dict[str, Any] | None
    _resume: dict[str, Any] | None
    aux: TrainingComponents | None
