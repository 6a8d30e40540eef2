"""Training components that some baselines need beside the classifier, and the settings each
declares. :mod:`eada.train.aux` runs them inside :class:`~eada.train.loop.ActiveDATrainer`; the
config (:class:`~eada.config.ActiveConfig`) accepts exactly the settings they declare.

Each component adds a loss to every training step and may add per-sample scores to the pool
outputs at selection time (``PoolOutputs.extra``). Like a strategy, it never sees the model:
only the step's embeddings and the energy head (:class:`StepBatch`).

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
* ``evidential`` (DUC): the classifier's logits ``-E`` parameterise a Dirichlet; the evidential
  loss (NLL + KL / C) on source and labeled target, ``beta * U_dis + lambda * U_data`` on
  unlabeled target (the authors' ``core/active/loss.py`` and ``main.py``); no pool score (the
  ``duc`` strategy computes its uncertainties from the energies). DUC's method sets the
  trainer's own loss weights to 0 (``train.delta_s = delta_t = gamma = 0``), so this is the
  whole classifier loss, as in their code.
* ``random_anchors`` / ``local_anchors`` (LADA's RAA / LAA): an anchor set, at each epoch's start
  the labeled target, trained with the energy NLL on a batch drawn from it each step; after the
  step, candidates (RAA: random target samples; LAA: one of the ``K`` nearest cached target
  embeddings of each anchor in the batch) whose predicted class has posterior >= the threshold
  join it with that pseudo-label, each with a class-balancing probability (their
  ``solver/PAAsolver.py``). Their methods set ``train.delta_t = 0``: the anchor batch is the
  labeled-target term.

:data:`STRATEGY_COMPONENTS` says which strategy switches on which components
(``active.params.aux_components`` overrides it). Their parameters have their own Adam optimiser
(``active.params.aux_lr``, default 1e-3, :data:`TRAINING_SETTINGS`);
``active.params.aux_weight`` scales the gradient reversal and entropy losses (default 0.1);
the WAAL critic's feature-side weight is ``active.params.critic_weight`` (default 2e-3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from eada import energy as energy_ops

STRATEGY_COMPONENTS: dict[str, tuple[str, ...]] = {
    "aada": ("domain_discriminator",),
    "tqs": ("committee", "domain_discriminator"),
    "clue": ("adversarial_entropy",),
    "waal": ("wasserstein_critic",),
    "duc": ("evidential",),
}
# LADA's anchor-set augmentation is a training option of LAS (methods las_raa, las_laa in
# eada.hparams), not its default: their LAS runs also with plain fine-tuning and with MME
"""The components each strategy trains by default (``active.params.aux_components`` overrides)."""


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


class TargetAccess:
    """What a component may ask of the target set during a step (LADA's anchor augmentation):
    its size ``n``, the labeled positions ``labeled`` with ``labels`` (oracle labels, indexed by
    target position), whether this step starts an epoch (``new_epoch``), the step's
    ``batch_size``, ``embed(positions)``: embeddings of target samples (no gradient, model in
    eval mode), ``epoch``: the 0-based epoch of the run this step belongs to, and ``step``: the
    0-based step of the run."""

    def __init__(
        self,
        n: int,
        labeled: torch.Tensor,
        labels: torch.Tensor,
        new_epoch: bool,
        batch_size: int,
        embed: Callable[[torch.Tensor], torch.Tensor],
        epoch: int = 0,
        step: int = 0,
    ) -> None:
        self.n, self.labeled, self.labels = n, labeled, labels
        self.new_epoch, self.batch_size, self.embed = new_epoch, batch_size, embed
        self.epoch, self.step = epoch, step


class StepBatch:
    """Embeddings of one training step: source ``zs`` with labels ``ys``, unlabeled target
    ``zu``, labeled target ``zl`` with labels ``yl`` (may be empty), and the energy ``head``;
    ``requested`` maps a component's name to the embeddings (with gradient) and labels of the
    target samples it asked for (:meth:`AuxComponent.target_request`), ``access`` the target
    set (:class:`TargetAccess`, or ``None``), ``zu_views`` embeddings of further views of the
    unlabeled batch (:attr:`AuxComponent.strong_views`; empty otherwise)."""

    def __init__(
        self,
        zs: torch.Tensor,
        ys: torch.Tensor,
        zu: torch.Tensor,
        zl: torch.Tensor,
        yl: torch.Tensor,
        head: nn.Module,
        requested: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
        access: TargetAccess | None = None,
        zu_views: list[torch.Tensor] | None = None,
    ) -> None:
        self.zs, self.ys, self.zu, self.zl, self.yl, self.head = zs, ys, zu, zl, yl, head
        self.requested = requested or {}
        self.access = access
        self.zu_views = zu_views or []


class AuxComponent(nn.Module):
    """One training component: ``loss(batch)`` each step, ``pool_scores(z)`` at selection.

    A component declares the ``active.params`` keys it reads, with their defaults, in
    :attr:`settings`, and reads them only through :meth:`setting`; the config accepts exactly
    the declared keys (:data:`COMPONENT_PARAMS`)."""

    name: ClassVar[str] = "component"
    settings: ClassVar[dict[str, float | int]] = {}
    per_domain_forward: ClassVar[bool] = False
    """Whether the runner embeds the source, unlabeled and labeled batches in separate forward
    passes (batch-norm statistics per domain) instead of one concatenated pass."""
    without_replacement: ClassVar[bool] = False
    """Whether the runner draws the target batches as shuffled passes over each set (without
    replacement) instead of uniform draws with replacement."""
    mixup_alpha: float = 0.0
    """``> 0``: the runner mixes the inputs this component requested with an ``anchor`` view
    of each (``m ~ Beta(alpha, alpha)`` per row; LADA's anchor views)."""
    strong_views: ClassVar[int] = 0
    """How many further views of the unlabeled batch the component needs in its separate
    step (``StepBatch.zu_views``): the target's ``strong`` view (RandAugment) for image
    domains; in-memory inputs (features, digits) have no views, so the same inputs."""
    separate_step: bool = False
    """Whether the runner leaves this component's loss out of the step and gives it an
    optimiser step of its own after the step, on the same unlabeled batch (LADA's MME)."""

    @classmethod
    def setting(cls, params: dict[str, Any], key: str) -> Any:
        """``params[key]``, or the default :attr:`settings` declares (``KeyError`` for a key
        the component does not declare)."""
        return params.get(key, cls.settings[key])

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """The component for embeddings of size ``dim``, ``num_classes`` classes and the
        settings in ``params`` (``active.params``)."""
        raise NotImplementedError

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The component's loss for this step (added to the classifier's) and values to log."""
        raise NotImplementedError

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-sample scores on pool embeddings ``z`` (``(N, D)``), for ``PoolOutputs.extra``."""
        return {}

    def target_request(self, access: TargetAccess) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Target positions (and their labels) to embed WITH gradient in this step's forward
        pass, handed back in ``StepBatch.requested[name]``; ``None`` (the default) for none."""
        return None


COMPONENT_CLASSES: dict[str, type[AuxComponent]] = {}
"""Every training component by name (filled by :func:`register_component`)."""


def register_component(cls: type[AuxComponent]) -> type[AuxComponent]:
    """Class decorator adding a component to :data:`COMPONENT_CLASSES` under ``cls.name``.

    The one registration path (:func:`eada.extend.register_component` is this function): a
    name already registered by another class is refused (a built-in is never replaced); the
    same class registered again (its module imported twice) replaces it.

    Raises:
        ValueError: ``cls`` is not an :class:`AuxComponent` subclass with a name of its own
            and ``settings`` of numbers, or the name is taken.
    """
    from eada import plugins

    if not (isinstance(cls, type) and issubclass(cls, AuxComponent)):
        raise ValueError(f"a training component must subclass AuxComponent, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"training component {cls.__qualname__}: set a class attribute name = '...' "
            "(an identifier; the name in active.params.aux_components)"
        )
    for key, value in cls.settings.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
        ):
            raise ValueError(
                f"training component {name!r}: settings must map names to numbers, got "
                f"{key!r}: {value!r}"
            )
    if cls.from_params.__func__ is AuxComponent.from_params.__func__:  # type: ignore[attr-defined]
        raise ValueError(f"training component {name!r}: define the classmethod from_params")
    old = COMPONENT_CLASSES.get(name)
    if old is not None:
        same = old.__module__ == cls.__module__ and old.__qualname__ == cls.__qualname__
        if not same or plugins.is_builtin(cls.__module__):
            what = "training component"
            raise ValueError(plugins.collision_message(what, name, old.__module__, cls.__module__))
    COMPONENT_CLASSES[name] = cls
    plugins.register_origin("component", name, cls.__module__)
    return cls


def get_component(name: str) -> type[AuxComponent]:
    """A training component by name (a name that is not a built-in is looked for in the
    installed plugins' entry points, ``eada.components``).

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    if name not in COMPONENT_CLASSES:
        from eada import plugins

        plugins.load_entry_points("component")
    if name not in COMPONENT_CLASSES:
        raise ValueError(
            f"unknown training component {name!r}; known: {', '.join(COMPONENT_CLASSES)}"
        )
    return COMPONENT_CLASSES[name]


def component_params() -> tuple[str, ...]:
    """The ``active.params`` keys the training components read, the plugins' included: the
    runner's :data:`TRAINING_SETTINGS` and every registered component's settings (what
    :data:`COMPONENT_PARAMS` holds for the built-ins)."""
    return tuple(
        sorted({*TRAINING_SETTINGS, *(k for c in COMPONENT_CLASSES.values() for k in c.settings)})
    )


@register_component
class DomainDiscriminator(AuxComponent):
    """``D(z) = P(source | z)``; BCE on source (1) vs target (0) embeddings passed through a
    gradient reversal layer (coefficient ``weight``), so the features learn to fool it."""

    name = "domain_discriminator"
    settings: ClassVar[dict[str, float | int]] = {"aux_weight": 0.1}

    def __init__(self, dim: int, weight: float, hidden: int = 256) -> None:
        super().__init__()
        self.net = _mlp(dim, hidden, 1)
        self.weight = weight

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(dim, float(cls.setting(params, "aux_weight")))

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        zt = torch.cat([batch.zu, batch.zl]) if len(batch.zl) else batch.zu
        z = grad_reverse(torch.cat([batch.zs, zt]), self.weight)
        y = torch.cat([torch.ones(len(batch.zs)), torch.zeros(len(zt))]).to(z.device)
        loss = nn.functional.binary_cross_entropy_with_logits(self.net(z).squeeze(1), y)
        return loss, {"loss_domain": float(loss.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        return {"domain_source_prob": torch.sigmoid(self.net(z)).squeeze(1).double().cpu().numpy()}


@register_component
class Committee(AuxComponent):
    """``K`` linear energy heads, differently initialised, trained with the energy NLL on source
    and labeled-target embeddings (detached: the committee does not move the features)."""

    name = "committee"
    settings: ClassVar[dict[str, float | int]] = {"committee_size": 3}

    def __init__(self, dim: int, num_classes: int, size: int = 3) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"committee size must be >= 1, got {size}")
        self.heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(size))

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(dim, num_classes, int(cls.setting(params, "committee_size")))

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        z = torch.cat([batch.zs, batch.zl]).detach()
        y = torch.cat([batch.ys, batch.yl])
        loss = torch.stack([energy_ops.energy_nll(h(z), y) for h in self.heads]).mean()
        return loss, {"loss_committee": float(loss.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        e = torch.stack([h(z) for h in self.heads], dim=1)
        return {"committee_energies": e.double().cpu().numpy()}


@register_component
class AdversarialEntropy(AuxComponent):
    """MME's minimax entropy (Saito et al. 2019), CLUE's semi-supervised loss:
    ``L = weight * mean_x sum_y p log p`` with ``p = softmax(-head(GRL(z_u)))``; minimising it
    makes the head MAXIMISE the entropy, and the reversed gradient makes the features minimise it.

    ``active.params.mme_separate_step`` 1: as LADA's ``solver/MMEsolver.py``, the entropy is
    not added to the step's loss but takes an optimiser step of its own after it, on the same
    unlabeled batch (two optimiser steps an iteration); 0 (default): one joint step.
    """

    name = "adversarial_entropy"
    settings: ClassVar[dict[str, float | int]] = {"aux_weight": 0.1, "mme_separate_step": 0}

    def __init__(self, weight: float, separate_step: bool = False) -> None:
        super().__init__()
        self.weight = weight
        self.separate_step = separate_step

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        sep = int(cls.setting(params, "mme_separate_step"))
        if sep not in (0, 1):
            raise ValueError(f"active.params.mme_separate_step must be 0 or 1, got {sep}")
        return cls(float(cls.setting(params, "aux_weight")), bool(sep))

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = torch.log_softmax(-batch.head(grad_reverse(batch.zu, 1.0)), dim=1)
        neg_entropy = (logp.exp() * logp).sum(dim=1).mean()
        return self.weight * neg_entropy, {"entropy_unlabeled": float(-neg_entropy.detach())}


@register_component
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
    settings: ClassVar[dict[str, float | int]] = {"critic_weight": 2e-3}

    def __init__(self, dim: int, weight: float, gp: float = 10.0, hidden: int = 256) -> None:
        super().__init__()
        self.net = _mlp(dim, hidden, 1)
        self.weight, self.gp = weight, gp

    def critic(self, z: torch.Tensor) -> torch.Tensor:
        """``c(z)`` in ``[0, 1]``, shape ``(N,)``."""
        return torch.sigmoid(self.net(z)).squeeze(1)

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(dim, float(cls.setting(params, "critic_weight")))

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


evidential_loss = energy_ops.evidential_loss
"""DUC's evidential loss ``(NLL, KL)``, in log space: :func:`eada.energy.evidential_loss`."""


@register_component
class Evidential(AuxComponent):
    """DUC's training loss (Xie et al., ICLR 2023) on the energy head, ``logits = -E``:

    ``L = w_s [NLL(S) + KL(S) / C] + [NLL(T_l) + KL(T_l) / C]
    + beta * U_dis(T_u) + lambda * U_data(T_u)``

    (:func:`eada.energy.evidential_loss`, :func:`eada.energy.dirichlet_uncertainties_stable`:
    the authors' quantities computed in log space, finite for every finite logit where their
    float32 code gives NaN or a negative KL; the unlabeled terms only when ``beta > 0``, as in
    their ``main.py``). ``beta`` = ``active.params.duc_beta`` (their ``TRAINER.BETA``, 1.0),
    ``lambda`` = ``active.params.duc_lambda`` (``TRAINER.LAMBDA``, 0.05), ``w_s`` =
    ``active.params.duc_source_weight`` from the second epoch on (1.0; their VisDA-2017 run
    halves the source terms after epoch 1, ``main.py:148-150``: 0.5 in
    ``configs/duc_visda2017.yaml``).

    As their ``main.py``, the runner (:mod:`eada.train.aux`) embeds the source, unlabeled and
    labeled batches in separate forward passes (:attr:`per_domain_forward`: batch-norm
    statistics per domain) and draws the target batches without replacement
    (:attr:`without_replacement`: a shuffled pass over the set, the unlabeled one dropping its
    last incomplete batch, as their loaders).

    Example:
        >>> torch.manual_seed(0) and None
        >>> z = torch.randn(6, 4)
        >>> batch = StepBatch(z[:2], torch.tensor([0, 1]), z[2:4], z[4:], torch.tensor([2, 0]),
        ...                   nn.Linear(4, 3))
        >>> loss, logs = Evidential(1.0, 0.05).loss(batch)
        >>> sorted(logs), bool(torch.isfinite(loss))
        (['duc_kl', 'duc_nll', 'duc_u_data', 'duc_u_dis'], True)
    """

    name = "evidential"
    settings: ClassVar[dict[str, float | int]] = {
        "duc_beta": 1.0,
        "duc_lambda": 0.05,
        "duc_source_weight": 1.0,
    }
    per_domain_forward = True
    without_replacement = True

    def __init__(self, beta: float, lam: float, source_weight: float = 1.0) -> None:
        super().__init__()
        self.beta, self.lam, self.source_weight = beta, lam, source_weight

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(
            float(cls.setting(params, "duc_beta")),
            float(cls.setting(params, "duc_lambda")),
            float(cls.setting(params, "duc_source_weight")),
        )

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logits_s = -batch.head(batch.zs)
        c = logits_s.shape[1]
        nll, kl = evidential_loss(logits_s, batch.ys)
        w_s = self.source_weight if batch.access is not None and batch.access.epoch > 0 else 1.0
        total = w_s * (nll + kl / c)
        logs = {"duc_nll": float(nll.detach()), "duc_kl": float(kl.detach())}
        if len(batch.zl):
            nll_t, kl_t = evidential_loss(-batch.head(batch.zl), batch.yl)
            total = total + nll_t + kl_t / c
        if self.beta > 0 and len(batch.zu):
            u_dis, u_data = energy_ops.dirichlet_uncertainties_stable(-batch.head(batch.zu))
            total = total + self.beta * u_dis.mean() + self.lam * u_data.mean()
            logs["duc_u_dis"] = float(u_dis.mean().detach())
            logs["duc_u_data"] = float(u_data.mean().detach())
        return total, logs


@register_component
class LogitDiscriminator(AuxComponent):
    """LADA's DANN solver (``solver/solver.py``, ``DANNSolver``): a discriminator
    ``MLP(C -> 500 -> 500 -> 2)`` on the classifier's logits ``-E`` of the source and unlabeled
    batches through a gradient reversal, trained with the domain cross-entropy, plus the
    conditional entropy of the unlabeled predictions:

    ``L = dann_weight x CE(D(GRL([-E_s; -E_u])), domain) + dann_entropy_weight x H(p_u)``

    (their ``ADA.UNSUP_WT`` 0.1 and ``ADA.CEN_WT`` 0.1; 0.1 and 0.01 in their UDA stage). Its
    parameters train with the runner's optimiser (Adam, ``aux_lr``; theirs Adadelta at the
    adaptation lr). Our ``domain_discriminator`` (AADA, TQS) is the other design: an MLP on
    the embeddings with a binary loss. Pool score ``domain_source_prob`` (AADA reads it).

    Example:
        >>> torch.manual_seed(0) and None
        >>> z = torch.randn(8, 4)
        >>> batch = StepBatch(z[:4], torch.tensor([0, 1, 2, 0]), z[4:], z[:0], torch.tensor([]),
        ...                   nn.Linear(4, 3))
        >>> loss, logs = LogitDiscriminator(3, 0.1, 0.1).loss(batch)
        >>> sorted(logs)
        ['dann_domain', 'dann_entropy']
    """

    name = "logit_discriminator"
    settings: ClassVar[dict[str, float | int]] = {"dann_weight": 0.1, "dann_entropy_weight": 0.1}

    def __init__(self, num_classes: int, weight: float, entropy_weight: float) -> None:
        super().__init__()
        self.disc = nn.Sequential(
            nn.Linear(num_classes, 500),
            nn.ReLU(),
            nn.Linear(500, 500),
            nn.ReLU(),
            nn.Linear(500, 2),
        )
        self.weight, self.entropy_weight = weight, entropy_weight
        self.head: nn.Module | None = None

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(
            num_classes,
            float(cls.setting(params, "dann_weight")),
            float(cls.setting(params, "dann_entropy_weight")),
        )

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        self.head = batch.head
        if not len(batch.zu):
            return batch.zs.sum() * 0.0, {}
        logits_s, logits_u = -batch.head(batch.zs), -batch.head(batch.zu)
        pred = self.disc(grad_reverse(torch.cat([logits_s, logits_u]), 1.0))
        domain = torch.cat(
            [
                torch.ones(len(logits_s), dtype=torch.long),
                torch.zeros(len(logits_u), dtype=torch.long),
            ]
        ).to(pred.device)
        loss_d = nn.functional.cross_entropy(pred, domain)
        logp = torch.log_softmax(logits_u, dim=1)
        cent = -(logp.exp() * logp).sum(dim=1).mean()
        total = self.weight * loss_d + self.entropy_weight * cent
        return total, {"dann_domain": float(loss_d.detach()), "dann_entropy": float(cent.detach())}

    @torch.no_grad()
    def pool_scores(self, z: torch.Tensor) -> dict[str, np.ndarray]:
        if self.head is None:
            return {}
        p = torch.softmax(self.disc(-self.head(z)), dim=1)[:, 1]  # class 1 = source
        return {"domain_source_prob": p.double().cpu().numpy()}


@register_component
class ClassConfusion(AuxComponent):
    """MCC (Jin et al., ECCV 2020) as a semi-supervised solver, LADA's ``solver/MCCsolver.py``:
    ``mcc_weight x`` :func:`eada.energy.min_class_confusion` of the unlabeled batch at
    temperature ``mcc_temperature`` (2.5, the MCC paper's; LADA's code divides by
    ``MODEL.TEMP`` = 0.05), added to the step's loss; no pool score.

    Example:
        >>> torch.manual_seed(0) and None
        >>> z = torch.randn(8, 4)
        >>> batch = StepBatch(z[:2], torch.tensor([0, 1]), z[2:], z[:0], torch.tensor([]),
        ...                   nn.Linear(4, 3))
        >>> loss, logs = ClassConfusion(1.0, 2.5).loss(batch)
        >>> sorted(logs), 0 <= float(loss.detach()) <= 1
        (['mcc'], True)
    """

    name = "class_confusion"
    settings: ClassVar[dict[str, float | int]] = {"mcc_weight": 1.0, "mcc_temperature": 2.5}

    def __init__(self, weight: float, temperature: float) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"active.params.mcc_temperature must be > 0, got {temperature}")
        self.weight, self.temperature = weight, temperature

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        return cls(
            float(cls.setting(params, "mcc_weight")), float(cls.setting(params, "mcc_temperature"))
        )

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if len(batch.zu) < 2:
            return batch.zs.sum() * 0.0, {}
        mcc = energy_ops.min_class_confusion(batch.head(batch.zu), self.temperature)
        return self.weight * mcc, {"mcc": float(mcc.detach())}


@register_component
class AdaptiveClustering(AuxComponent):
    """CDAC (Li et al., CVPR 2021) as a semi-supervised solver, LADA's
    ``solver/CDACsolver.py``: after the step's supervised loss, an optimiser step of its own
    (:attr:`separate_step`) on ``cdac_weight x (L_aac + L_pl + L_con)``
    (:func:`eada.energy.cdac_losses`) of the step's unlabeled batch and two ``strong`` views
    of it: ``L_aac`` through a gradient reversal into the head (adversarial), the
    pseudo-labels at ``cdac_threshold`` (0.95), the pairwise targets from the ``cdac_topk``
    (5) largest embedding dimensions, the consistency weight ``30 x`` :func:`sigmoid_rampup`
    over ``cdac_rampup`` (20,000) steps. Their solver weights it ``UNSUP_WT x 10`` = 1.0 and
    skips it while no target sample is labeled (so does this one). No pool score.
    """

    name = "adaptive_clustering"
    settings: ClassVar[dict[str, float | int]] = {
        "cdac_weight": 1.0,
        "cdac_threshold": 0.95,
        "cdac_topk": 5,
        "cdac_rampup": 20000,
    }
    strong_views = 2

    def __init__(self, weight: float, threshold: float, topk: int, rampup: int) -> None:
        super().__init__()
        self.weight, self.threshold, self.topk, self.rampup = weight, threshold, topk, rampup
        self.separate_step = True

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        topk = int(cls.setting(params, "cdac_topk"))
        if not 1 <= topk <= dim:
            raise ValueError(f"active.params.cdac_topk must lie in [1, {dim}], got {topk}")
        return cls(
            float(cls.setting(params, "cdac_weight")),
            float(cls.setting(params, "cdac_threshold")),
            topk,
            int(cls.setting(params, "cdac_rampup")),
        )

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        labeled = batch.access is None or len(batch.access.labeled) > 0
        if len(batch.zu) < 2 or len(batch.zu_views) < 2 or not labeled:
            return batch.zu.sum() * 0.0, {}
        step = batch.access.step if batch.access is not None else 0
        w_con = 30.0 * energy_ops.sigmoid_rampup(step, self.rampup)
        z_bar, z_bar2 = batch.zu_views[:2]
        aac, pl, con = energy_ops.cdac_losses(
            batch.head(grad_reverse(batch.zu, 1.0)),
            batch.head(grad_reverse(z_bar, 1.0)),
            batch.head(z_bar2),
            batch.zu,
            threshold=self.threshold,
            topk=self.topk,
            consistency_weight=w_con,
        )
        # the pseudo-labels and the consistency see the views without the reversal (theirs:
        # net.forward_emb(feat)); L_aac above sees them through it
        e_plain, e_bar = batch.head(batch.zu), batch.head(z_bar)
        _, pl, con = energy_ops.cdac_losses(
            e_plain,
            e_bar,
            batch.head(z_bar2),
            batch.zu,
            threshold=self.threshold,
            topk=self.topk,
            consistency_weight=w_con,
        )
        total = self.weight * (aac + pl + con)
        logs = {
            "cdac_aac": float(aac.detach()),
            "cdac_pl": float(pl.detach()),
            "cdac_con": float(con.detach()),
        }
        return total, logs


def class_balance(anchor_labels: np.ndarray, num_classes: int) -> np.ndarray:
    """LADA's acceptance probability of a pseudo-label per class from the anchor set's labels:
    with ``d = counts + 1``, ``1 - d / max d + min d / max d`` (1 for the rarest class).

    Example:
        >>> class_balance(np.array([0, 0, 0, 1]), 3).round(3).tolist()
        [0.25, 0.75, 1.0]
    """
    d = np.bincount(np.asarray(anchor_labels, dtype=np.int64), minlength=num_classes) + 1.0
    return 1.0 - d / d.max() + d.min() / d.max()


def accept_anchors(
    candidates: np.ndarray,
    probs: np.ndarray,
    anchor_labels: np.ndarray,
    anchored: set[int],
    threshold: float,
    uniforms: np.ndarray,
) -> tuple[list[int], list[int]]:
    """The candidates that join the anchor set, with their pseudo-labels, in candidate order.

    Candidate ``i`` (target position ``candidates[i]``, posteriors ``probs[i]``) joins when
    ``uniforms[i] <= class_balance(anchor_labels)[argmax p]``, ``max p >= threshold`` and it is
    not in ``anchored`` (the anchor set before this batch: like the authors' loop, a position
    drawn twice in one batch joins twice).

    Example:
        >>> p = np.array([[0.95, 0.05], [0.6, 0.4], [0.02, 0.98]])
        >>> accept_anchors(np.array([4, 5, 6]), p, np.array([0]), {1}, 0.9, np.zeros(3))
        ([4, 6], [0, 1])
    """
    sp = class_balance(anchor_labels, probs.shape[1])
    idx, lab = [], []
    for i, pos in enumerate(np.asarray(candidates).tolist()):
        pl = int(np.argmax(probs[i]))
        if uniforms[i] <= sp[pl] and probs[i].max() >= threshold and pos not in anchored:
            idx.append(int(pos))
            lab.append(pl)
    return idx, lab


def local_candidates(
    queries: torch.Tensor, cache: torch.Tensor, k: int, columns: torch.Tensor
) -> torch.Tensor:
    """LAA's candidates: for each query embedding, its ``columns[i]``-th (0-based, ``< k``) most
    cosine-similar row of ``cache`` (normalised target embeddings; the query's own row may be
    among them, as in the authors' code).

    Example:
        >>> cache = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
        >>> local_candidates(torch.tensor([[1.0, 0.1]]), cache, 2, torch.tensor([1])).tolist()
        [2]
    """
    sims = nn.functional.normalize(queries, dim=1) @ cache.T
    top = torch.topk(sims, k=min(k, cache.shape[0]), dim=1).indices
    return torch.gather(top, 1, columns.view(-1, 1)).squeeze(1)


class AnchorAugmentation(AuxComponent):
    """LADA's anchor-set augmentation (Sun et al., ICCV 2023; their ``solver/PAAsolver.py``).

    At each epoch's first step the anchor set is the labeled target (positions and oracle
    labels); every step trains the energy NLL on a batch of it (asked through
    :meth:`target_request`, so the features learn from it), then, while the anchor set is
    smaller than the target set, draws as many candidates as the batch has rows (RAA: uniform
    target positions; LAA: for each anchor of the batch, one of its ``K`` most similar target
    embeddings, uniformly, from embeddings cached at the epoch's start and refreshed for each
    candidate seen) and adds those :func:`accept_anchors` accepts, pseudo-labeled. Settings:
    ``anchor_neighbours`` (``LADA.A_K``, 10; 5 in their Office-31 config; 0 switches the
    augmentation off), ``anchor_threshold`` (``LADA.A_TH``, 0.9), ``anchor_mixup_alpha``
    (0: off, the default; their code 0.2): each anchor's input is mixed with an ``anchor``
    (RandAugment) view of the same image, ``x' = m x + (1 - m) x_aug``, ``m ~ Beta(a, a)``
    per anchor (their ``A_RAND_NUM`` = 1 view; the runner, :mod:`eada.train.aux`, does it).
    In-memory inputs (features, digits) have no such view, so there it changes nothing.

    Differences from their code: candidates embedded in eval mode, and a candidate step
    before the optimiser's step rather than after it.
    """

    name: ClassVar[str] = "anchor_augmentation"
    local: ClassVar[bool] = False
    settings: ClassVar[dict[str, float | int]] = {
        "anchor_neighbours": 10,
        "anchor_threshold": 0.9,
        "anchor_mixup_alpha": 0.0,
    }

    def __init__(
        self, num_classes: int, k: int, threshold: float, mixup_alpha: float = 0.0
    ) -> None:
        super().__init__()
        self.num_classes, self.k, self.threshold = num_classes, k, threshold
        self.mixup_alpha = mixup_alpha
        seed = int(torch.randint(2**31 - 1, (1,)))
        self.generator = torch.Generator().manual_seed(seed)
        self.np_rng = np.random.default_rng(seed)
        self.anchor_idx: list[int] = []
        self.anchor_lab: list[int] = []
        self.cache: torch.Tensor | None = None
        self._started = False

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        """See :meth:`AuxComponent.from_params`."""
        k = int(cls.setting(params, "anchor_neighbours"))
        th = float(cls.setting(params, "anchor_threshold"))
        alpha = float(cls.setting(params, "anchor_mixup_alpha"))
        if k < 0 or not 0.0 <= th <= 1.0 or alpha < 0:
            raise ValueError(
                f"active.params: anchor_neighbours must be >= 0, anchor_threshold in [0, 1] and "
                f"anchor_mixup_alpha >= 0, got {k}, {th} and {alpha}"
            )
        return cls(num_classes, k, th, alpha)

    def get_extra_state(self) -> dict[str, Any]:
        """The random streams (checkpoints; the anchor set restarts every epoch)."""
        return {"generator": self.generator.get_state(), "np_rng": self.np_rng.bit_generator.state}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_extra_state`."""
        self.generator.set_state(state["generator"])
        self.np_rng.bit_generator.state = state["np_rng"]

    def reset(self, access: TargetAccess) -> None:
        """The anchor set = the labeled target; LAA caches every target embedding."""
        self.anchor_idx = access.labeled.tolist()
        self.anchor_lab = access.labels[access.labeled].tolist()
        self.cache = None
        if self.local and self.k > 0 and len(self.anchor_idx):
            rows = [
                access.embed(torch.arange(a, min(a + 1024, access.n)))
                for a in range(0, access.n, 1024)
            ]
            self.cache = nn.functional.normalize(torch.cat(rows).float().cpu(), dim=1)

    def target_request(self, access: TargetAccess) -> tuple[torch.Tensor, torch.Tensor] | None:
        if access.new_epoch or not self._started:
            self.reset(access)
            self._started = True
        if not self.anchor_idx:
            return None
        take = torch.randperm(len(self.anchor_idx), generator=self.generator)
        take = take[: min(access.batch_size, len(self.anchor_idx))]
        idx = torch.tensor(self.anchor_idx)[take]
        return idx, torch.tensor(self.anchor_lab)[take]

    def candidates(self, za: torch.Tensor, n: int) -> torch.Tensor:
        """RAA: ``len(za)`` uniform target positions (LAA overrides)."""
        return torch.randint(n, (len(za),), generator=self.generator)

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if self.name not in batch.requested or batch.access is None:
            return batch.zs.sum() * 0.0, {}
        za, ya = batch.requested[self.name]
        loss = energy_ops.energy_nll(batch.head(za), ya)
        access = batch.access
        added: list[int] = []
        if self.k > 0 and len(self.anchor_idx) < access.n:
            with torch.no_grad():
                cand = self.candidates(za.detach().float().cpu(), access.n)
                zc = access.embed(cand)
                probs = torch.softmax(-batch.head(zc), dim=1).double().cpu().numpy()
                if self.cache is not None:
                    self.cache[cand] = nn.functional.normalize(zc.float().cpu(), dim=1)
            added, labels = accept_anchors(
                cand.numpy(),
                probs,
                np.asarray(self.anchor_lab),
                set(self.anchor_idx),
                self.threshold,
                self.np_rng.random(len(cand)),
            )
            self.anchor_idx += added
            self.anchor_lab += labels
        return loss, {"loss_anchors": float(loss.detach()), "anchors": float(len(self.anchor_idx))}


@register_component
class RandomAnchors(AnchorAugmentation):
    """LADA's RAA: :class:`AnchorAugmentation` with uniformly random candidates."""

    name = "random_anchors"


@register_component
class LocalAnchors(AnchorAugmentation):
    """LADA's LAA: :class:`AnchorAugmentation` with candidates among each anchor's ``K``
    nearest cached target embeddings (:func:`local_candidates`)."""

    name = "local_anchors"
    local = True

    def candidates(self, za: torch.Tensor, n: int) -> torch.Tensor:
        assert self.cache is not None
        k = min(self.k, n)
        cols = torch.randint(k, (len(za),), generator=self.generator)
        return local_candidates(za, self.cache, k, cols)


COMPONENTS = tuple(COMPONENT_CLASSES)
"""Every training component's name (from the registered classes, so it cannot drift)."""

TRAINING_SETTINGS: dict[str, Any] = {"aux_components": None, "aux_lr": 1e-3}
"""The ``active.params`` keys that the components' runner (:class:`~eada.train.aux.AuxTraining`)
reads: which components (default: :data:`STRATEGY_COMPONENTS` of the strategy) and their
optimiser's learning rate."""

COMPONENT_PARAMS = tuple(
    sorted({*TRAINING_SETTINGS, *(k for c in COMPONENT_CLASSES.values() for k in c.settings)})
)
"""The ``active.params`` keys the training components read (validated in the config): the
runner's :data:`TRAINING_SETTINGS` and every component's declared :attr:`AuxComponent.settings`.
"""
