"""LAS: Local context-aware sampling of LADA (Sun et al., ICCV 2023).

LAS scores each pool sample by how much the model's predictions disagree inside its
feature-space neighbourhood, as the authors' ``active/LASsampler.py`` computes it:

1. ``z`` = L2-normalised embeddings; each sample's ``K`` nearest neighbours by cosine similarity
   (the ``K + 1`` most similar rows, the first one, the sample itself, dropped), with weights
   ``w_ik = s_ik / sum_k s_ik`` (``s`` the similarities).
2. ``Q_i = -sum_k w_ik <p_i, p_{n_ik}>`` with ``p = softmax(-E)``: high when the neighbours
   predict other classes than the sample.
3. ``prop_iter`` times: ``Q_i += prop_coef * sum_k w_ik Q_{n_ik}`` (all samples at once).
4. Diversity: k-means with ``budget`` clusters on the embeddings of the ``budget x (1 + M)``
   samples of highest ``Q``; the sample nearest to each centroid, and while two centroids share
   one, the next nearest of the first centroids (their loop over columns of the sorted
   distances).

The neighbours (``active.params.knn``, :func:`knn_neighbours`):

* ``exact``: a blocked exact search, a block of rows times all rows at a time (``torch.topk``
  per block): memory ``O(block x N + N x K)``, never an ``N x N`` matrix, but time
  ``O(N^2 D)``. The authors' code computes the same neighbours (with the full ``N x N``
  matrix), so on this path the picks equal theirs.
* ``faiss``: an approximate search with faiss's HNSW graph (``IndexHNSWFlat`` on the
  L2-normalised embeddings, inner product = cosine; ``M = 32``, ``efConstruction = 40``,
  ``efSearch = 64``), time about ``O(N log N)``; the graph is built on one thread (faiss's
  parallel insertion depends on the thread timing), so the same input gives the same
  neighbours and picks. Each sample's own row is dropped from its ``K + 1`` results (the last
  one where the search missed it). Its recall against the exact search and its time are
  measured in BENCHMARKS.md ("LAS's neighbour search").
* ``auto`` (default): ``exact`` below :data:`EXACT_BELOW` = 50,000 samples, ``faiss`` from
  there on; ``exact`` with a one-line note where faiss is not installed
  (``pip install 'eada[fast]'``, package ``faiss-cpu``). The threshold is about where the two
  cost the same at one thread (BENCHMARKS.md, "LAS's neighbour search"): below it the exact
  search is as fast (BLAS matrix products) and gives the authors' neighbours exactly; above
  it its ``N^2`` grows away from HNSW's ``N log N``.

Which search ran is in the selection's ``info["knn"]``. k-means is scikit-learn's, as in the
authors' code.

Where the similarities of a sample's neighbours do not sum to a positive number (possible only
with embeddings that take both signs), its weights are uniform ``1 / K`` instead of the
authors' division by that sum (which gives infinities there).

LADA's training part is the anchor-set augmentation (RAA/LAA) and, as an option, MME's
adversarial entropy (:mod:`eada.strategies.components`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where it computes: the registry stays light
    import torch

from eada.strategies.base import PoolOutputs, Selection, check_request, register

_BLOCK_ELEMENTS = 1 << 22

EXACT_BELOW = 50_000
"""``knn: auto`` searches exactly below this many samples, with faiss's HNSW from there on."""

KNN_METHODS = ("auto", "exact", "faiss")
"""The values of ``active.params.knn``."""

# faiss HNSW settings (chosen by benchmarks/investigations/knn_choice.py, BENCHMARKS.md)
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 64

_noted: set[str] = set()


