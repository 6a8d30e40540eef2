"""EADA's two-step selection (paper Alg. 1) and its one-step ablations.

Step 1 (domain characteristic): keep the ``alpha1`` share of the pool with the HIGHEST free
energy ``F``. Step 2 (instance uncertainty): among those, keep the budget with the HIGHEST MvSM
``U`` (closest to 0). Two readings of "alpha1 share" exist:

* ``rule="paper"`` (default): ``n1 = ceil(alpha1 * |pool|)`` of the CURRENT unlabeled pool, and
  step 2 returns exactly the requested budget.
* ``rule="reference"`` (the authors' code): ``n1 = ceil(alpha1 * N_target)`` of the WHOLE initial
  target set, and step 2 returns ``n2 = ceil(n1 * share / alpha1)`` samples, ``share`` being the
  per-round budget as a share of the target set. ``n2`` is derived from that UNCAPPED ``n1``;
  the pool caps only step 1's slice (it matters at ``alpha1 = 1`` once the pool is smaller than
  ``N_target``: N = 100, pool 80, 5% -> 5 samples). The two ceilings make a round slightly
  larger than ``share * N_target`` (Office-31 amazon: 29 instead of 28.17). The paper's tables
  come from this rule (``configs/`` use it); ``paper`` is the literal reading.

Ties: step 1 sorts by ``F`` (descending) with ties broken by lower pool position; step 2 sorts
the candidates by ``U`` (descending) with ties broken by their step-1 order. The result is fully
deterministic and does not depend on ``rng``.

Example:
    >>> import numpy as np
    >>> from eada.strategies import PoolOutputs, get_strategy
    >>> pool = PoolOutputs(free_energy=np.array([5.0, 1.0, 4.0, 3.0]),
    ...                    mvsm=np.array([-0.1, -0.0, -2.0, -0.5]))
    >>> sel = get_strategy("eada").fn(pool, 1, np.random.default_rng(0), alpha1=0.5)
    >>> sel.indices.tolist()  # candidates {0, 2} by F, then the higher U among them
    [0]
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from eada.strategies.base import (
    BudgetTooLargeError,
    PoolOutputs,
    Selection,
    check_request,
    register,
    top_k_stable,
)

#: The strategies with EADA's two steps: the trainer passes them ``active.alpha1``,
#: ``active.selection_rule`` and the round's share, and plans their stage sizes.
TWO_STEP_STRATEGIES: tuple[str, ...] = ("eada", "eada_centered")


def _check_alpha1(alpha1: float) -> Fraction:
    if not 0.0 < alpha1 <= 1.0:
        raise ValueError(f"alpha1 must lie in (0, 1], got {alpha1}")
    return Fraction(str(alpha1))


def stage_sizes(
    n_pool: int,
    budget: int,
    alpha1: float,
    rule: Literal["paper", "reference"] = "paper",
    n_target: int | None = None,
    budget_share: float | None = None,
) -> tuple[int, int]:
    """Sizes ``(n1, n2)`` of EADA's two stages, with the errors of an impossible request.

    Args:
        n_pool: current unlabeled pool size.
        budget: requested per-round count (used by ``rule="paper"``, and by ``"reference"`` to
            derive the share when ``budget_share`` is not given).
        alpha1: share kept by step 1, in ``(0, 1]``.
        rule: ``"paper"`` or ``"reference"`` (see the module docstring).
        n_target: size of the whole target set (required by ``rule="reference"``).
        budget_share: per-round budget as a share of the target set (``"reference"`` only).
    """
    a1 = _check_alpha1(alpha1)
    if rule == "paper":
        n1 = math.ceil(a1 * n_pool)
        n2 = budget
    elif rule == "reference":
        if n_target is None or n_target < n_pool:
            raise ValueError(
                f"rule='reference' needs n_target, the size of the whole target set (>= pool size "
                f"{n_pool}); got {n_target}"
            )
        share = (
            Fraction(str(budget_share)) if budget_share is not None else Fraction(budget, n_target)
        )
        n1_uncapped = math.ceil(a1 * n_target)
        n2 = math.ceil(n1_uncapped * share / a1)  # from the UNCAPPED n1, as the authors' code
        n1 = min(n1_uncapped, n_pool)  # the pool caps only the slice
    else:
        raise ValueError(f"rule must be 'paper' or 'reference', got {rule!r}")
    if n2 > n_pool:  # first: no alpha1 helps here
        raise BudgetTooLargeError(
            f"budget {n2} is larger than the unlabeled pool ({n_pool} samples)"
        )
    if n2 > n1:
        raise BudgetTooLargeError(
            f"EADA step 2 must pick {n2} samples but step 1 keeps only {n1} "
            f"(alpha1={alpha1} of {'the pool' if rule == 'paper' else 'the target set'}); "
            "raise alpha1 or lower the budget"
        )
    return n1, n2


@register(
    "eada",
    needs=("free_energy", "mvsm"),
    summary="top alpha1 share by free energy, then the highest MvSM among them",
    reference="Xie et al., Active Learning for Domain Adaptation: An Energy-Based Approach, "
    "AAAI 2022",
)
def eada_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator | None = None,
    *,
    alpha1: float = 0.5,
    rule: Literal["paper", "reference"] = "paper",
    budget_share: float | None = None,
    **_: Any,
) -> Selection:
    """EADA's two-step selection; see the module docstring for the rules and tie-breaking.

    Args:
        pool: the pool's free energies and MvSM (or energies to derive them from).
        budget: per-round count.
        rng: unused (EADA is deterministic); accepted for the common interface.
        alpha1: share kept by step 1, in ``(0, 1]`` (paper: 0.5).
        rule: ``"paper"`` or ``"reference"``.
        budget_share: the per-round share of the target set (``"reference"`` rule).
    """
    n = check_request(pool, budget)
    return _two_steps(
        pool, pool.get_free_energy(), "free_energy", n, budget, alpha1, rule, budget_share
    )


def _two_steps(
    pool: PoolOutputs,
    f: np.ndarray,
    stage1: str,
    n: int,
    budget: int,
    alpha1: float,
    rule: Literal["paper", "reference"],
    budget_share: float | None,
) -> Selection:
    """Step 1 keeps the top ``alpha1`` share by ``f`` (the score named ``stage1``), step 2 the
    budget with the highest MvSM among them (the module docstring's rules and ties)."""
    n1, n2 = stage_sizes(n, budget, alpha1, rule, pool.n_target, budget_share)
    u = pool.get_mvsm()
    candidates = top_k_stable(f, n1)
    picked = candidates[top_k_stable(u[candidates], n2)]
    return Selection(
        indices=picked,
        scores={stage1: f, "mvsm": u},
        info={
            "rule": rule,
            "alpha1": alpha1,
            "n_stage1": n1,
            "n_stage2": n2,
            f"{stage1}_threshold": float(f[candidates[-1]]),
        },
    )


@register(
    "eada_centered",
    needs=("energies", "free_energy", "mvsm"),
    summary="EADA with step 1 on the centred free energy F - mean_y E (an option; not the paper's)",
    reference="Xie et al. AAAI 2022, step 1 on eada.energy.centered_free_energy",
)
def eada_centered_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator | None = None,
    *,
    alpha1: float = 0.5,
    rule: Literal["paper", "reference"] = "paper",
    budget_share: float | None = None,
    **_: Any,
) -> Selection:
    r"""EADA with its first step on the centred free energy $G = F - \frac{1}{C} \sum_y E$.

    The NLL gives the common mode of the energies $\frac{1}{C} \sum_y E(x, y)$ no gradient
    (:func:`eada.energy.centered_free_energy`), so in a linear model its weights stay where
    the initialisation put them and the plain top-``alpha1`` filter on $F$ keeps a part of the
    pool chosen by that direction (with two classes: a half-plane). $G$ drops that common mode
    and keeps what the NLL trains; everything else is :func:`eada_select`'s (same arguments,
    same sizes and ties).

    Example:
        >>> import numpy as np
        >>> E = np.array([[0.0, 0.0], [10.0, 10.0], [0.0, 3.0], [10.0, 13.0]])
        >>> pool = PoolOutputs(energies=E)
        >>> eada_select(pool, 1, alpha1=0.5).indices.tolist()  # F: the high common mode
        [1]
        >>> eada_centered_select(pool, 1, alpha1=0.5).indices.tolist()  # G: the uncertain rows
        [0]
    """
    n = check_request(pool, budget)
    e = pool.require_energies("eada_centered")
    g = pool.get_free_energy() - e.mean(axis=1)  # F at the pool's temperature, centred
    return _two_steps(pool, g, "centered_free_energy", n, budget, alpha1, rule, budget_share)


@register(
    "mvsm",
    needs=("mvsm",),
    summary="EADA without F (ablation): the highest MvSM over the whole pool",
    reference="Xie et al. AAAI 2022, ablation 'EADA w/o F'",
)
def mvsm_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """EADA w/o F: the ``budget`` samples with the highest MvSM (alpha1 = 100%)."""
    check_request(pool, budget)
    u = pool.get_mvsm()
    return Selection(indices=top_k_stable(u, budget), scores={"mvsm": u})


@register(
    "free_energy",
    needs=("free_energy",),
    summary="EADA without U (ablation): the highest free energy over the whole pool",
    reference="Xie et al. AAAI 2022, ablation 'EADA w/o U'",
)
def free_energy_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """EADA w/o U: the ``budget`` samples with the highest free energy."""
    check_request(pool, budget)
    f = pool.get_free_energy()
    return Selection(indices=top_k_stable(f, budget), scores={"free_energy": f})
