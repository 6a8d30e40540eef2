r"""Energy maths of EADA: energies, free energy, MvSM, the NLL loss and free-energy alignment.

Notation (paper, Sec. "Energy-based Models Revisit"): a classifier with $C$ classes outputs an
energy $E(x, y)$ for every class; lower energy = more likely. The network's raw output is taken
as the energy (the authors' convention), so $E = f_\theta(x)$; a model trained with ordinary
cross-entropy on logits $z$ corresponds to $E = -z$ (see :func:`energy_from_logits`).

Every function accepts a ``(N, C)`` tensor of energies and works per row.

Example:
    >>> import torch
    >>> E = torch.tensor([[0.0, 1.0, 3.0]])
    >>> free_energy(E)  # -log(e^0 + e^-1 + e^-3)
    tensor([-0.3490])
    >>> mvsm(E)  # E(y*) - E(y') = 0 - 1
    tensor([-1.])
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "ALIGNMENTS",
    "FEA_GATES",
    "AlignmentDriftWarning",
    "AlignmentRunawayWarning",
    "DeltaEstimator",
    "alignment_drift",
    "alignment_free_energy",
    "alignment_runaway",
    "alignment_scale",
    "balanced_free_energy",
    "centered_free_energy",
    "energy_from_logits",
    "energy_nll",
    "fea_gate_weight",
    "fea_sample_weights",
    "free_energy",
    "free_energy_alignment_loss",
    "mvsm",
    "normalized_free_energy",
]


def energy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    r"""Energies of a model that outputs logits: $E(x, y) = -z_y(x)$.

    EADA's models output energies directly; use this to score a model trained with the usual
    "higher logit = more likely" convention.

    Example:
        >>> import torch
        >>> energy_from_logits(torch.tensor([[2.0, -1.0]]))
        tensor([[-2.,  1.]])
    """
    return -logits


def free_energy(energies: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""Free energy $F(x) = -\frac{1}{\tau} \log \sum_y \exp(-\tau E(x, y))$.

    At $\tau = 1$ this is the paper's Eq. (5), $F(x) = -\log \sum_y \exp(-E(x, y))$. ``tau`` is
    the paper's *reverse* temperature $\tau$ (Eq. 6); lower $F$ means the model finds $x$ more
    probable ($p(x) \propto \exp(-F(x))$). Computed with a stable log-sum-exp.

    Args:
        energies: ``(N, C)`` energies.
        tau: reverse temperature, ``> 0``.

    Returns:
        ``(N,)`` free energies.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 0.5]])
        >>> free_energy(E)  # -log(e^0 + e^-1 + e^-3), -log(2 e^-2 + e^-0.5)
        tensor([-0.3490,  0.1310])
        >>> free_energy(E, tau=2.0)  # -(1/2) log sum_y exp(-2 E(x, y))
        tensor([-0.0646,  0.4525])
    """
    _check_energies(energies)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return -torch.logsumexp(-tau * energies, dim=1) / tau


def centered_free_energy(energies: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""Shift-invariant free energy $G(x) = F(x) - \frac{1}{C} \sum_y E(x, y)$.

    The energy NLL $E(x, y) - F(x)$ (and so the prediction) does not change when a constant
    $c(x)$ is added to all energies of a sample; $F$ moves by exactly $c(x)$. So $F$ is
    the sum of a *common mode* $\frac{1}{C} \sum_y E(x, y)$, which no supervised term
    constrains, and $G$, which depends only on the *shape* of the energies,
    $E(x, \cdot) - \frac{1}{C} \sum_y E(x, y)$, that the NLL trains. $G$ is a confidence:
    $G \le -\log(C) / \tau$ (Jensen), with equality for equal energies, and it falls as one
    class's energy drops below the others. Its gradient
    $\partial G / \partial E(x, y) = p(y|x) - 1/C$ sums to zero over the classes, so a loss on
    $G$ gives the common mode no gradient (it can still move as a side effect of shared weights,
    but $G$ does not depend on it; $\partial F / \partial E(x, y) = p(y|x)$ sums to one: every
    step of a loss on $F$ pushes the common mode of the energies by the same amount, and nothing
    pushes back).

    Args:
        energies: ``(N, C)`` energies.
        tau: reverse temperature, ``> 0``.

    Returns:
        ``(N,)`` centred free energies.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0], [10.0, 11.0, 13.0], [2.0, 2.0, 2.0]])
        >>> free_energy(E)  # rows 1 and 2 differ only by the common mode (+10)
        tensor([-0.3490,  9.6510,  0.9014])
        >>> centered_free_energy(E)  # ... which G ignores; row 3 (uniform) sits at -log 3
        tensor([-1.6823, -1.6823, -1.0986])
    """
    return free_energy(energies, tau) - energies.mean(dim=1)


def balanced_free_energy(energies: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""Centred free energy of a batch's energies taken relative to the batch's mean energy of
    each class: $B(x_i) = G\big(E(x_i, \cdot) - \frac{1}{N} \sum_j E(x_j, \cdot)\big)$
    (:func:`centered_free_energy`).

    ``G`` fixes the per-sample common mode, but a loss that lowers ``G`` on unlabeled samples
    still sharpens every sample towards the class the model already prefers, and lowering one
    class's energy on all samples does that for all at once: the classes predicted most grow,
    the others vanish (measured on Office-Caltech10 SURF webcam->Caltech10, BENCHMARKS.md). Taking
    each class's energy relative to its batch mean removes that direction: the gradient of
    ``sum_i B(x_i)`` is ``p~(y|x_i) - mean_j p~(y|x_j)`` (``p~`` = softmax of the recentred
    energies), which sums to 0 over the classes of a sample AND over the samples of a class, so
    the loss sharpens each sample relative to the batch but gives the batch's class means (and
    so its class marginal) no gradient; they can still move as a side effect of shared weights.
    ``B <= -log(C) / tau`` like ``G``.

    Args:
        energies: ``(N, C)`` energies of one batch (``N >= 1``; with ``N = 1`` every sample
            sits at the bound and the loss is flat).
        tau: reverse temperature, ``> 0``.

    Returns:
        ``(N,)`` values.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0], [0.0, 3.0, 1.0]])
        >>> centered_free_energy(E)  # both confident in class 0
        tensor([-1.6823, -1.6823])
        >>> balanced_free_energy(E)  # class 0 is every sample's choice: no evidence for it
        tensor([-1.4076, -1.4076])
        >>> balanced_free_energy(E + torch.tensor([5.0, 0.0, 0.0]))  # nor against it
        tensor([-1.4076, -1.4076])
    """
    _check_energies(energies)
    return centered_free_energy(energies - energies.mean(dim=0, keepdim=True), tau)


