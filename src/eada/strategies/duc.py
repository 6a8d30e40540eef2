"""DUC: Dirichlet-based Uncertainty Calibration (Xie et al., ICLR 2023).

The classifier's outputs parameterise a Dirichlet over the class posteriors,
``alpha_y = exp(logit_y)``. Our network outputs ENERGIES, and the logits are their negatives,
``logit_y = -E(x, y)``, so ``alpha_y = exp(-E(x, y))`` and the total evidence
``S = sum_y alpha_y = exp(-F(x))`` (``F`` the free energy). The authors' classification code
applies no clamp to the logits (their segmentation classifier clamps them at ``max=10``; the
classification one in ``core/models/network.py`` does not), and neither do we.

With ``p = alpha / S`` (the expected prediction, equal to ``softmax(-E)``):

* data uncertainty ``U_data = sum_y p_y (psi(S + 1) - psi(alpha_y + 1))`` (the expected entropy of
  a categorical drawn from the Dirichlet; ``psi`` the digamma function);
* distributional uncertainty ``U_dis = H(p) - U_data`` with ``H(p) = -sum_y p_y log(p_y + 1e-7)``
  (the mutual information between the label and the Dirichlet draw; ``1e-7`` as in their code).

Selection, two steps like EADA's (their ``core/active/active.py``): keep the stage-1 samples of
highest ``U_dis``, then among those the ``budget`` of highest ``U_data``.

What equals the authors' selection by default (``tests/test_duc_lada.py``,
``test_duc_picks_equal_the_authors_semantics`` on many pool shapes):

* the stage-1 count ``ceil(N_T * r * kappa)`` (``stage1="authors"``): ``N_T`` the WHOLE target
  set (their ``totality``, :attr:`PoolOutputs.n_target`), ``r`` the per-round share (their
  ``active_ratio``, the trainer's ``budget_share``), the float product in their order; with a
  count budget (no share) ``ceil(budget * kappa)``. ``stage1="budget"`` is our earlier rule
  ``ceil(kappa * budget)`` (Office-Home Art: 250 where theirs is 243), kept as a named option;
* the scores in float32 (``precision="float32"``): the authors score the model's float32
  outputs. ``precision="float64"`` scores in float64 (an option: on confident pools, logit gaps
  of 25-30, the float32 ``U_dis`` of many samples rounds to the same few values, and the two
  precisions pick different samples);
* the order of ties: both stages are stable sorts (Python's ``sorted``), so equal scores keep
  the order in which the samples were scored. Ours is the pool order (a sequential loader); the
  authors' scoring loader is SHUFFLED (``shuffle=True`` in their ``main.py``), so in their runs
  the order among exactly tied samples is a random permutation no one can reproduce. Only exact
  ties are affected (saturated predictions, duplicate samples).

Overflow: ``exp`` overflows float32 above 88.72 (float64: 709.78), so an energy below about
-88.7 (-709.8 with ``precision="float64"``) makes ``alpha`` infinite, and ``S`` overflows once
``sum_y exp(-E_y)`` passes the largest float (all ``C`` energies below ``-88.7 + log C``
suffices); energies that are all above about 103.3 (float32; 744.4 in float64) make ``S`` zero.
The authors' code returns NaN scores there; :func:`duc_scores` raises a ``ValueError`` naming
the energy range instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where it computes: the registry stays light
    import torch

from eada.strategies.base import PoolOutputs, Selection, check_request, register, top_k_stable

DUC_EPS = 1e-7
"""The ``eps`` inside the log of the expected prediction's entropy (the authors' value)."""


def dirichlet_uncertainties(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distributional and data uncertainty of the Dirichlet ``alpha = exp(logits)``, per row.

    Differentiable (the ``evidential`` training component uses it). For energies pass
    ``logits = -E``.

    Args:
        logits: ``(N, C)`` classifier logits.

    Returns:
        ``(U_dis, U_data)``, each ``(N,)``.

    Example:
        >>> import torch
        >>> u_dis, u_data = dirichlet_uncertainties(torch.zeros(1, 2, dtype=torch.float64))
        >>> round(float(u_data[0]), 4), round(float(u_dis[0]), 4)  # alpha = (1, 1): uniform
        (0.5, 0.1931)
    """
    import torch

    alpha = torch.exp(logits)
    total = alpha.sum(dim=1, keepdim=True)
    p = alpha / total
    entropy = -(p * torch.log(p + DUC_EPS)).sum(dim=1)
    data = (p * (torch.digamma(total + 1) - torch.digamma(alpha + 1))).sum(dim=1)
    return entropy - data, data


PRECISIONS = ("float32", "float64")
"""The values of DUC's ``precision`` (float32: the authors' scores)."""

STAGE1_RULES = ("authors", "budget")
"""The values of DUC's ``stage1`` rule (``authors``: ``ceil(N_T * r * kappa)``)."""