def cosine_neighbours(
    embeddings: np.ndarray, k: int, *, exclude_first: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most cosine-similar rows of every row, exact, computed a block of rows at a time.

    Like the authors, takes the ``k + 1`` most similar rows and drops the first (the row itself)
    when ``exclude_first``.

    Args:
        embeddings: ``(N, D)`` features (normalised here, float32 as in the authors' code).
        k: neighbours per row (``k + 1 <= N`` when ``exclude_first``).

    Returns:
        ``(similarities, indices)``, each ``(N, k)``, most similar first.

    Example:
        >>> z = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
        >>> cosine_neighbours(z, 1)[1].tolist()
        [[1], [0], [1]]
    """
    import torch

    z = torch.nn.functional.normalize(torch.from_numpy(np.asarray(embeddings, np.float32)), dim=1)
    n = len(z)
    take = k + 1 if exclude_first else k
    if take > n:
        raise ValueError(f"{k} neighbours asked of {n} samples")
    block = max(1, _BLOCK_ELEMENTS // max(n, 1))
    sims = torch.empty(n, k)
    idx = torch.empty(n, k, dtype=torch.long)
    for start in range(0, n, block):
        s, i = _most_similar(z, z[start : start + block], take)
        first = 1 if exclude_first else 0
        sims[start : start + block] = s[:, first:]
        idx[start : start + block] = i[:, first:]
    return sims, idx


def faiss_available() -> bool:
    """Whether ``faiss`` (the ``faiss-cpu`` package of the optional extra ``fast``) imports."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_neighbours(
    embeddings: np.ndarray, k: int, *, threads: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most cosine-similar other rows of every row, approximately, with faiss's HNSW.

    ``IndexHNSWFlat`` (:data:`HNSW_M` links, :data:`HNSW_EF_CONSTRUCTION`,
    :data:`HNSW_EF_SEARCH`) with inner products on the L2-normalised rows, every row searched
    for ``k + 1`` results; the row itself is dropped (the last result where the search missed
    it). The graph is built on one thread, so the result is a function of the input; the
    search runs on ``threads`` (default: the process's selection thread count), which does not
    change it.

    Args:
        embeddings: ``(N, D)`` features (normalised here, float32).
        k: neighbours per row (``k + 1 <= N``).
        threads: faiss's OpenMP threads for the search.

    Returns:
        ``(similarities, indices)``, each ``(N, k)``, most similar first (as
        :func:`cosine_neighbours`).

    Raises:
        ImportError: faiss is not installed (``pip install 'eada[fast]'``).

    Example:
        >>> z = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
        >>> faiss_neighbours(z, 1)[1].tolist()
        [[1], [0], [1]]
    """
    import torch

    try:
        import faiss
    except ImportError as e:
        raise ImportError("knn: faiss needs faiss-cpu (pip install 'eada[fast]')") from e
    from eada.threads import selection_threads

    z = torch.nn.functional.normalize(torch.from_numpy(np.asarray(embeddings, np.float32)), dim=1)
    zn = np.ascontiguousarray(z.numpy())
    n, dim = zn.shape
    if k + 1 > n:
        raise ValueError(f"{k} neighbours asked of {n} samples")
    before = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)  # parallel insertion would make the graph timing-dependent
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.add(zn)
        index.hnsw.efSearch = max(HNSW_EF_SEARCH, k + 1)
        faiss.omp_set_num_threads(threads or selection_threads())
        sims, idx = index.search(zn, k + 1)
    finally:
        faiss.omp_set_num_threads(before)
    rows = np.arange(n)[:, None]
    is_self = idx == rows
    # drop the row itself, or the last result where it was not found
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), k)
    keep = np.arange(k + 1)[None, :] != drop[:, None]
    sims = sims[keep].reshape(n, k)
    idx = idx[keep].reshape(n, k)
    missing = idx < 0  # fewer than k + 1 found (not expected with efSearch >= k + 1)
    if missing.any():
        bad = np.flatnonzero(missing.any(axis=1))
        s_ex, i_ex = _most_similar(z, z[torch.from_numpy(bad)], k + 1)
        sims[bad], idx[bad] = s_ex[:, 1:].numpy(), i_ex[:, 1:].numpy()
    return torch.from_numpy(np.ascontiguousarray(sims)), torch.from_numpy(idx.astype(np.int64))


def _most_similar(
    z: torch.Tensor, queries: torch.Tensor, take: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``take`` rows of normalised ``z`` most similar to each of ``queries``, exactly
    (similarities and indices, most similar first)."""
    import torch

    return torch.topk(queries @ z.T, k=take, dim=1)


def _note(msg: str) -> None:
    """A one-line note on stderr, once per process."""
    if msg not in _noted:
        _noted.add(msg)
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def knn_neighbours(
    embeddings: np.ndarray, k: int, knn: str = "auto", *, exact_below: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """LAS's ``k`` cosine neighbours of every row by the search ``knn`` names.

    Args:
        embeddings: ``(N, D)`` features.
        k: neighbours per row (itself excluded).
        knn: ``exact`` (:func:`cosine_neighbours`), ``faiss`` (:func:`faiss_neighbours`) or
            ``auto``: exact below ``exact_below`` samples or without faiss installed (a
            one-line note on stderr, once), faiss otherwise.
        exact_below: the ``auto`` threshold (default :data:`EXACT_BELOW`, read at the call).

    Returns:
        ``(similarities, indices, used)``: ``(N, k)`` each, and ``"exact"`` or ``"faiss"``.

    Raises:
        ValueError: ``knn`` is none of :data:`KNN_METHODS`.
        ImportError: ``knn="faiss"`` without faiss installed.

    Example:
        >>> z = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
        >>> knn_neighbours(z, 1)[1:]  # 3 samples: below the threshold
        (tensor([[1],
                [0],
                [1]]), 'exact')
    """
    if knn not in KNN_METHODS:
        raise ValueError(f"active.params.knn must be one of {', '.join(KNN_METHODS)}; got {knn!r}")
    use = knn
    if knn == "auto":
        below = EXACT_BELOW if exact_below is None else exact_below
        use = "exact" if len(embeddings) < below else "faiss"
        if use == "faiss" and not faiss_available():
            _note(
                f"note: las searches the neighbours of {len(embeddings)} samples exactly (O(N^2) "
                "time): faiss is not installed (pip install 'eada[fast]')"
            )
            use = "exact"
    if use == "faiss":
        sims, idx = faiss_neighbours(embeddings, k)
    else:
        sims, idx = cosine_neighbours(embeddings, k)
    return sims, idx, use


def las_scores(
    probs: np.ndarray,
    embeddings: np.ndarray,
    k: int = 10,
    prop_iter: int = 1,
    prop_coef: float = 1.0,
    knn: str = "auto",
    *,
    exact_below: int | None = None,
) -> tuple[np.ndarray, str]:
    """LAS's local-inconsistency score ``Q`` of every sample (higher = query first).

    Args:
        probs: ``(N, C)`` class posteriors.
        embeddings: ``(N, D)`` features.
        k: neighbours (``LADA.S_K``), at most ``N - 1`` used.
        prop_iter: propagation steps (``LADA.S_PROP_ITER``).
        prop_coef: propagation weight (``LADA.S_PROP_COEF``).
        knn: the neighbour search (:func:`knn_neighbours`), ``exact_below`` its threshold.

    Returns:
        ``(Q, used)``: the ``(N,)`` scores and the search that ran (``"exact"``/``"faiss"``).

    Example:
        >>> p = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
        >>> z = np.array([[1.0, 0.0], [0.9, 0.1], [0.8, 0.3]])
        >>> las_scores(p, z, k=1, prop_iter=0)[0].tolist()  # the third disagrees with its neighbour
        [-1.0, -1.0, -0.0]
    """
    import torch

    n = len(probs)
    k = min(k, n - 1)
    if k < 1:
        return np.zeros(n), "none"
    sims, idx, used = knn_neighbours(embeddings, k, knn, exact_below=exact_below)
    total = sims.sum(dim=1, keepdim=True)
    w = torch.where(total > 0, sims / total, torch.full_like(sims, 1.0 / k))
    p = torch.from_numpy(np.ascontiguousarray(probs, dtype=np.float32))
    q = torch.empty(n)
    block = max(1, _BLOCK_ELEMENTS // max(1, k * p.shape[1]))
    for start in range(0, n, block):
        stop = start + block
        agree = (p[idx[start:stop]] * p[start:stop].unsqueeze(1)).sum(-1)
        q[start:stop] = -(agree * w[start:stop]).sum(-1)
    for _ in range(prop_iter):
        q = q + (w * q[idx]).sum(-1) * prop_coef
    return q.double().numpy(), used


_FULL_DISTANCES = 1 << 23
"""Up to this many centre-sample distances (64 MiB of float64) :func:`centroid_picks` computes
them in one call, as the authors' code; above, a block of centres at a time."""


def centroid_picks(centres: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The authors' pick of one row of ``x`` per centre (their ``LASsampler.py:66-75``).

    Distances are scikit-learn's ``euclidean_distances`` (float64), each centre's row sorted by
    NumPy's default ``argsort`` (their call: its order among exactly equal distances is
    NumPy's, not the position's); then column ``ax = 0, 1, ...`` of the first ``rem`` centres
    is taken, ``rem`` the number of distinct rows still missing, until ``len(centres)`` distinct
    rows are taken. Returns row positions in the order they were first taken.

    Example:
        >>> centroid_picks(np.array([[0.0], [0.1]]), np.array([[0.0], [5.0], [0.2]])).tolist()
        [0, 2]
    """
    from sklearn.metrics.pairwise import euclidean_distances

    c = np.asarray(centres, np.float64)
    xs = np.asarray(x, np.float64)
    n = len(c)
    block = n if n * len(xs) <= _FULL_DISTANCES else max(1, _FULL_DISTANCES // max(1, len(xs)))
    taken: dict[int, None] = {}
    ax, rem = 0, n
    orders: list[np.ndarray] = []
    for c0 in range(0, n, block):
        orders.append(euclidean_distances(c[c0 : c0 + block], xs).argsort(axis=1))
    order = np.concatenate(orders)
    while rem > 0:
        if ax >= order.shape[1]:
            raise ValueError(f"las: {n} centres share fewer than {n} distinct samples")
        for j in order[:rem, ax].tolist():
            taken.setdefault(int(j))
        rem = n - len(taken)
        ax += 1
    return np.fromiter(taken, dtype=np.int64, count=n)


RANKINGS = ("authors", "stable")
"""The values of LAS's ``ranking`` (of the ``Q`` scores before k-means)."""

KMEANS_N_INIT = 10
"""k-means initialisations of LAS: scikit-learn's default before 1.4 (the authors' Python 3.8
environment cannot install 1.4, where the default became 1 for k-means++)."""


def rank_scores(q: np.ndarray, ranking: str = "authors") -> np.ndarray:
    """Positions by descending ``q`` (float32 values).

    ``authors``: ``torch.sort(descending=True)`` of the float32 tensor, as their
    ``Q_score.sort(descending=True)`` (not stable: on the CPU the order among exactly equal
    scores is that of PyTorch's sort, a function of the input, not the position);
    ``stable``: ties by lower position (an option).

    Example:
        >>> rank_scores(np.array([0.5, 2.0, 1.0])).tolist()
        [1, 2, 0]
    """
    import torch

    if ranking not in RANKINGS:
        raise ValueError(f"las: ranking must be one of {', '.join(RANKINGS)}; got {ranking!r}")
    q32 = np.ascontiguousarray(q, dtype=np.float32)
    if ranking == "authors":
        return torch.from_numpy(q32).sort(descending=True)[1].numpy().astype(np.int64)
    return np.argsort(-q32, kind="stable").astype(np.int64)


@register(
    "las",
    needs=("energies", "embeddings"),
    summary="LADA's local inconsistency of predictions among cosine kNN, then k-means diversity",
    reference="Sun et al., Local Context-Aware Active Domain Adaptation, ICCV 2023",
)
def las_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator,
    *,
    neighbours: int = 10,
    oversample: int = 10,
    prop_iter: int = 1,
    prop_coef: float = 1.0,
    knn: str = "auto",
    ranking: str = "authors",
    n_init: int = KMEANS_N_INIT,
    **_: Any,
) -> Selection:
    """LAS (module docstring): ``Q`` on the cosine kNN graph, k-means over the top candidates.

    Args:
        pool: energies (``p = softmax(-E)``) and embeddings.
        budget: number of picks (and of k-means clusters).
        rng: seeds k-means.
        neighbours: ``K`` (``LADA.S_K``, authors' default 10; 5 in their Office-31 config).
        oversample: ``M`` (``LADA.S_M``, default 10; 5 for VisDA): k-means runs on the
            ``budget x (1 + M)`` samples of highest ``Q``.
        prop_iter: ``LADA.S_PROP_ITER`` (default 1).
        prop_coef: ``LADA.S_PROP_COEF`` (default 1.0).
        knn: the neighbour search: ``auto`` (default; exact below :data:`EXACT_BELOW` =
            50,000 samples, faiss HNSW from there on), ``exact`` or ``faiss`` (module
            docstring); ``info["knn"]`` says which ran.
        ranking: the order of the ``Q`` scores (:func:`rank_scores`): ``authors`` (default,
            their unstable ``torch.sort``) or ``stable`` (ties by position, an option).
        n_init: k-means initialisations (default :data:`KMEANS_N_INIT` = 10, the authors'
            scikit-learn's default), best inertia kept.

    Example:
        >>> gen = np.random.default_rng(0)
        >>> e, z = gen.normal(size=(50, 3)), gen.normal(size=(50, 4))
        >>> pool = PoolOutputs(energies=e, embeddings=z)
        >>> len(las_select(pool, 5, np.random.default_rng(0), neighbours=5).indices)
        5
    """
    import torch
    from sklearn.cluster import KMeans  # a core dependency; imported here to keep imports light

    n = check_request(pool, budget)
    if neighbours < 1 or oversample < 0 or prop_iter < 0:
        raise ValueError(
            f"las: neighbours must be >= 1, oversample and prop_iter >= 0; got {neighbours}, "
            f"{oversample}, {prop_iter}"
        )
    if knn not in KNN_METHODS:
        raise ValueError(f"active.params.knn must be one of {', '.join(KNN_METHODS)}; got {knn!r}")
    if n_init < 1:
        raise ValueError(f"las: n_init must be >= 1, got {n_init}")
    z = pool.require_embeddings("las")
    # their softmax of the model's float32 logits (-E)
    energies = torch.from_numpy(np.ascontiguousarray(pool.require_energies("las"), np.float32))
    probs = torch.softmax(-energies, dim=1).numpy()
    q, used = las_scores(probs, z, neighbours, prop_iter, prop_coef, knn)
    ranked = rank_scores(q, ranking)
    cand = ranked[: min(n, budget * (1 + oversample))]
    zc = torch.nn.functional.normalize(torch.from_numpy(np.asarray(z[cand], np.float32)), dim=1)
    # their KMeans receives a float32 torch tensor, which scikit-learn converts to float64
    x64 = zc.numpy().astype(np.float64)
    km = KMeans(
        n_clusters=budget,
        n_init=n_init,
        algorithm="lloyd",
        random_state=int(rng.integers(2**31 - 1)),
    )
    km.fit(x64)
    picked = cand[centroid_picks(km.cluster_centers_, x64)]
    return Selection(
        indices=picked.astype(np.int64),
        scores={"local_inconsistency": q},
        info={"candidates": len(cand), "kmeans_iterations": int(km.n_iter_), "knn": used},
    )
