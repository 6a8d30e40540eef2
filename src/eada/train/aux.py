"""Training components that some baselines need beside the classifier, and the hook that runs
them inside :class:`~eada.train.loop.ActiveDATrainer`.

Each component adds a loss to every training step and may add per-sample scores to the pool
outputs at selection time (``PoolOutputs.extra``):

* ``domain_discriminator`` (AADA, TQS): an MLP on embeddings, source vs target, with gradient
  reversal into the features (DANN-style); pool score ``domain_source_prob``.
* ``committee`` (TQS): ``K`` extra linear energy heads on (detached) embeddings, NLL on source
  and labeled target; pool score ``committee_energies`` ``(N, K, C)``.
* ``adversarial_entropy`` (CLUE): MME's minimax entropy on unlabeled target (the head maximises
  it, the features minimise it); no pool score.
* ``wasserstein_critic`` (WAAL): a critic between labeled (source + labeled target) and
  unlabeled embeddings (sigmoid output) with a gradient penalty; the features minimise the
  estimated distance with WAAL's small weight ``active.params.critic_weight`` (default 2e-3);
  pool score ``critic_score`` in ``[0, 1]``.

:data:`STRATEGY_COMPONENTS` says which strategy switches on which components. Components run
their own forward passes (train mode) on the step's source batch and on target batches that
they draw with their own generator, so the classifier's own batch streams are untouched.
Their parameters have their own Adam optimiser (``active.params.aux_lr``, default 1e-3);
``active.params.aux_weight`` scales the gradient reversal and entropy losses (default 0.1);
the WAAL critic's feature-side weight is ``active.params.critic_weight`` (default 2e-3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from eada import energy as energy_ops
from eada.data.batches import iterate_inputs
from eada.strategies import PoolOutputs

if TYPE_CHECKING:
    from eada.train.loop import ActiveDATrainer

COMPONENT_PARAMS = ("aux_components", "aux_lr", "aux_weight", "committee_size", "critic_weight")
"""The ``active.params`` keys the training components read (validated in the config)."""

STRATEGY_COMPONENTS: dict[str, tuple[str, ...]] = {
    "aada": ("domain_discriminator",),
    "tqs": ("committee", "domain_discriminator"),
    "clue": ("adversarial_entropy",),
    "waal": ("wasserstein_critic",),
}


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, coeff: float) -> torch.Tensor:
        ctx.coeff = coeff
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.coeff * grad, None


def grad_reverse(x: torch.Tensor, coeff: float = 1.0) -> torch.Tensor:
    """Identity forward, gradient multiplied by ``-coeff`` backward (Ganin & Lempitsky 2015).

    Example:
        >>> x = torch.ones(2, requires_grad=True)
        >>> grad_reverse(x, 0.5).sum().backward()
        >>> x.grad.tolist()
        [-0.5, -0.5]
    """
    return _GradReverse.apply(x, coeff)


def _mlp(d: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(d, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out),
    )


class StepBatch:
    """Embeddings of one training step: source ``zs`` with labels ``ys``, unlabeled target
    ``zu``, labeled target ``zl`` with labels ``yl`` (may be empty), and the energy ``head``."""

    def __init__(
        self,
        zs: torch.Tensor,
        ys: torch.Tensor,
        zu: torch.Tensor,
        zl: torch.Tensor,
        yl: torch.Tensor,
        head: nn.Module,
    ) -> None:
        self.zs, self.ys, self.zu, self.zl, self.yl, self.head = zs, ys, zu, zl, yl, head


class AuxComponent(nn.Module):
    """One training component: ``loss(batch)`` each step, ``pool_scores(z)`` at selection."""

    name = "component"

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The component's loss for this step (added to the classifier's) and values to log."""
        raise NotImplementedError

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-sample scores on pool embeddings ``z`` (``(N, D)``), for ``PoolOutputs.extra``."""
        return {}


class DomainDiscriminator(AuxComponent):
    """``D(z) = P(source | z)``; BCE on source (1) vs target (0) embeddings passed through a
    gradient reversal layer (coefficient ``weight``), so the features learn to fool it."""

    name = "domain_discriminator"

    def __init__(self, dim: int, weight: float, hidden: int = 256) -> None:
        super().__init__()
        self.net = _mlp(dim, hidden, 1)
        self.weight = weight

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        zt = torch.cat([batch.zu, batch.zl]) if len(batch.zl) else batch.zu
        z = grad_reverse(torch.cat([batch.zs, zt]), self.weight)
        y = torch.cat([torch.ones(len(batch.zs)), torch.zeros(len(zt))]).to(z.device)
        loss = nn.functional.binary_cross_entropy_with_logits(self.net(z).squeeze(1), y)
        return loss, {"loss_domain": float(loss.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        return {"domain_source_prob": torch.sigmoid(self.net(z)).squeeze(1).double().cpu().numpy()}


class Committee(AuxComponent):
    """``K`` linear energy heads, differently initialised, trained with the energy NLL on source
    and labeled-target embeddings (detached: the committee does not move the features)."""

    name = "committee"

    def __init__(self, dim: int, num_classes: int, size: int = 3) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"committee size must be >= 1, got {size}")
        self.heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(size))

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        z = torch.cat([batch.zs, batch.zl]).detach()
        y = torch.cat([batch.ys, batch.yl])
        loss = torch.stack([energy_ops.energy_nll(h(z), y) for h in self.heads]).mean()
        return loss, {"loss_committee": float(loss.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        e = torch.stack([h(z) for h in self.heads], dim=1)
        return {"committee_energies": e.double().cpu().numpy()}


class AdversarialEntropy(AuxComponent):
    """MME's minimax entropy (Saito et al. 2019), CLUE's semi-supervised loss:
    ``L = weight * mean_x sum_y p log p`` with ``p = softmax(-head(GRL(z_u)))``; minimising it
    makes the head MAXIMISE the entropy, and the reversed gradient makes the features minimise it.
    """

    name = "adversarial_entropy"

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = torch.log_softmax(-batch.head(grad_reverse(batch.zu, 1.0)), dim=1)
        neg_entropy = (logp.exp() * logp).sum(dim=1).mean()
        return self.weight * neg_entropy, {"entropy_unlabeled": float(-neg_entropy.detach())}


class WassersteinCritic(AuxComponent):
    """WAAL's critic ``c(z) = sigmoid(f(z))`` in ``[0, 1]`` (bounded, as the authors' critic, so
    the query's ``selection`` weight keeps its scale against the uncertainty bound).

    The critic maximises ``W = mean c(z_unlabeled) - mean c(z_labeled)`` with a gradient penalty
    ``gp * (||grad c|| - 1)^2`` on interpolates (WGAN-GP); through a gradient reversal the
    features minimise ``weight * W``. ``weight`` is WAAL's ``alpha`` (authors' default 2e-3).
    Our first critic was unbounded: its game oscillated and collapsed target accuracy (Office-31
    frozen, 29% on one seed). Bounded, the critic trains stably with either weight (BENCHMARKS.md).
    High ``c`` = unlike the labeled data (source + labeled target here).

    Example:
        >>> torch.manual_seed(0) and None
        >>> critic = WassersteinCritic(dim=4, weight=2e-3)
        >>> z = torch.randn(8, 4)
        >>> batch = StepBatch(z[:4], torch.zeros(4, dtype=torch.long), z[4:], z[:0],
        ...                   torch.zeros(0, dtype=torch.long), nn.Linear(4, 3))
        >>> loss, logs = critic.loss(batch)
        >>> sorted(logs), bool(torch.isfinite(loss))
        (['wasserstein'], True)
    """

    name = "wasserstein_critic"

    def __init__(self, dim: int, weight: float, gp: float = 10.0, hidden: int = 256) -> None:
        super().__init__()
        self.net = _mlp(dim, hidden, 1)
        self.weight, self.gp = weight, gp

    def critic(self, z: torch.Tensor) -> torch.Tensor:
        """``c(z)`` in ``[0, 1]``, shape ``(N,)``."""
        return torch.sigmoid(self.net(z)).squeeze(1)

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        lab = torch.cat([batch.zs, batch.zl]) if len(batch.zl) else batch.zs
        unl = batch.zu
        w = (
            self.critic(grad_reverse(unl, self.weight)).mean()
            - self.critic(grad_reverse(lab, self.weight)).mean()
        )
        m = min(len(lab), len(unl))
        a, b = lab[:m].detach(), unl[:m].detach()
        t = torch.rand(m, 1, device=a.device)
        mix = (t * a + (1 - t) * b).requires_grad_(True)
        (g,) = torch.autograd.grad(self.critic(mix).sum(), mix, create_graph=True)
        penalty = ((g.norm(dim=1) - 1.0) ** 2).mean()
        return -w + self.gp * penalty, {"wasserstein": float(w.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        return {"critic_score": self.critic(z).double().cpu().numpy()}


COMPONENTS = tuple(
    c.name for c in (DomainDiscriminator, Committee, AdversarialEntropy, WassersteinCritic)
)
"""Every training component's name (from the classes, so the list cannot drift from them)."""


