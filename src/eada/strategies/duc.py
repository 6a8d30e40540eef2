"""DUC: Dirichlet-based Uncertainty Calibration (Xie et al., ICLR 2023).

The classifier's outputs parameterise a Dirichlet over the class posteriors,
``alpha_y = exp(logit_y)``. Our network outputs ENERGIES, and the logits are their negatives,
``logit_y = -E(x, y)``, so ``alpha_y = exp(-E(x, y))`` and the total evidence
``S = sum_y alpha_y = exp(-F(x))`` (``F`` the free energy). The authors' classification code
applies no clamp to the logits (their segmentation classifier clamps them at ``max=10``; the
classification one in ``core/models/network.py`` does not), and neither do we: an energy below
about -709 makes ``exp`` overflow in float64, which :func:`dirichlet_uncertainties` reports as an
error instead of returning NaN.

With ``p = alpha / S`` (the expected prediction, equal to ``softmax(-E)``):

* data uncertainty ``U_data = sum_y p_y (psi(S + 1) - psi(alpha_y + 1))`` (the expected entropy of
  a categorical drawn from the Dirichlet; ``psi`` the digamma function);
* distributional uncertainty ``U_dis = H(p) - U_data`` with ``H(p) = -sum_y p_y log(p_y + 1e-7)``
  (the mutual information between the label and the Dirichlet draw; ``1e-7`` as in their code).

Selection, two steps like EADA's (their ``core/active/active.py``): keep the ``kappa x budget``
samples of highest ``U_dis``, then among those the ``budget`` of highest ``U_data``. Training
(their ``core/active/loss.py`` and ``main.py``) is the ``evidential`` component of
:mod:`eada.strategies.components`: the evidential NLL plus ``KL / C`` on source and labeled
target, ``beta * U_dis + lambda * U_data`` on unlabeled target.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
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
        >>> u_dis, u_data = dirichlet_uncertainties(torch.zeros(1, 2, dtype=torch.float64))
        >>> round(float(u_data[0]), 4), round(float(u_dis[0]), 4)  # alpha = (1, 1): uniform
        (0.5, 0.1931)
    """
    alpha = torch.exp(logits)
    total = alpha.sum(dim=1, keepdim=True)
    p = alpha / total
    entropy = -(p * torch.log(p + DUC_EPS)).sum(dim=1)
    data = (p * (torch.digamma(total + 1) - torch.digamma(alpha + 1))).sum(dim=1)
    return entropy - data, data


def duc_scores(energies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(U_dis, U_data)`` of every pool sample from its energies (float64, ``logits = -E``).

    Raises:
        ValueError: when ``exp(-E)`` overflows (an energy below about -709).

    Example:
        >>> u_dis, u_data = duc_scores(np.zeros((1, 2)))
        >>> round(float(u_data[0]), 4)
        0.5
    """
    logits = -torch.from_numpy(np.asarray(energies, dtype=np.float64))
    if logits.numel() and float(logits.max()) > math.log(np.finfo(np.float64).max) - 20:
        raise ValueError(
            "duc: exp(-E) overflows for energies below about -689; DUC's Dirichlet needs "
            "alpha = exp(-E) finite (the authors apply no clamp)"
        )
    u_dis, u_data = dirichlet_uncertainties(logits)
    return u_dis.numpy(), u_data.numpy()


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
    **_: Any,
) -> Selection:
    """DUC's two-step selection on the Dirichlet ``alpha = exp(-E)``.

    Stage 1 keeps the ``min(N, ceil(kappa * budget))`` samples of highest distributional
    uncertainty; stage 2 takes the ``budget`` of highest data uncertainty among them. Ties go to
    the lower pool position (stage 1) and to the earlier stage-1 rank (stage 2), as the authors'
    stable sorts do.

    Args:
        pool: needs the energies.
        budget: number of picks.
        rng: unused (DUC is deterministic).
        kappa: stage-1 size as a multiple of the budget (``TRAINER.KAPPA``; the authors'
            ``defaults.py`` says 2, every run of their ``script_cls.sh`` uses 10, our default).

    Example:
        >>> energies = np.array([[0.0, 0.0], [-5.0, 0.0], [-1.0, -1.0], [2.0, 2.0]])
        >>> duc_select(PoolOutputs(energies=energies), 1, kappa=2).indices.tolist()
        [0]
    """
    n = check_request(pool, budget)
    if not kappa >= 1:
        raise ValueError(f"duc: kappa must be >= 1 (stage 1 keeps kappa x budget), got {kappa}")
    u_dis, u_data = duc_scores(pool.require_energies("duc"))
    n1 = min(n, math.ceil(kappa * budget))
    stage1 = top_k_stable(u_dis, n1)
    picked = stage1[top_k_stable(u_data[stage1], budget)]
    return Selection(
        indices=picked.astype(np.int64),
        scores={"distributional_uncertainty": u_dis, "data_uncertainty": u_data},
        info={"stage1": int(n1)},
    )