def duc_scores(energies: np.ndarray, precision: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """``(U_dis, U_data)`` of every pool sample from its energies (``logits = -E``).

    Computed in ``precision`` with the authors' operations in their order (so the float32 values
    are theirs, bit for bit, on the same backend), returned as float64 arrays (exact widenings).

    Args:
        energies: ``(N, C)`` energies.
        precision: ``float32`` (the authors': their model's outputs) or ``float64``.

    Raises:
        ValueError: the evidence ``S = sum_y exp(-E_y)`` of some sample overflows (energies
            below about -88.7 in float32, -709.8 in float64) or underflows to 0 (all of a
            sample's energies above about 103.3 in float32, 744.4 in float64), where the
            authors' code would return NaN scores.

    Example:
        >>> u_dis, u_data = duc_scores(np.zeros((1, 2)))
        >>> round(float(u_data[0]), 4)
        0.5
    """
    import torch

    if precision not in PRECISIONS:
        raise ValueError(
            f"duc: precision must be one of {', '.join(PRECISIONS)}; got {precision!r}"
        )
    dtype = np.float32 if precision == "float32" else np.float64
    logits = -torch.from_numpy(np.ascontiguousarray(energies, dtype=dtype))
    u_dis, u_data = dirichlet_uncertainties(logits)
    if logits.numel() and not (torch.isfinite(u_dis).all() and torch.isfinite(u_data).all()):
        lo, hi = (88.7, 103.3) if precision == "float32" else (709.8, 744.4)
        raise ValueError(
            f"duc: the Dirichlet evidence S = sum exp(-E) is not a finite positive {precision} "
            f"for some pool samples (energies from {float(-logits.max()):.4g} to "
            f"{float(-logits.min()):.4g}; exp(-E) overflows below about -{lo} and S underflows "
            f"to 0 when all of a sample's energies are above about {hi}); the authors' code "
            "gives NaN scores there (it applies no clamp)"
            + (
                "; active.params.precision=float64 scores energies down to about -709.8"
                if precision == "float32"
                else ""
            )
        )
    return u_dis.double().numpy(), u_data.double().numpy()


def stage1_count(
    n_pool: int,
    budget: int,
    kappa: float,
    rule: str = "authors",
    n_target: int | None = None,
    budget_share: float | None = None,
) -> int:
    """How many samples DUC's first stage keeps.

    ``authors``: ``ceil(N_T * r * kappa)`` as their ``fisrt_round_num`` (the float product
    ``totality * active_ratio * kappa``, left to right) when the per-round share ``r`` and the
    whole target size ``N_T`` are known, else ``ceil(budget * kappa)``; ``budget``:
    ``ceil(kappa * budget)``. Either is capped at the pool size and is at least ``budget``.

    Example:
        >>> stage1_count(2427, 25, 10, "authors", 2427, 0.01)  # Office-Home Art
        243
        >>> stage1_count(2427, 25, 10, "budget")  # our earlier rule
        250
    """
    if rule not in STAGE1_RULES:
        raise ValueError(f"duc: stage1 must be one of {', '.join(STAGE1_RULES)}; got {rule!r}")
    if rule == "authors" and budget_share is not None and n_target is not None:
        n1 = math.ceil(float(n_target) * float(budget_share) * kappa)
    elif rule == "authors":
        n1 = math.ceil(budget * kappa)
    else:
        n1 = math.ceil(kappa * budget)
    return int(min(n_pool, max(budget, n1)))


@register(
    "duc",
    needs=("energies",),
    summary="top kappa x budget by distributional uncertainty, then highest data uncertainty",
    reference="Xie et al., Dirichlet-based Uncertainty Calibration for Active Domain "
    "Adaptation, ICLR 2023",
)
def duc_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator | None = None,
    *,
    kappa: float = 10.0,
    stage1: str = "authors",
    precision: str = "float32",
    budget_share: float | None = None,
    **_: Any,
) -> Selection:
    """DUC's two-step selection on the Dirichlet ``alpha = exp(-E)`` (module docstring).

    Stage 1 keeps the :func:`stage1_count` samples of highest distributional uncertainty;
    stage 2 takes the ``budget`` of highest data uncertainty among them. Both stages are stable
    sorts, as the authors' ``sorted``: ties go to the lower pool position (stage 1) and to the
    earlier stage-1 rank (stage 2); their shuffled scoring loader makes their tie order random
    (module docstring).

    Args:
        pool: needs the energies; ``pool.n_target`` (the whole target set) for ``stage1``.
        budget: number of picks.
        rng: unused (DUC is deterministic).
        kappa: stage-1 size as a multiple of the budget (``TRAINER.KAPPA``; the authors'
            ``defaults.py`` says 2, every run of their ``script_cls.sh`` uses 10, our default).
        stage1: ``authors`` (default, ``ceil(N_T * r * kappa)``) or ``budget``
            (``ceil(kappa * budget)``, an option).
        precision: ``float32`` (default, the authors') or ``float64`` (an option).
        budget_share: the per-round share ``r`` of the whole target set (the trainer passes
            ``active.budget_per_round`` when it is a share).

    Example:
        >>> energies = np.array([[0.0, 0.0], [-5.0, 0.0], [-1.0, -1.0], [2.0, 2.0]])
        >>> duc_select(PoolOutputs(energies=energies), 1, kappa=2).indices.tolist()
        [0]
    """
    n = check_request(pool, budget)
    if not kappa >= 1:
        raise ValueError(f"duc: kappa must be >= 1 (stage 1 keeps kappa x budget), got {kappa}")
    n1 = stage1_count(n, budget, kappa, stage1, pool.n_target, budget_share)
    u_dis, u_data = duc_scores(pool.require_energies("duc"), precision)
    first = top_k_stable(u_dis, n1)
    picked = first[top_k_stable(u_data[first], budget)]
    return Selection(
        indices=picked.astype(np.int64),
        scores={"distributional_uncertainty": u_dis, "data_uncertainty": u_data},
        info={"stage1": int(n1), "precision": precision},
    )