class AuxTraining:
    """The components of one run, their optimiser and their own target-batch sampler.

    Args:
        names: component names (see :data:`STRATEGY_COMPONENTS`).
        dim: embedding size ``D`` of the model.
        num_classes: ``C``.
        params: ``active.params`` (reads ``aux_lr``, ``aux_weight``, ``critic_weight``,
            ``committee_size``).
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
        weight = float(params.get("aux_weight", 0.1))
        lr = float(params.get("aux_lr", 1e-3))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            made: list[AuxComponent] = []
            for n in names:
                if n == "domain_discriminator":
                    made.append(DomainDiscriminator(dim, weight))
                elif n == "committee":
                    made.append(Committee(dim, num_classes, int(params.get("committee_size", 3))))
                elif n == "adversarial_entropy":
                    made.append(AdversarialEntropy(weight))
                elif n == "wasserstein_critic":
                    critic_weight = float(params.get("critic_weight", 2e-3))
                    made.append(WassersteinCritic(dim, critic_weight))
                else:
                    raise ValueError(f"unknown training component {n!r}")
        self.components = nn.ModuleList(made)
        self._items: list[AuxComponent] = made
        trainable = [p for p in self.components.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(trainable, lr=lr) if trainable else None
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

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
    strategy then needs its scores from elsewhere)."""
    a = trainer.cfg.active
    names = tuple(a.params.get("aux_components", STRATEGY_COMPONENTS.get(a.strategy, ())))
    if not a.enabled or not names:
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
    """Add what some strategies need beyond :func:`~eada.train.evaluate.score_pool`: embeddings
    of the labeled target set and of the source (``labeled_embeddings``/``source_embeddings`` in
    ``needs``) and the training components' pool scores (``outputs.extra``)."""
    from eada.train.evaluate import embed_samples

    bs, dev = trainer.cfg.train.eval_batch_size, trainer.device
    if "labeled_embeddings" in needs:
        lab = torch.nonzero(trainer.labeled_mask).squeeze(1)
        outputs.labeled_embeddings = embed_samples(trainer.model, trainer.task.target, lab, bs, dev)
    if "source_embeddings" in needs:
        src = trainer.task.source
        outputs.source_embeddings = embed_samples(
            trainer.model, src, torch.arange(len(src)), bs, dev
        )
    aux = getattr(trainer, "aux", None)
    if aux is not None and len(outputs):
        outputs.extra.update(
            aux.pool_scores(outputs.require_embeddings("training components"), dev)
        )
    return outputs
