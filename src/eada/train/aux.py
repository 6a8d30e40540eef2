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
    TargetAccess,
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
        self._step_in_epoch, self._epoch_steps, self._epoch = 0, 1, -1
        self._last_unlabeled = torch.empty(0, dtype=torch.long)
        self._last_access: TargetAccess | None = None
        self._global_step = 0
        self.per_domain = any(c.per_domain_forward for c in made)
        self.without_replacement = any(c.without_replacement for c in made)
        self._passes: dict[str, _Pass] = {
            "unlabeled": _Pass(drop_last=True),
            "labeled": _Pass(drop_last=False),
        }

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

    def _draw(self, idx: torch.Tensor, which: str) -> torch.Tensor:
        """A target batch of positions from ``idx``: uniform draws with replacement, or (a
        component with :attr:`~AuxComponent.without_replacement`) the next batch of a shuffled
        pass over ``idx``; a batch of one is doubled (a batch-norm layer needs two rows, as the
        authors of DUC do)."""
        if self.without_replacement:
            out = self._passes[which].next(idx, self.batch_size, self.generator)
            return out.repeat(2) if len(out) == 1 else out
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
        iu = self._draw(unl, "unlabeled") if len(unl) else torch.empty(0, dtype=torch.long)
        il = self._draw(lab, "labeled") if len(lab) else torch.empty(0, dtype=torch.long)
        if self._step_in_epoch == 0:
            self._epoch_steps = trainer.steps_per_epoch()
            self._epoch += 1
        access = TargetAccess(
            len(tgt),
            lab,
            trainer.target_labels,
            self._step_in_epoch == 0,
            self.batch_size,
            lambda idx: self._embed_eval(trainer, idx),
            max(0, self._epoch),
            self._global_step,
        )
        self._global_step += 1
        self._step_in_epoch = (self._step_in_epoch + 1) % max(1, self._epoch_steps)
        asked = {c.name: r for c in self._items if (r := c.target_request(access)) is not None}
        n_s, n_u, n_l = len(xs), len(iu), len(il)
        rows = [iu, il, *(r[0] for r in asked.values())]
        (xt,) = iterate_inputs(tgt.view("train"), [torch.cat(rows)])
        at = n_u + n_l
        for c in self._items:  # LADA's anchor views: mixup with a RandAugment ("anchor") view
            if c.name not in asked:
                continue
            idx = asked[c.name][0]
            if c.mixup_alpha > 0 and len(idx) and "anchor" in getattr(tgt, "transforms", {}):
                (xv,) = iterate_inputs(tgt.view("anchor"), [idx])
                seed = int(torch.randint(2**31 - 1, (1,), generator=self.generator))
                m = np.random.default_rng(seed).beta(c.mixup_alpha, c.mixup_alpha, len(idx))
                m_t = torch.from_numpy(m).to(xt.dtype).view(-1, *([1] * (xt.dim() - 1)))
                xt[at : at + len(idx)] = m_t * xt[at : at + len(idx)] + (1 - m_t) * xv
            at += len(idx)
        if self.per_domain:  # one forward pass per domain and set: batch-norm statistics apart
            parts = [xs, xt[:n_u], xt[n_u : n_u + n_l], xt[n_u + n_l :]]
            z = torch.cat([embed(x.to(dev)) for x in parts if len(x)])
        else:
            z = embed(torch.cat([xs, xt]).to(dev))
        requested, at = {}, n_s + n_u + n_l
        for name, (idx, y) in asked.items():
            requested[name] = (z[at : at + len(idx)], y.to(dev))
            at += len(idx)
        batch = StepBatch(
            z[:n_s],
            ys.to(dev),
            z[n_s : n_s + n_u],
            z[n_s + n_u : n_s + n_u + n_l],
            trainer.target_labels[il].to(dev),
            head,
            requested,
            access,
        )
        self._last_unlabeled, self._last_access = iu, access
        total = torch.zeros((), device=dev)
        logs: dict[str, float] = {}
        for c in self._items:
            if c.separate_step:  # its own optimiser step after this one (after_step)
                continue
            loss, out = c.loss(batch)
            total = total + loss
            logs.update(out)
        return total, logs

    def after_step(self, trainer: ActiveDATrainer) -> dict[str, float]:
        """The optimiser step of the components with :attr:`~AuxComponent.separate_step`
        (LADA's MME: a second step an iteration on the entropy alone), on the unlabeled batch
        of the step just taken; nothing when there are none or no unlabeled batch."""
        mine = [c for c in self._items if c.separate_step]
        if not mine or not len(self._last_unlabeled):
            return {}
        model, dev, tgt = trainer.model, trainer.device, trainer.task.target
        (xu,) = iterate_inputs(tgt.view("train"), [self._last_unlabeled])
        zu = model.embed(xu.to(dev))  # type: ignore[operator]
        views = []
        n_views = max(c.strong_views for c in mine)
        if n_views:  # RandAugment views of image domains; in-memory inputs have none
            kind = "strong" if "strong" in getattr(tgt, "transforms", {}) else "train"
            for _ in range(n_views):  # each pass draws its own random augmentation
                (xv,) = iterate_inputs(tgt.view(kind), [self._last_unlabeled])
                views.append(model.embed(xv.to(dev)))  # type: ignore[operator]
        empty = zu[:0]
        batch = StepBatch(
            empty,
            torch.empty(0, dtype=torch.long, device=dev),
            zu,
            empty,
            torch.empty(0, dtype=torch.long, device=dev),
            model.head,  # type: ignore[arg-type]
            access=self._last_access,
            zu_views=views,
        )
        total = torch.zeros((), device=dev)
        logs: dict[str, float] = {}
        for c in mine:
            loss, out = c.loss(batch)
            total = total + loss
            logs.update(out)
        if not bool(torch.isfinite(total)):
            raise FloatingPointError(f"the separate step's loss became {float(total)}")
        trainer.optimizer.zero_grad(set_to_none=True)
        self.zero_grad()
        total.backward()
        trainer.optimizer.step()
        self.step()
        return logs

    @torch.no_grad()
    def _embed_eval(self, trainer: ActiveDATrainer, idx: torch.Tensor) -> torch.Tensor:
        """Embeddings of target positions ``idx`` (train view, eval mode, no gradient)."""
        model = trainer.model
        was = model.training
        model.eval()
        try:
            (x,) = iterate_inputs(trainer.task.target.view("train"), [idx])
            return model.embed(x.to(trainer.device))  # type: ignore[operator]
        finally:
            model.train(was)

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
            "step_in_epoch": self._step_in_epoch,
            "epoch_steps": self._epoch_steps,
            "epoch": self._epoch,
            "global_step": self._global_step,
            "passes": {k: v.state() for k, v in self._passes.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.components.load_state_dict(state["components"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self._step_in_epoch = int(state.get("step_in_epoch", 0))
        self._epoch_steps = int(state.get("epoch_steps", 1))
        self._epoch = int(state.get("epoch", -1))
        self._global_step = int(state.get("global_step", 0))
        for k, v in state.get("passes", {}).items():
            self._passes[k].load(v)


class _Pass:
    """Shuffled passes over a set of target positions, a batch at a time (a ``DataLoader`` with
    ``shuffle=True``): a new permutation when a pass is used up or the set changed (a round
    labeled samples); ``drop_last`` skips a last batch smaller than the batch size, unless the
    whole set is smaller than one batch."""

    def __init__(self, drop_last: bool) -> None:
        self.drop_last = drop_last
        self.members: torch.Tensor | None = None
        self.order = torch.empty(0, dtype=torch.long)
        self.at = 0

    def next(self, idx: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
        """The next batch of positions of ``idx``."""
        same = self.members is not None and torch.equal(self.members, idx)
        left = len(self.order) - self.at
        short = left < batch and (self.drop_last and len(idx) >= batch)
        if not same or left <= 0 or short:
            self.members = idx.clone()
            self.order = idx[torch.randperm(len(idx), generator=generator)]
            self.at = 0
        out = self.order[self.at : self.at + batch]
        self.at += len(out)
        return out

    def state(self) -> dict[str, Any]:
        """What :meth:`load` restores."""
        return {"members": self.members, "order": self.order, "at": self.at}

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`."""
        self.members, self.order, self.at = state["members"], state["order"], int(state["at"])


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