def alignment_scale(*batches: torch.Tensor, floor: float = 1.0) -> torch.Tensor:
    r"""The energy scale ``sigma`` of the ``normalized`` alignment: the root mean square of the
    batches' recentred energies,
    $\sqrt{\operatorname{mean}_{i,y} (E(x_i,y) - \operatorname{mean}_j E(x_j,y) - m_i)^2}$
    (each batch taken relative to its own class means, ``m_i`` the sample's remaining mean over
    the classes), over all given batches together, and at least ``floor`` nats.

    Gradients flow through it: a loss on ``E / sigma`` is then unchanged when every energy of
    the batches is multiplied by the same ``k`` (while ``sigma >= floor``), so it gives that
    direction no gradient. Below ``floor`` the energies are left as they are (the early epochs,
    when they start near 0).

    Args:
        batches: ``(N_b, C)`` energies, e.g. a source batch and an unlabeled target batch.
        floor: the least scale, in nats (``> 0``).

    Returns:
        a 0-dim tensor.

    Example:
        >>> import torch
        >>> Es = torch.tensor([[0.0, 4.0], [4.0, 0.0]])
        >>> Et = torch.tensor([[0.0, 2.0], [2.0, 0.0]])
        >>> alignment_scale(Es, Et)  # recentred: +-2 (source) and +-1 (target)
        tensor(1.5811)
        >>> alignment_scale(Es / 10, Et / 10)  # below 1 nat: left as it is
        tensor(1.)
    """
    if not batches:
        raise ValueError("alignment_scale needs at least one batch of energies")
    if floor <= 0:
        raise ValueError(f"floor must be > 0, got {floor}")
    squares = []
    for energies in batches:
        _check_energies(energies)
        rec = energies - energies.mean(dim=0, keepdim=True)
        squares.append((rec - rec.mean(dim=1, keepdim=True)).pow(2).flatten())
    # clamp the mean square, then take the root: sqrt's gradient at 0 is infinite, and
    # 0 * inf = NaN would reach every weight when all recentred energies are 0 (a
    # zero-initialised head, one-sample batches)
    return torch.clamp(torch.cat(squares).mean(), min=floor * floor).sqrt()


def normalized_free_energy(
    energies: torch.Tensor, scale: torch.Tensor | float, tau: float = 1.0
) -> torch.Tensor:
    r"""Scale-free balanced free energy $N(x_i) = B(E(x_i, \cdot) / \sigma)$: the balanced free
    energy (:func:`balanced_free_energy`) of the energies divided by the joint scale ``sigma``
    of the source and target batches (:func:`alignment_scale`).

    ``G`` and ``B`` fix the common mode and the class marginal, but not the *scale*: multiplying
    every energy by ``k > 1`` makes every sample more confident and lowers ``B`` of both domains
    about ``k``-fold. An alignment loss on ``B`` can therefore lower itself by growing the
    scale through the shared weights; the source grows with the target, ``Delta`` follows it
    down and the hinge is never met (the confidence feedback measured in BENCHMARKS.md: on SURF
    dslr->amazon ``Delta_B`` fell from -8.4 to -14.9 over epochs 20-50 while the energy scale
    grew 2.2 -> 5.0, against 1.9 -> 2.2 without ``L_fea``, and accuracy fell 1.6-4.4 points from
    its peak on seeds 0-2). Dividing by ``sigma`` leaves what the alignment is for, the
    target's confidence *relative to the source's*, and removes the scale: with ``sigma`` taken
    over both batches (and gradients through it), scaling all energies of both changes neither
    the loss nor ``Delta``, so the loss gives that direction no gradient, and ``Delta`` stays
    bounded: ``-log(C) / tau >= N >= -log(C) / tau - sqrt(n C)`` for ``n`` samples in the
    batches ``sigma`` is taken over (``N = -log(C)/tau - (1/tau) log mean_y exp(-tau d_y)`` with
    ``d`` the sample's recentred energies over ``sigma``, so ``N >= -log(C)/tau - max_y |d_y|``,
    and ``sum_y d_y^2 <= n C`` since ``sigma^2`` is at least the mean of all ``n C`` squares).

    Args:
        energies: ``(N, C)`` energies of one batch.
        scale: ``sigma`` from :func:`alignment_scale` over this batch and the other domain's.
        tau: reverse temperature, ``> 0``.

    Returns:
        ``(N,)`` values.

    Example:
        >>> import torch
        >>> Es = torch.tensor([[0.0, 4.0], [4.0, 0.0]])
        >>> Et = torch.tensor([[0.0, 2.0], [2.0, 0.0]])
        >>> s = alignment_scale(Es, Et)
        >>> normalized_free_energy(Es, s), normalized_free_energy(Et, s)  # source sharper
        (tensor([-1.3416, -1.3416]), tensor([-0.8811, -0.8811]))
        >>> normalized_free_energy(10 * Et, alignment_scale(10 * Es, 10 * Et))  # scale-free
        tensor([-0.8811, -0.8811])
        >>> balanced_free_energy(Et), balanced_free_energy(10 * Et)  # B is not
        (tensor([-1.1269, -1.1269]), tensor([-10., -10.]))
    """
    return balanced_free_energy(energies / scale, tau)


ALIGNMENTS = ("paper", "centered", "balanced", "normalized")
"""The alignment variants (``train.alignment``): which free energy ``L_fea`` and ``Delta`` use.

* ``paper``: ``F`` (Eq. 5), as the paper and the authors' code;
* ``centered``: ``G = F - mean_y E`` (:func:`centered_free_energy`), the shift-invariant part;
* ``balanced``: ``G`` of the energies taken relative to the batch's class means
  (:func:`balanced_free_energy`): neither the common mode nor the class marginal gets a gradient;
* ``normalized``: ``balanced`` divided by the joint energy scale of the source and target
  batches (:func:`normalized_free_energy`): nor does the overall scale.
"""


