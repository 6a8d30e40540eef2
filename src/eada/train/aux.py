"""The hook that runs the training components some baselines need
(:mod:`eada.strategies.components`: domain discriminator, committee, MME entropy, WAAL critic)
inside :class:`~eada.train.loop.ActiveDATrainer`.

Components run their own forward passes (train mode) on the step's source batch and on target
batches that they draw with their own generator, so the classifier's own batch streams are
untouched. Their parameters have their own Adam optimiser (``active.params.aux_lr``, default
1e-3). Which components a strategy switches on, and the settings each reads, the components
declare themselves (:data:`~eada.strategies.components.STRATEGY_COMPONENTS`,
:attr:`~eada.strategies.components.AuxComponent.settings`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from eada.data.batches import iterate_inputs
from eada.strategies import PoolOutputs
from eada.strategies.components import (
    COMPONENT_CLASSES,
    COMPONENT_PARAMS,
    COMPONENTS,
    STRATEGY_COMPONENTS,
    TRAINING_SETTINGS,
    AdversarialEntropy,
    AuxComponent,
    Committee,
    DomainDiscriminator,
    StepBatch,
    WassersteinCritic,
    grad_reverse,
)
from eada.train.loop import ActiveDATrainer, register_components_builder


class AuxTraining:
    """The components of one run, their optimiser and their own target-batch sampler.

    Args:
        names: component names (see :data:`STRATEGY_COMPONENTS`).
        dim: embedding size ``D`` of the model.
        num_classes: ``C``.
        params: ``active.params`` (reads ``aux_lr`` and what each component declares in its
            ``settings``).
        batch_size: size of the target batches the components draw.
        seed: seeds the sampler and the components' initialisation.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        dim: int,
        num_classes: int,
        params: dict[str, Any],
        batch_size: int,
        seed: int,
    ) -> None:
        lr = float(params.get("aux_lr", TRAINING_SETTINGS["aux_lr"]))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            made: list[AuxComponent] = []
            for n in names:
                if n not in COMPONENT_CLASSES:
                    raise ValueError(f"unknown training component {n!r}")
                made.append(COMPONENT_CLASSES[n].from_params(dim, num_classes, params))
        self.components = nn.ModuleList(made)
        self._items: list[AuxComponent] = made
        trainable = [p for p in self.components.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(trainable, lr=lr) if trainable else None
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The components' parameters."""
        return self.components.parameters()

    @property
    def names(self) -> list[str]:
        """The components' names, in order."""
        return [c.name for c in self._items]

    def to(self, device: torch.device) -> AuxTraining:
        """Move the components to ``device``."""
        self.components.to(device)
        return self

    def _draw(self, idx: torch.Tensor) -> torch.Tensor:
        pick = torch.randint(
            len(idx), (min(self.batch_size, max(2, len(idx))),), generator=self.generator
        )
        return idx[pick]

    def loss(
        self, trainer: ActiveDATrainer, xs: torch.Tensor, ys: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Sum of the components' losses for one step (model in train mode)."""
        model, dev, tgt = trainer.model, trainer.device, trainer.task.target
        embed = getattr(model, "embed", None)
        head = getattr(model, "head", None)
        if not callable(embed) or not isinstance(head, nn.Module):
            raise TypeError("training components need an EnergyNet (with .embed and .head)")
        mask = trainer.labeled_mask
        unl = torch.nonzero(~mask).squeeze(1)
        lab = torch.nonzero(mask).squeeze(1)
        iu = self._draw(unl) if len(unl) else torch.empty(0, dtype=torch.long)
        il = self._draw(lab) if len(lab) else torch.empty(0, dtype=torch.long)
        n_s, n_u = len(xs), len(iu)
        (xt,) = iterate_inputs(tgt.view("train"), [torch.cat([iu, il])])
        x = torch.cat([xs, xt]).to(dev)
        z = embed(x)
        batch = StepBatch(
            z[:n_s],
            ys.to(dev),
            z[n_s : n_s + n_u],
            z[n_s + n_u :],
            trainer.target_labels[il].to(dev),
            head,
        )
        total = torch.zeros((), device=dev)
        logs: dict[str, float] = {}
        for c in self._items:
            loss, out = c.loss(batch)
            total = total + loss
            logs.update(out)
        return total, logs

    def zero_grad(self) -> None:
        """Clear the components' gradients."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One optimiser step on the components' parameters."""
        if self.optimizer is not None:
            self.optimizer.step()

    @torch.no_grad()
    def pool_scores(self, embeddings: np.ndarray, device: torch.device) -> dict[str, np.ndarray]:
        """Every component's per-sample scores on the pool embeddings (eval mode)."""
        self.components.eval()
        z = torch.from_numpy(np.asarray(embeddings, dtype=np.float32)).to(device)
        out: dict[str, np.ndarray] = {}
        for c in self._items:
            out.update(c.pool_scores(z))
        self.components.train()
        return out

    def state_dict(self) -> dict[str, Any]:
        """Components, optimiser and sampler state (for checkpoints)."""
        return {
            "components": self.components.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.components.load_state_dict(state["components"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def build_aux(trainer: ActiveDATrainer) -> AuxTraining | None:
    """The training components the trainer's strategy needs (``None`` for most strategies).

    ``active.params.aux_components`` overrides the default list (``[]`` trains none: the
    strategy then needs its scores from elsewhere). They train whenever the strategy is not
    ``none``, also in a run without rounds (a project store trains each segment between rounds
    as such a run): DUC's evidential loss is its whole classifier loss."""
    a = trainer.cfg.active
    names = tuple(a.params.get("aux_components", STRATEGY_COMPONENTS.get(a.strategy, ())))
    if a.strategy == "none" or not names:
        return None
    model = trainer.model
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise TypeError(f"strategy {a.strategy!r} trains {names}: the model needs a linear .head")
    aux = AuxTraining(
        names,
        head.in_features,
        head.out_features,
        a.params,
        trainer.cfg.train.batch_size,
        trainer.cfg.seed + 4,
    )
    return aux.to(trainer.device)


def complete_pool_outputs(
    trainer: ActiveDATrainer, outputs: PoolOutputs, needs: tuple[str, ...]
) -> PoolOutputs:
    """Same as ``trainer.complete_pool_outputs(outputs, needs)``
    (:meth:`eada.train.loop.ActiveDATrainer.complete_pool_outputs`, its home since the trainer
    stopped importing this module)."""
    return trainer.complete_pool_outputs(outputs, needs)


register_components_builder(build_aux)


__all__ = [  # the components' home is eada.strategies.components; these names stay importable here
    "COMPONENTS",
    "COMPONENT_PARAMS",
    "STRATEGY_COMPONENTS",
    "AdversarialEntropy",
    "AuxComponent",
    "AuxTraining",
    "Committee",
    "DomainDiscriminator",
    "StepBatch",
    "WassersteinCritic",
    "build_aux",
    "complete_pool_outputs",
    "grad_reverse",
]
