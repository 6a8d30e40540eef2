"""CLUE: Clustering Uncertainty-weighted Embeddings (Prabhu et al., ICCV 2021, Alg. 1).

Selection: run k-means with ``K = budget`` clusters on the pool's embeddings, every sample
weighted by its predictive entropy ``H(p(y|x))`` (``p = softmax(-E / T)``), then label the
sample nearest to each centroid (the next nearest if that one is already taken). k-means is
scikit-learn's (Lloyd with k-means++ init, chunked, O(N K D) a Lloyd iteration), best of
``n_init = 10`` initialisations by weighted inertia as in the authors' code (``KMeans(n)`` of
scikit-learn 0.22, whose default ``n_init`` was 10); with one initialisation the picks on the
same pool changed with the seed (benchmarks/investigations/clue_diagnosis.py, BENCHMARKS.md); the
nearest-sample search works on blocks of centroids, never a dense ``N x K`` matrix of more than a
few MB. CLUE's training part (the semi-supervised adversarial entropy loss of MME) is the
``adversarial_entropy`` component of :mod:`eada.train.aux`, switched on with this strategy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eada.strategies.base import PoolOutputs, Selection, check_request, register

_CHUNK_ELEMENTS = 1 << 22


def entropy_from_energies(energies: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``H(softmax(-E / T))`` per row, in nats.

    Example:
        >>> import numpy as np
        >>> round(float(entropy_from_energies(np.zeros((1, 2)))[0]), 4)  # log 2
        0.6931
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    e = -np.asarray(energies, dtype=np.float64) / temperature
    e -= e.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(e).sum(axis=1, keepdims=True))
    logp = e - log_z
    return -(np.exp(logp) * logp).sum(axis=1)


def nearest_unique(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """For each centroid in order, the nearest row of ``x`` not taken by an earlier centroid.

    Works on blocks of centroids; for each it keeps only the few nearest candidates
    (``argpartition``) and falls back to a full sort only when all of them are taken.
    Needs ``len(centroids) <= len(x)``.
    """
    x = np.asarray(x, dtype=np.float32)
    centroids = np.asarray(centroids, dtype=np.float32)
    n, k = len(x), len(centroids)
    if k > n:
        raise ValueError(f"{k} centroids but only {n} samples")
    x_sq = np.einsum("ij,ij->i", x, x)
    taken = np.zeros(n, dtype=bool)
    out = np.empty(k, dtype=np.int64)
    block = max(1, _CHUNK_ELEMENTS // max(n, 1))
    m = min(n, 16)
    for c0 in range(0, k, block):
        c = centroids[c0 : c0 + block]
        d = x_sq[None, :] - 2.0 * (c @ x.T)  # ||c||^2 is constant per row: not needed
        near = (
            np.argpartition(d, m - 1, axis=1)[:, :m]
            if m < n
            else np.tile(np.arange(n), (len(c), 1))
        )
        for r in range(len(c)):
            cand = near[r][np.argsort(d[r, near[r]], kind="stable")]
            free = cand[~taken[cand]]
            if len(free) == 0:
                order = np.argsort(d[r], kind="stable")
                free = order[~taken[order]]
            j = int(free[0])
            out[c0 + r] = j
            taken[j] = True
    return out


@register(
    "clue",
    needs=("energies", "embeddings"),
    summary="entropy-weighted k-means on embeddings (K = budget), nearest sample per centroid",
    reference="Prabhu et al., Active Domain Adaptation via Clustering Uncertainty-weighted "
    "Embeddings, ICCV 2021",
)
def clue_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator,
    *,
    temperature: float = 1.0,
    max_iter: int = 300,
    n_init: int = 10,
    **_: Any,
) -> Selection:
    """CLUE's selection (Alg. 1): weighted k-means, then the nearest sample to each centroid.

    Args:
        pool: energies (for the entropy weights) and embeddings.
        budget: number of clusters and of picks.
        rng: seeds k-means (k-means++ initialisation).
        temperature: softmax temperature of the entropy weights (CLUE's ``T``, default 1).
        max_iter: Lloyd iterations at most.
        n_init: k-means initialisations (k-means++ each); the lowest weighted inertia wins.
            10, the authors' (scikit-learn 0.22's ``KMeans`` default); 1 makes the picks on
            the same pool depend on the seed (and costs a tenth of the time).

    Example:
        >>> import numpy as np
        >>> from eada.strategies.base import PoolOutputs
        >>> g = np.random.default_rng(0)
        >>> z = np.concatenate([g.normal(0, 0.1, (20, 2)), g.normal(5, 0.1, (20, 2))])
        >>> pool = PoolOutputs(energies=g.normal(size=(40, 3)), embeddings=z)
        >>> sorted(int(i) // 20 for i in clue_select(pool, 2, g).indices)  # one per blob
        [0, 1]
    """
    if n_init < 1:
        raise ValueError(f"active.params.n_init must be >= 1, got {n_init}")
    from sklearn.cluster import KMeans  # a core dependency; imported here to keep imports light

    check_request(pool, budget)
    z = np.ascontiguousarray(pool.require_embeddings("clue"), dtype=np.float32)
    h = entropy_from_energies(pool.require_energies("clue"), temperature)
    weights = h + 1e-8  # k-means needs some positive weight everywhere
    km = KMeans(
        n_clusters=budget,
        n_init=n_init,
        max_iter=max_iter,
        random_state=int(rng.integers(2**31 - 1)),
    )
    km.fit(z, sample_weight=weights)
    centroids = km.cluster_centers_.astype(np.float32)
    picked = nearest_unique(z, centroids)
    return Selection(
        indices=picked,
        scores={"entropy": h},
        info={"kmeans_iterations": int(km.n_iter_), "kmeans_inertia": float(km.inertia_)},
    )
