"""Random sampling and the classic uncertainty strategies, on posteriors ``p = softmax(-E)``."""

from __future__ import annotations

from typing import Any

import numpy as np

from eada.strategies.base import PoolOutputs, Selection, check_request, register, top_k_stable


@register(
    "random",
    needs=(),
    summary="uniformly random samples of the pool",
    reference="the naive baseline of every active-learning paper",
)
def random_select(pool: PoolOutputs, budget: int, rng: np.random.Generator, **_: Any) -> Selection:
    """``budget`` pool positions drawn uniformly without replacement from ``rng``."""
    n = check_request(pool, budget)
    return Selection(indices=rng.choice(n, size=budget, replace=False).astype(np.int64))


@register(
    "entropy",
    needs=("energies",),
    summary="highest predictive entropy H(p(y|x))",
    reference="Wang & Shang, A new active labeling method for deep learning, IJCNN 2014",
)
def entropy_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """The ``budget`` samples of highest entropy ``-sum_y p log p``."""
    check_request(pool, budget)
    p = pool.probabilities("entropy")
    h = -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=1)
    return Selection(indices=top_k_stable(h, budget), scores={"entropy": h})


@register(
    "margin",
    needs=("energies",),
    summary="smallest gap between the two largest posteriors (BvSB)",
    reference="Joshi, Porikli & Papanikolopoulos, Multi-class active learning for image "
    "classification, CVPR 2009",
)
def margin_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """Best-versus-second-best: the ``budget`` samples with the smallest ``p1 - p2``."""
    check_request(pool, budget)
    p = pool.probabilities("margin")
    top2 = -np.partition(-p, 1, axis=1)[:, :2]
    gap = top2[:, 0] - top2[:, 1]
    return Selection(indices=top_k_stable(-gap, budget), scores={"margin": gap})


@register(
    "least_confidence",
    needs=("energies",),
    summary="smallest maximum posterior",
    reference="Settles, Active Learning Literature Survey, 2009",
)
def least_confidence_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """The ``budget`` samples whose most likely class has the lowest posterior."""
    check_request(pool, budget)
    conf = pool.probabilities("least_confidence").max(axis=1)
    return Selection(indices=top_k_stable(-conf, budget), scores={"confidence": conf})