def alignment_free_energy(
    energies: torch.Tensor,
    alignment: str = "paper",
    tau: float = 1.0,
    scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The free energy the alignment loss compares: ``F`` (``"paper"``), the centred ``G``
    (``"centered"``), ``G`` relative to the batch's class means (``"balanced"``) or that divided
    by the joint energy scale ``scale`` (``"normalized"``, which needs it); see
    :data:`ALIGNMENTS`.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0]])
        >>> alignment_free_energy(E, "paper"), alignment_free_energy(E, "centered")
        (tensor([-0.3490]), tensor([-1.6823]))
    """
    if alignment == "paper":
        return free_energy(energies, tau)
    if alignment == "centered":
        return centered_free_energy(energies, tau)
    if alignment == "balanced":
        return balanced_free_energy(energies, tau)
    if alignment == "normalized":
        if scale is None:
            raise ValueError(
                "alignment 'normalized' needs the joint energy scale (eada.energy.alignment_scale)"
            )
        return normalized_free_energy(energies, scale, tau)
    raise ValueError(f"alignment must be one of {', '.join(ALIGNMENTS)}; got {alignment!r}")


def mvsm(energies: torch.Tensor) -> torch.Tensor:
    r"""Min-versus-Second-Min uncertainty $U(x) = E(x, y^*) - E(x, y')$ (paper Eq. 10).

    ``y*`` is the class of lowest energy and ``y'`` the second lowest, so ``U <= 0``; values
    closest to 0 are the most uncertain. Selection keeps the *highest* ``U``.

    Args:
        energies: ``(N, C)`` energies with ``C >= 2``.

    Returns:
        ``(N,)`` MvSM values.

    Example:
        >>> import torch
        >>> mvsm(torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 0.5]]))  # 0 - 1, 0.5 - 2
        tensor([-1.0000, -1.5000])
    """
    _check_energies(energies)
    if energies.shape[1] < 2:
        raise ValueError(f"MvSM needs at least 2 classes, got {energies.shape[1]}")
    two_lowest = torch.topk(energies, k=2, dim=1, largest=False).values
    return two_lowest[:, 0] - two_lowest[:, 1]


def energy_nll(
    energies: torch.Tensor,
    targets: torch.Tensor,
    tau: float = 1.0,
    reduction: Literal["mean", "sum", "none"] = "mean",
) -> torch.Tensor:
    r"""Energy negative log-likelihood (paper Eq. 6).

    $L_{nll}(x, y) = E(x, y) + \frac{1}{\tau} \log \sum_c \exp(-\tau E(x, c))$. At $\tau = 1$
    this is $E(x, y) - F(x)$, i.e. exactly cross-entropy on $-E$. For $\tau \ne 1$ this is
    $E(x, y) - F_\tau(x)$, the paper's placement, and the authors' NLL is exactly this function
    at any $\tau$ (it is NOT cross-entropy on $-\tau E$). Their second temperature placement
    is in the selection score, $-\tau \log \sum_y \exp(-E(x, y) / \tau)$ (see
    :attr:`eada.train.ActiveDATrainer.selection_tau`); all agree at $\tau = 1$.

    Args:
        energies: ``(N, C)`` energies.
        targets: ``(N,)`` class ids.
        tau: reverse temperature, ``> 0``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 0.5]])
        >>> energy_nll(E, torch.tensor([0, 2]), reduction="none")  # E(x, y) - F(x)
        tensor([0.3490, 0.3690])
        >>> energy_nll(E, torch.tensor([0, 2]))
        tensor(0.3590)
    """
    _check_energies(energies)
    if tau == 1.0:
        return F.cross_entropy(-energies, targets, reduction=reduction)
    per_sample = energies.gather(1, targets[:, None]).squeeze(1) - free_energy(energies, tau)
    if reduction == "none":
        return per_sample
    return per_sample.sum() if reduction == "sum" else per_sample.mean()


def free_energy_alignment_loss(
    energies: torch.Tensor,
    delta: float | torch.Tensor,
    tau: float = 1.0,
    reduction: Literal["mean", "sum", "none"] = "mean",
    alignment: str = "paper",
    scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    r"""Free-energy alignment loss $L_{fea}(x) = \max(0, F(x) - \Delta)$ (paper Eq. 8).

    Pulls the free energy of unlabeled target samples down to the source level $\Delta$ (see
    :class:`DeltaEstimator`); samples already below $\Delta$ cost nothing. With
    ``alignment="centered"`` the loss is $\max(0, G(x) - \Delta)$ with the shift-invariant
    $G = F - \frac{1}{C} \sum_y E$ (:func:`centered_free_energy`), and $\Delta$ must then be
    the running source mean of $G$: the loss sees only what the NLL sees, so it cannot lower
    itself by moving the unconstrained common mode of the energies (it gives that mode no
    gradient). $G \le -\log(C) / \tau$, so each sample's loss is at most
    $-\log(C) / \tau - \Delta$ and its gradient norm below 1.

    Args:
        energies: ``(N, C)`` energies of unlabeled target samples.
        delta: the running source level of the same free energy (no gradient flows into it).
        tau: reverse temperature for the free energy.
        reduction: ``"mean"`` (the paper's expectation), ``"sum"`` or ``"none"``.
        alignment: ``"paper"`` (``F``), ``"centered"`` (``G``), ``"balanced"`` (``G`` relative
            to the batch's class means: ``energies`` must then be one batch) or
            ``"normalized"`` (``balanced`` over the joint energy scale ``scale``), see
            :data:`ALIGNMENTS`.
        scale: the joint energy scale of the source and target batches
            (:func:`alignment_scale`), for ``alignment="normalized"`` only.

    Example:
        >>> import torch
        >>> E = torch.tensor([[0.0, 1.0, 3.0], [-50.0, -49.0, -47.0]])
        >>> free_energy_alignment_loss(E, delta=-1.0, reduction="none")  # shift pays
        tensor([0.6510, 0.0000])
        >>> free_energy_alignment_loss(E, delta=-2.0, reduction="none", alignment="centered")
        tensor([0.3177, 0.3177])
    """
    if isinstance(delta, torch.Tensor):
        delta = delta.detach()
    values = alignment_free_energy(energies, alignment, tau, scale)
    per_sample = torch.clamp(values - delta, min=0.0)
    if reduction == "none":
        return per_sample
    return per_sample.sum() if reduction == "sum" else per_sample.mean()


FEA_GATES = ("none", "dann", "labels", "confidence", "zero")
r"""The gates of ``L_fea`` (``train.fea_gate``): the weight ``w`` in ``gamma * w * L_fea``.

* ``none``: ``w = 1`` throughout (the paper, every run before the option existed, and the
  default until a paired 20-seed comparison made ``labels`` the default: BENCHMARKS.md,
  "A paired ablation of L_fea");
* ``dann``: $w(p) = \frac{2}{1 + e^{-10 p}} - 1$ with ``p`` the share of the run's training
  steps done, the schedule of DANN's gradient-reversal weight (Ganin et al., 2016): the
  alignment starts at 0 while the target predictions are the source classifier's alone and
  reaches 0.76 at ``p = 0.2`` and 0.99 at ``p = 0.5``;
* ``labels`` (the default): ``w = n_l / n_planned``, the share of the run's planned target
  labels already given (0 before the first round, 1 after the last; 1 in a run without
  rounds; in a project store, of the project's whole schedule,
  :class:`eada.train.GateSchedule`);
* ``confidence``: per sample, ``w_i = (p_i - 1/C) / (1 - 1/C)`` with ``p_i = max_y p(y|x_i)``
  the model's own confidence (no gradient; :func:`fea_sample_weights`): a sample on the
  decision boundary gets no push, a confident one the full push, so the alignment leaves the
  borderline samples, those a few labels can still flip, to the NLL;
* ``zero``: ``w = 0``: ``L_fea`` is computed on the unlabeled batches (logged, and ``Delta``
  still drawn) but adds nothing to the loss. This is EADA without ``L_fea`` as a *paired*
  ablation (the ``eada_no_fea`` method): the run draws the same batches and random numbers as
  EADA under the same seed, and the unlabeled batches still pass through the model in training
  mode (so batch-norm statistics see them, as in EADA), so the only change is the loss term.
  ``train.gamma: 0`` instead draws no unlabeled batch at all, so under the same seed it trains
  on other source batches (BENCHMARKS.md "A paired ablation of ``L_fea``").

Why: the alignment sharpens the target's *current* predictions. Where the source classifier
is below chance on the target (two-class SURF amazon->webcam, laptop vs monitor: 27-37 % before
the first label) it entrenches wrong predictions; a gate holds it back until training (``dann``)
or the labels (``labels``) have had their say. BENCHMARKS.md, "Two-class tasks".
"""


def fea_gate_weight(gate: str, progress: float, labeled_share: float = 1.0) -> float:
    """The weight ``w`` of ``L_fea`` under ``gate`` (:data:`FEA_GATES`).

    Args:
        gate: one of :data:`FEA_GATES` (``"confidence"`` gives 1 here, its weights are per
            sample: :func:`fea_sample_weights`; ``"zero"`` gives 0).
        progress: the share of the run's training steps done, in ``[0, 1]`` (``dann``).
        labeled_share: the share of the run's planned target labels given, in ``[0, 1]``
            (``labels``).

    Example:
        >>> fea_gate_weight("none", 0.0), fea_gate_weight("dann", 0.0)
        (1.0, 0.0)
        >>> round(fea_gate_weight("dann", 0.2), 4), round(fea_gate_weight("dann", 1.0), 4)
        (0.7616, 0.9999)
        >>> fea_gate_weight("labels", 0.3, labeled_share=0.4)
        0.4
        >>> fea_gate_weight("zero", 0.5)
        0.0
    """
    for name, v in (("progress", progress), ("labeled_share", labeled_share)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"fea_gate_weight: {name} must be in [0, 1]; got {v}")
    if gate == "none":
        return 1.0
    if gate == "dann":
        return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0
    if gate == "labels":
        return float(labeled_share)
    if gate == "confidence":  # per sample: fea_sample_weights
        return 1.0
    if gate == "zero":
        return 0.0
    raise ValueError(f"train.fea_gate must be one of {', '.join(FEA_GATES)}; got {gate!r}")


def fea_sample_weights(energies: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Per-sample weights of ``L_fea`` under ``train.fea_gate: confidence``:
    ``w_i = (p_i - 1/C) / (1 - 1/C)`` with ``p_i = max_y softmax(-tau E_i)_y``, in ``[0, 1]``
    (0 on the decision boundary, 1 for a certain prediction), without gradient.

    Example:
        >>> import torch
        >>> fea_sample_weights(torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]]))
        tensor([0.0000, 0.5000])
    """
    _check_energies(energies)
    c = energies.shape[1]
    if c < 2:
        raise ValueError(f"fea_sample_weights needs at least 2 classes; got {c}")
    p = torch.softmax(-tau * energies.detach().float(), dim=1).amax(dim=1)
    return ((p - 1.0 / c) / (1.0 - 1.0 / c)).clamp(0.0, 1.0)


class DeltaEstimator:
    r"""Running estimate ``Delta`` of the mean source free energy.

    After each source batch with mean free energy ``d``:
    $\Delta \leftarrow \lambda \Delta + (1 - \lambda)\, d$; the first batch initialises
    $\Delta = d$.

    * ``mode="uniform"`` (the paper's and reference code's rule): $\lambda \sim U(0, 1)$ drawn
      fresh at every step from a seeded generator, so runs are reproducible.
    * ``mode="momentum"``: a fixed $\lambda$ = ``momentum`` (a classic exponential moving average).

    Args:
        mode: ``"uniform"`` or ``"momentum"``.
        momentum: the fixed $\lambda$ for ``mode="momentum"``, in ``[0, 1)``.
        seed: seed of the generator drawing $\lambda$.

    Example:
        >>> import torch
        >>> delta = DeltaEstimator(mode="momentum", momentum=0.9)
        >>> delta.update(torch.tensor([-2.0, -4.0]))  # the first batch sets Delta
        -3.0
        >>> round(delta.update(torch.tensor([-1.0])), 6)  # 0.9 * -3.0 + 0.1 * -1.0
        -2.8
    """

    def __init__(
        self, mode: Literal["uniform", "momentum"] = "uniform", momentum: float = 0.9, seed: int = 0
    ) -> None:
        if mode not in ("uniform", "momentum"):
            raise ValueError(f"delta mode must be 'uniform' or 'momentum', got {mode!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"delta momentum must lie in [0, 1), got {momentum}")
        self.mode = mode
        self.momentum = momentum
        self._rng = np.random.default_rng(seed)
        self._value: float | torch.Tensor | None = None
        self.steps = 0

    def update(self, source_free_energy: torch.Tensor) -> float:
        """Fold one source batch's free energies into ``Delta`` and return the new value."""
        batch_mean = float(source_free_energy.detach().mean())
        if not math.isfinite(batch_mean):
            raise FloatingPointError(
                f"non-finite source free energy ({batch_mean}) at step {self.steps}"
            )
        if self.value is None:
            self.value = batch_mean
        else:
            lam = float(self._rng.uniform()) if self.mode == "uniform" else self.momentum
            self.value = lam * self.value + (1.0 - lam) * batch_mean
        self.steps += 1
        return self.value

    def update_on_device(self, source_free_energy: torch.Tensor) -> torch.Tensor:
        """:meth:`update` without reading anything back from the device: ``Delta`` kept as a
        float64 0-dim tensor beside the energies (the same arithmetic, in double precision as
        Python's floats, so the same values), returned as such. The caller checks it is
        finite (a non-finite batch mean makes it non-finite); :attr:`value` reads it back.

        Example:
            >>> d = DeltaEstimator("momentum", 0.5)
            >>> _ = d.update_on_device(torch.tensor([2.0]))
            >>> v = d.update_on_device(torch.tensor([4.0]))
            >>> float(v), d.value
            (3.0, 3.0)
        """
        batch_mean = source_free_energy.detach().mean().double()
        current = self._value
        if current is None:
            new = batch_mean
        else:
            lam = float(self._rng.uniform()) if self.mode == "uniform" else self.momentum
            prev = current if isinstance(current, torch.Tensor) else torch.tensor(current)
            new = prev.to(batch_mean.device, torch.float64) * lam + batch_mean * (1.0 - lam)
        self._value = new
        self.steps += 1
        return new

    @property
    def value(self) -> float | None:
        """The current ``Delta`` (``None`` before the first update)."""
        if isinstance(self._value, torch.Tensor):
            self._value = float(self._value)
        return self._value

    @value.setter
    def value(self, v: float | None) -> None:
        self._value = v

    def state_dict(self) -> dict[str, object]:
        """Serialisable state (value, step count, generator state) for checkpoints."""
        return {"value": self.value, "steps": self.steps, "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
        value = state["value"]
        self.value = None if value is None else float(value)  # type: ignore[arg-type]
        self.steps = int(state["steps"])  # type: ignore[call-overload]
        self._rng.bit_generator.state = state["rng"]  # type: ignore[assignment]


class AlignmentRunawayWarning(RuntimeWarning):
    """``Delta`` and ``L_fea`` grow together, epoch after epoch: the free energies run away.

    Issued by the trainer when :func:`alignment_runaway` finds the pattern."""


def alignment_runaway(
    deltas: list[float],
    align_losses: list[float],
    growth: float = 2.0,
    span: int = 2,
    floor: float = 100.0,
    unit: str = "epochs",
) -> str | None:
    """Detect the scale runaway of the free-energy alignment loss from per-epoch means (or the
    means of any log window, e.g. the segmentation trainer's ``log_every`` iterations).

    ``L_fea = max(0, F(x_t) - Delta)`` has a shortcut: scaling every energy up lowers the target
    free energy, but it lowers the source free energy too, and ``Delta`` follows it down, so the
    hinge is never met and the scale grows geometrically. Seen on MNIST->MNIST-M with LeNet and
    Adam at gamma = 0.01: ``Delta`` -59, -134, -504, -3038, -16527 over epochs 3-7; target
    accuracy rose to 82.8% at epoch 6 and fell to 72.8% at epoch 7.

    The signature: for ``span`` epochs in a row ``Delta`` is negative and at least ``growth``
    times larger in magnitude than the epoch before, the mean alignment loss grew, and
    ``|Delta|`` has reached ``floor``. The floor is empirical: energies grow fast from their
    near-zero start in any run, and on the runs of BENCHMARKS.md ("Why L_fea collapses") the
    floor is what keeps an SGD run (``Delta`` -5 to -291 in 7 epochs, no explosion) from being
    flagged at epoch 3. The thresholds were set on those runs; they are not validated beyond.

    Args:
        deltas: mean ``Delta`` of each epoch (window) so far, oldest first.
        align_losses: mean ``L_fea`` of the same epochs.
        growth: per-epoch factor of ``|Delta|`` that counts as runaway.
        span: consecutive epochs the factor must hold.
        floor: the least ``|Delta|`` (nats) of the last epoch for a runaway.
        unit: what one entry covers, for the message (``"epochs"``, ``"log windows"``).

    Returns:
        a message naming the values, or ``None`` when there is no runaway.

    Example:
        >>> alignment_runaway(
        ...     [-8.8, -30.1, -58.9, -133.5, -503.6], [4.7, 17.8, 30.8, 64.7, 228.6]
        ... )  # doctest: +ELLIPSIS
        'Delta fell -58.9 -> -133.5 -> -503.6 and the alignment loss rose 30.8 -> 228.6 ...'
        >>> alignment_runaway([-7.3, -20.7, -24.2, -24.4], [4.0, 13.1, 13.7, 13.9]) is None
        True
    """
    if len(deltas) != len(align_losses):
        raise ValueError(f"{len(deltas)} deltas but {len(align_losses)} alignment losses")
    if growth <= 1.0 or span < 1 or floor < 0:
        raise ValueError(
            f"need growth > 1, span >= 1 and floor >= 0, got growth={growth}, span={span}, "
            f"floor={floor}"
        )
    if len(deltas) < span + 1 or abs(deltas[-1]) < floor:
        return None
    d, a = deltas[-span - 1 :], align_losses[-span - 1 :]
    for k in range(1, span + 1):
        if not (d[k] < 0 and d[k - 1] < 0 and d[k] <= growth * d[k - 1] and a[k] > a[k - 1]):
            return None
    path = " -> ".join(f"{v:.1f}" for v in d)
    return (
        f"Delta fell {path} and the alignment loss rose {a[0]:.1f} -> {a[-1]:.1f} over the last "
        f"{span} {unit}: L_fea is scaling all energies up instead of aligning the domains. "
        "Lower train.gamma (on MNIST->MNIST-M, 0.01 ran away under Adam and 0.001 trained "
        "stably; docs/results/lfea-collapse.md)."
    )


class AlignmentDriftWarning(RuntimeWarning):
    """``Delta`` falls epoch after epoch while the source fit no longer improves: a slow drift
    of the free energies. Issued by the trainer when :func:`alignment_drift` finds it."""


#: what the drift message advises by default (the classification trainer's options)
DRIFT_REMEDY = (
    "The normalized alignment gives that direction no gradient; else lower train.gamma "
    "(docs/results/drift-warning.md)."
)


def alignment_drift(
    deltas: list[float],
    source_nlls: list[float],
    window: int = 10,
    min_falls: int = 8,
    rel_fall: float = 0.2,
    min_fall: float = 1.0,
    nll_fall: float = 0.3,
    unit: str = "epochs",
    remedy: str = DRIFT_REMEDY,
) -> str | None:
    """Detect the slow drift of ``Delta`` that the source fit does not explain, from per-epoch
    means (the last ``window + 1`` entries are looked at).

    While the source NLL falls, the source grows more confident and its free energy, hence
    ``Delta``, falls with it: a healthy fall. Once the source is fit (its NLL no longer
    falls), a ``Delta`` that keeps falling is the alignment loss moving the energies (their
    common mode or scale, see BENCHMARKS.md "Alignment variants"), and accuracy decays with
    it. The signature, over the last ``window`` epochs: ``Delta`` fell in at least
    ``min_falls`` of them, by at least ``rel_fall`` of its value at the window's start and at
    least ``min_fall`` nats, while the mean source NLL fell by less than a factor
    ``exp(nll_fall)`` (or rose). Scale-free in ``Delta`` (a relative fall) and in the NLL (a
    log ratio); the absolute floor keeps a ``Delta`` near ``-log C`` on two classes from
    counting small moves. The thresholds were set on the committed SURF runs of
    BENCHMARKS.md ("The drift warning"), not validated beyond.

    Args:
        deltas: mean ``Delta`` of each epoch so far, oldest first.
        source_nlls: mean source NLL of the same epochs.
        window: epochs the trend is taken over.
        min_falls: how many of the ``window`` epoch-to-epoch steps must fall.
        rel_fall: the least fall, as a share of ``|Delta|`` at the window's start.
        min_fall: the least fall in nats.
        nll_fall: the source NLL's log ratio (start / end) below which it counts as flat.
        unit: what one entry covers, for the message.
        remedy: the message's last sentence, what to do (the default names the classification
            trainer's options).

    Returns:
        a message naming the values, or ``None`` when there is no drift.

    Example:
        >>> d = [-9.6, -10.0, -10.4, -10.8, -11.2, -11.6, -12.0, -12.4, -12.8, -13.2, -13.7]
        >>> print(alignment_drift(d, [0.0018] * 6 + [0.0015] * 5))  # doctest: +ELLIPSIS
        Delta fell in 10 of the last 10 epochs, -9.6 -> -13.7 (-43%), while the source NLL ...
        >>> alignment_drift(d, [0.02 * 0.9**k for k in range(11)]) is None  # fit improving
        True
    """
    if len(deltas) != len(source_nlls):
        raise ValueError(f"{len(deltas)} deltas but {len(source_nlls)} source NLLs")
    if window < 2 or not 1 <= min_falls <= window or rel_fall < 0 or min_fall < 0:
        raise ValueError(
            f"need window >= 2, 1 <= min_falls <= window, rel_fall >= 0 and min_fall >= 0; "
            f"got window={window}, min_falls={min_falls}, rel_fall={rel_fall}, "
            f"min_fall={min_fall}"
        )
    if len(deltas) < window + 1:
        return None
    d, n = deltas[-window - 1 :], source_nlls[-window - 1 :]
    if not all(math.isfinite(v) for v in d + n) or d[0] >= 0:
        return None
    falls = sum(d[k] < d[k - 1] for k in range(1, window + 1))
    fall = d[0] - d[-1]
    ratio = math.log(max(n[0], 1e-30) / max(n[-1], 1e-30))
    if falls < min_falls or fall < min_fall or fall < rel_fall * abs(d[0]) or ratio >= nll_fall:
        return None
    return (
        f"Delta fell in {falls} of the last {window} {unit}, {d[0]:.1f} -> {d[-1]:.1f} "
        f"({-100 * fall / abs(d[0]):.0f}%), while the source NLL went {n[0]:.3g} -> "
        f"{n[-1]:.3g}: the source fit no longer explains the fall, L_fea is moving the "
        "energies (a slow drift; on SURF it came with a 1-7 point fall of target accuracy "
        f"from its peak). {remedy}"
    )


_DEFERRED = contextvars.ContextVar("eada_deferred_finite_checks", default=False)


@contextlib.contextmanager
def deferred_finite_checks() -> Iterator[None]:
    """Within the block the energy functions do not check their energies are finite (a
    read-back from the device each); the caller checks what they return instead (the
    trainer's losses, every ``train.sync_every`` steps: a non-finite energy makes them so)."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


class NonFiniteEnergiesError(ValueError):
    """Energies hold NaN or infinite values: what the energy functions raise, and what the
    trainer raises for a deferred check (:func:`deferred_finite_checks`), on any device."""


def _check_energies(energies: torch.Tensor) -> None:
    if energies.ndim != 2:
        raise ValueError(f"energies must have shape (N, C), got {tuple(energies.shape)}")
    if not _DEFERRED.get() and not torch.isfinite(energies).all():
        bad = int((~torch.isfinite(energies)).any(dim=1).sum())
        raise NonFiniteEnergiesError(
            f"energies contain NaN or infinite values ({bad} of {energies.shape[0]} rows)"
        )


# -- DUC's evidential loss, in log space (issue 32) ---------------------------------------------
EVIDENCE_SWITCH = 10.0
"""Above ``log a = 10`` (``a`` about 22,026) the Dirichlet terms below use their asymptotic
series in ``log a`` instead of ``lgamma``/``digamma`` of ``a = exp(log a)``."""

_HALF_LOG_2PI_E = 0.5 * (1.0 + math.log(2.0 * math.pi))
_EULER_GAMMA = 0.5772156649015329


_TINY_EVIDENCE = -20.0
"""Below ``log a = -20`` :func:`_h_of_log` uses its series for small ``a``."""


def _h_of_log(log_a: torch.Tensor) -> torch.Tensor:
    """``h(a) = (a - 1) psi(a) - lgamma(a) - a`` from ``log a`` (float64): exact between
    ``log a = -20`` and :data:`EVIDENCE_SWITCH`; above, ``-0.5 log a - 0.5 (1 + log 2 pi) +
    1 / (3a)`` (error ``O(a^-2)``, below 1e-8 there); below, ``1 / a + log a + gamma_E - 1``
    (error ``O(a)``; ``+inf`` once ``1 / a`` passes float64's range, ``log a < -709.8``: the
    true value is that large). Each branch sees clamped inputs, so none overflows where it is
    not used."""
    mid = torch.clamp(log_a, min=_TINY_EVIDENCE, max=EVIDENCE_SWITCH)
    a = torch.exp(mid)
    exact = (a - 1.0) * torch.digamma(a) - torch.lgamma(a) - a
    big = torch.clamp(log_a, min=EVIDENCE_SWITCH)
    large = -0.5 * big - _HALF_LOG_2PI_E + torch.exp(-big) / 3.0
    tiny = torch.clamp(log_a, max=_TINY_EVIDENCE)
    small = torch.exp(-tiny) + tiny + (_EULER_GAMMA - 1.0)
    out = torch.where(log_a > EVIDENCE_SWITCH, large, exact)
    return torch.where(log_a < _TINY_EVIDENCE, small, out)


def _digamma_of_log(log_a: torch.Tensor, plus_one: bool = False) -> torch.Tensor:
    """``psi(a)`` (or ``psi(a + 1)`` with ``plus_one``) from ``log a`` (float64): exact below
    :data:`EVIDENCE_SWITCH`, else ``log a -+ 1 / (2a) - 1 / (12 a^2)``."""
    small = torch.exp(torch.clamp(log_a, max=EVIDENCE_SWITCH))
    exact = torch.digamma(small + 1.0 if plus_one else small)
    big = torch.clamp(log_a, min=EVIDENCE_SWITCH)
    inv = torch.exp(-big)
    series = big + (0.5 if plus_one else -0.5) * inv - inv * inv / 12.0
    return torch.where(log_a <= EVIDENCE_SWITCH, exact, series)


def evidential_loss(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DUC's evidential loss on a labeled batch, ``(NLL, KL)``, each a batch mean, in log space.

    With ``alpha = exp(logits)`` (the Dirichlet's evidence), ``S = sum_y alpha_y`` and ``y``
    one-hot (Xie et al., ICLR 2023; the authors' ``core/active/loss.py``):

    * ``NLL = log S - log alpha_y = logsumexp(logits) - logits_y``;
    * ``KL = KL(Dir(a) || Dir(1))`` with ``a = y + (1 - y) alpha`` (the target class's evidence
      replaced by 1), ``A = sum a``:
      ``KL = lgamma(A) - lgamma(C) - sum_j lgamma(a_j) + sum_j (a_j - 1)(psi(a_j) - psi(A))``.

    The authors evaluate ``KL`` as written, in float32: ``exp`` overflows for logits above
    88.7 (NaN), and the ``a log a``-sized terms cancel for logits of about 50-88 (NaN, or a
    finite NEGATIVE value). Here the same quantity is rewritten with
    ``h(a) = (a - 1) psi(a) - lgamma(a) - a`` as
    ``KL = sum_j h(a_j) - h(A) + (C - 1) psi(A) - lgamma(C)`` (the linear terms ``sum_j a_j - A``
    cancel exactly), each of ``h`` and ``psi`` computed from ``log a`` (``log A`` a logsumexp)
    by its asymptotic series above ``log a = 10`` (and ``h`` by its series for small ``a``
    below ``log a = -20``), all in float64. The result is finite and non-negative for every
    finite float32 target logit, every positive logit, and non-target logits down to about
    -709 (``KL`` grows like ``exp(-logit)``: below that the true value passes float64's range
    and the result is ``+inf``, not NaN or a wrong finite number). Returned in float64 (the
    caller's loss then accumulates in float64). Equal to the authors' value where theirs is
    finite and accurate (tested on fixed batches against a re-statement of their code).

    Example:
        >>> nll, kl = evidential_loss(torch.zeros(1, 2), torch.tensor([0]))
        >>> round(float(nll), 4), round(float(kl), 4)  # log 2; a = (1, 1) is Dir(1)
        (0.6931, 0.0)
        >>> nll, kl = evidential_loss(torch.tensor([[0.0, 60.0]]), torch.tensor([0]))
        >>> round(float(nll), 2), round(float(kl), 2)  # the authors' float32 code: NaN
        (60.0, 59.0)
    """
    x = logits.double()
    c = x.shape[1]
    y = torch.nn.functional.one_hot(labels, c).to(x.dtype)
    log_total = torch.logsumexp(x, dim=1)
    nll = (log_total - (x * y).sum(dim=1)).sum() / len(x)
    log_a = x * (1.0 - y)  # log a_j: the logit, 0 for the target class
    log_a_total = torch.logsumexp(log_a, dim=1)
    kl = (
        _h_of_log(log_a).sum(dim=1)
        - _h_of_log(log_a_total)
        + (c - 1) * _digamma_of_log(log_a_total)
        - math.lgamma(c)
    )
    return nll, torch.clamp(kl, min=0.0).sum() / len(x)


def dirichlet_uncertainties_stable(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DUC's distributional and data uncertainty of ``Dir(exp(logits))`` per row, in log space.

    ``p = softmax(logits)``, ``U_data = sum_y p_y (psi(S + 1) - psi(alpha_y + 1))``,
    ``U_dis = -sum_y p_y log(p_y + 1e-7) - U_data`` (``1e-7`` the authors'), with ``log S`` a
    logsumexp and ``psi(exp(l) + 1)`` by its series ``l + 1 / (2a) - 1 / (12 a^2)`` above
    ``l = 10`` (float64), so every finite logit gives finite values where the authors' float32
    ``exp`` gives NaN above 88.7. Differentiable; the ``evidential`` training component's
    unlabeled terms. Returns float64.

    Example:
        >>> u_dis, u_data = dirichlet_uncertainties_stable(torch.zeros(1, 2))
        >>> round(float(u_data[0]), 4), round(float(u_dis[0]), 4)  # alpha = (1, 1)
        (0.5, 0.1931)
        >>> u_dis, u_data = dirichlet_uncertainties_stable(torch.tensor([[500.0, 0.0]]))
        >>> bool(torch.isfinite(u_dis).all() and torch.isfinite(u_data).all())
        True
    """
    x = logits.double()
    p = torch.softmax(x, dim=1)
    log_total = torch.logsumexp(x, dim=1, keepdim=True)
    entropy = -(p * torch.log(p + 1e-7)).sum(dim=1)
    data = (p * (_digamma_of_log(log_total, True) - _digamma_of_log(x, True))).sum(dim=1)
    return entropy - data, data


# -- semi-supervised solvers of LADA's code: MCC and CDAC (issue 32) ----------------------------
def min_class_confusion(
    energies: torch.Tensor, temperature: float = 2.5, eps: float = 1e-5
) -> torch.Tensor:
    """MCC's minimum class confusion loss on an unlabeled batch (Jin et al., ECCV 2020).

    With ``Y = softmax(-E / T)`` (``B x C``), the per-sample entropy ``H_i = -sum_j Y_ij
    log(Y_ij + eps)`` and the weights ``W_ii = B (1 + exp(-H_i)) / sum_k (1 + exp(-H_k))``
    (no gradient through ``W``):

    ``C = Y^T W Y`` (the class confusion, ``C x C``), ``C~_jk = C_jk / sum_l C_jl`` (each
    class's row normalised), ``L = (1 / C) sum_j sum_{k != j} C~_jk``.

    ``T`` = 2.5 in the MCC paper; LADA's ``solver/MCCsolver.py`` divides by ``MODEL.TEMP``
    (0.05). Their code divides column ``k`` by ``sum_l C_kl``; ``C`` is symmetric, so the value
    is the same. ``eps`` = 1e-5 inside the entropy's log, as their code.

    Example:
        >>> e = torch.tensor([[0.0, 5.0], [5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
        >>> round(float(min_class_confusion(e, temperature=1.0)), 4)  # confident: little
        0.0133
        >>> round(float(min_class_confusion(torch.zeros(4, 2))), 4)  # uniform: (2 - 1) / 2
        0.5
    """
    y = torch.softmax(-energies / temperature, dim=1)
    h = -(y * torch.log(y + eps)).sum(dim=1).detach()
    w = 1.0 + torch.exp(-h)
    w = len(y) * w / w.sum()
    conf = (y * w[:, None]).T @ y
    conf = conf / conf.sum(dim=1, keepdim=True)
    c = energies.shape[1]
    return (conf.sum() - torch.trace(conf)) / c


def rank_pair_similarity(features: torch.Tensor, topk: int = 5) -> torch.Tensor:
    """CDAC's pairwise pseudo-similarity (Li et al., CVPR 2021; rank statistics of Han et al.):
    ``s_ij = 1`` when the sets of the ``topk`` largest feature dimensions of samples ``i`` and
    ``j`` are equal, else 0; ``(B, B)``, no gradient.

    Example:
        >>> f = torch.tensor([[3.0, 2.0, 0.0], [2.0, 3.0, 1.0], [0.0, 1.0, 5.0]])
        >>> rank_pair_similarity(f, topk=2).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    top = torch.topk(features.detach(), k=topk, dim=1).indices.sort(dim=1).values
    return (top[:, None, :] == top[None, :, :]).all(dim=2).to(features.dtype)


def cdac_losses(
    energies: torch.Tensor,
    energies_bar: torch.Tensor,
    energies_bar2: torch.Tensor,
    features: torch.Tensor,
    *,
    threshold: float = 0.95,
    topk: int = 5,
    consistency_weight: float = 30.0,
    eps: float = 1e-7,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CDAC's three unlabeled-target losses (Li et al., CVPR 2021; LADA's
    ``solver/CDACsolver.py``), for three views of one unlabeled batch: ``x``, ``x_bar``,
    ``x_bar2`` (two RandAugment views), ``p = softmax(-E)`` of each:

    * adversarial adaptive clustering: ``s = rank_pair_similarity(features of x)``,
      ``P_ij = <p_i, p_bar_j>``, ``L_aac = -mean_ij BCE(P_ij, s_ij)`` with
      ``BCE = -(s log(P + eps) + (1 - s) log(1 - P + eps))``, the minus sign because the
      caller feeds the head through a gradient reversal (the head maximises the clustering
      loss, the features minimise it: the adversarial part);
    * pseudo-labels: ``L_pl = mean_i [max p_i >= threshold] CE(-E_bar2_i, argmax p_i)``
      (``p`` detached);
    * consistency: ``L_con = w * mean((p_bar - p_bar2)^2)`` (``w`` = 30 x the ramp-up in
      their solver, :func:`sigmoid_rampup`).

    Returns:
        ``(L_aac, L_pl, L_con)``.

    Example:
        >>> e = torch.tensor([[0.0, 4.0], [4.0, 0.0]])
        >>> aac, pl, con = cdac_losses(e, e, e, -e, topk=1, consistency_weight=1.0)
        >>> round(float(aac), 4), round(float(pl), 4), float(con)  # confident, two clusters
        (-0.036, 0.0181, 0.0)
    """
    p = torch.softmax(-energies, dim=1)
    p_bar = torch.softmax(-energies_bar, dim=1)
    s = rank_pair_similarity(features, topk)
    pair = p @ p_bar.T  # P_ij = <p_i, p_bar_j>
    bce = -(s * torch.log(pair + eps) + (1.0 - s) * torch.log(1.0 - pair + eps))
    aac = -bce.mean()
    conf, pseudo = p.detach().max(dim=1)
    mask = (conf >= threshold).to(energies.dtype)
    ce = torch.nn.functional.cross_entropy(-energies_bar2, pseudo, reduction="none")
    pl = (ce * mask).mean()
    p_bar2 = torch.softmax(-energies_bar2, dim=1)
    con = consistency_weight * torch.nn.functional.mse_loss(p_bar, p_bar2)
    return aac, pl, con


def sigmoid_rampup(step: float, length: float) -> float:
    """``exp(-5 (1 - min(step, length) / length)^2)`` (Laine & Aila's ramp-up; CDAC's
    consistency weight uses length 20,000 steps); 1 for ``length = 0``.

    Example:
        >>> sigmoid_rampup(0, 100), sigmoid_rampup(100, 100)
        (0.006737946999085467, 1.0)
    """
    if length <= 0:
        return 1.0
    phase = 1.0 - min(max(step, 0.0), length) / length
    return float(math.exp(-5.0 * phase * phase))
