"""Diversity strategies on embeddings: CoreSet (k-center greedy) and BADGE (k-means++ seeding on
gradient embeddings), both without dense ``N x N`` or ``N x C x D`` arrays.

* CoreSet keeps one ``(N,)`` vector of squared distances to the nearest centre and updates it
  with one matrix-vector product per pick: O(N D (L + B)) time, O(N D) memory (``L`` labeled
  target samples as initial centres, ``B`` the budget). Distances to the labeled set are
  computed in row/column chunks.
* BADGE's gradient embedding ``g_i = (p_i - onehot(yhat_i)) (x) z_i`` (outer product, ``C x D``)
  is never built: with ``a_i = p_i - onehot(yhat_i)``,
  ``||g_i||^2 = ||a_i||^2 ||z_i||^2`` and ``<g_i, g_j> = <a_i, a_j> <z_i, z_j>``, so the squared
  distance of every sample to a new centre costs O(N (C + D)) and the whole k-means++ seeding
  O(N B (C + D)) time and O(N (C + D)) memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eada.strategies.base import PoolOutputs, Selection, check_request, register

_CHUNK_ELEMENTS = 1 << 22  # ~16 MB of float32 per distance block


def min_sq_distances(
    x: np.ndarray, centers: np.ndarray, x_sq: np.ndarray | None = None
) -> np.ndarray:
    """``min_c ||x_i - c||^2`` for every row of ``x`` (``inf`` when ``centers`` is empty).

    Computed block by block (``||x||^2 + ||c||^2 - 2 x c^T``, at most ~4M entries a block), so
    memory stays O(N + block) whatever the number of centres.

    Example:
        >>> import numpy as np
        >>> min_sq_distances(np.array([[0.0, 0.0], [3.0, 4.0]]), np.array([[0.0, 0.0]])).tolist()
        [0.0, 25.0]
    """
    x = np.asarray(x, dtype=np.float32)
    centers = np.asarray(centers, dtype=np.float32)
    n = len(x)
    out = np.full(n, np.inf, dtype=np.float32)
    if len(centers) == 0 or n == 0:
        return out
    if x_sq is None:
        x_sq = np.einsum("ij,ij->i", x, x)
    c_sq = np.einsum("ij,ij->i", centers, centers)
    rows = max(1, min(n, _CHUNK_ELEMENTS // max(1, min(len(centers), 4096))))
    cols = max(1, _CHUNK_ELEMENTS // rows)
    for r0 in range(0, n, rows):
        xr = x[r0 : r0 + rows]
        best = out[r0 : r0 + rows]
        for c0 in range(0, len(centers), cols):
            d = xr @ centers[c0 : c0 + cols].T
            d *= -2.0
            d += x_sq[r0 : r0 + rows, None]
            d += c_sq[None, c0 : c0 + cols]
            np.minimum(best, d.min(axis=1), out=best)
    np.maximum(out, 0.0, out=out)
    return out


@register(
    "coreset",
    needs=("embeddings", "labeled_embeddings"),
    summary="k-center greedy on embeddings: farthest point from the labeled set, repeatedly",
    reference="Sener & Savarese, Active Learning for Convolutional Neural Networks: A Core-Set "
    "Approach, ICLR 2018",
)
def coreset_select(pool: PoolOutputs, budget: int, rng: np.random.Generator, **_: Any) -> Selection:
    """k-center greedy (Sener & Savarese 2018, Alg. 1).

    Centres start as the labeled target embeddings (``pool.labeled_embeddings``, may have 0
    rows; with none the first pick is drawn from ``rng``, as the authors' code). Each step picks
    the pool sample farthest from its nearest centre (ties: lowest position) and makes it a
    centre. Score ``coreset_sq_distance``: squared distance to the nearest centre after the
    selection (0 for the picks).
    """
    n = check_request(pool, budget)
    x = np.ascontiguousarray(pool.require_embeddings("coreset"), dtype=np.float32)
    labeled = pool.require_rows("labeled_embeddings", "coreset")
    x_sq = np.einsum("ij,ij->i", x, x)
    dist = min_sq_distances(x, labeled, x_sq)
    picked = np.empty(budget, dtype=np.int64)
    taken = np.zeros(n, dtype=bool)
    for k in range(budget):
        if k == 0 and len(labeled) == 0:
            j = int(rng.integers(n))
        else:
            j = int(np.argmax(np.where(taken, -1.0, dist)))
        picked[k] = j
        taken[j] = True
        d = x @ x[j]
        d *= -2.0
        d += x_sq + x_sq[j]
        np.maximum(d, 0.0, out=d)
        np.minimum(dist, d, out=dist)
    dist[taken] = 0.0
    return Selection(
        indices=picked,
        scores={"coreset_sq_distance": dist.astype(np.float64)},
        info={"n_labeled_centers": len(labeled), "covering_radius": float(np.sqrt(dist.max()))},
    )


def gradient_embedding_factors(
    energies: np.ndarray, embeddings: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The two factors of BADGE's gradient embedding: ``a = p - onehot(argmax p)`` ``(N, C)`` and
    ``z`` ``(N, D)``, with ``p = softmax(-E)``; ``g_i = a_i (x) z_i`` is the gradient of the
    cross-entropy at the predicted label w.r.t. the last layer's weights.

    Example:
        >>> import numpy as np
        >>> a, z = gradient_embedding_factors(np.array([[0.0, 0.0]]), np.array([[1.0, 2.0]]))
        >>> a.tolist()
        [[-0.5, 0.5]]
    """
    # one float32 (N, C) array, updated in place (no float64 N x C temporaries): softmax of -E
    # with the row minimum subtracted first, so exp never overflows
    a = np.array(energies, dtype=np.float32, copy=True)
    a -= a.min(axis=1, keepdims=True)
    np.negative(a, out=a)
    np.exp(a, out=a)
    a /= a.sum(axis=1, keepdims=True)
    a[np.arange(len(a)), np.argmax(a, axis=1)] -= 1.0
    return a, np.asarray(embeddings, dtype=np.float32)


@register(
    "badge",
    needs=("energies", "embeddings"),
    summary="k-means++ seeding on gradient embeddings (factorised, never N x C x D)",
    reference="Ash et al., Deep Batch Active Learning by Diverse, Uncertain Gradient Lower "
    "Bounds, ICLR 2020",
)
def badge_select(pool: PoolOutputs, budget: int, rng: np.random.Generator, **_: Any) -> Selection:
    """BADGE: k-means++ seeding (Arthur & Vassilvitskii 2007) on gradient embeddings.

    As the authors' code: the first centre is the sample with the largest gradient norm, every
    next one is drawn from ``rng`` with probability proportional to its squared distance to the
    nearest centre (``D^2`` sampling). Distances use the factorised form of the module
    docstring. If every remaining distance is 0 (duplicates), the rest is drawn uniformly.
    Score ``gradient_norm``: ``||g_i|| = ||a_i|| ||z_i||``.
    """
    n = check_request(pool, budget)
    a, z = gradient_embedding_factors(
        pool.require_energies("badge"), pool.require_embeddings("badge")
    )
    a_sq = np.einsum("ij,ij->i", a, a)
    z_sq = np.einsum("ij,ij->i", z, z)
    g_sq = (a_sq * z_sq).astype(np.float64)
    dist = np.full(n, np.inf)
    taken = np.zeros(n, dtype=bool)
    picked = np.empty(budget, dtype=np.int64)
    j = int(np.argmax(g_sq))
    for k in range(budget):
        picked[k] = j
        taken[j] = True
        if k == budget - 1:
            break
        d = g_sq + g_sq[j] - 2.0 * (a @ a[j]).astype(np.float64) * (z @ z[j]).astype(np.float64)
        np.maximum(d, 0.0, out=d)
        np.minimum(dist, d, out=dist)
        w = np.where(taken, 0.0, dist)
        total = w.sum()
        if total > 0 and np.isfinite(total):
            j = int(rng.choice(n, p=w / total))
        else:
            j = int(rng.choice(np.flatnonzero(~taken)))
    return Selection(
        indices=picked,
        scores={"gradient_norm": np.sqrt(g_sq)},
        info={"first_center": int(picked[0])},
    )
