"""Active-DA strategies that look at the domain gap: AADA, TQS, DBAL, and WAAL.

AADA, TQS and WAAL score the pool with networks trained beside the classifier (a domain
discriminator, a committee of heads, a Wasserstein critic); those are the training components of
:mod:`eada.train.aux`, which the trainer switches on for these strategies and which put their
per-sample outputs into ``PoolOutputs.extra``:

* ``domain_source_prob`` ``(N,)``: the discriminator's ``P(source | z)``;
* ``committee_energies`` ``(N, K, C)``: the energies of the ``K`` committee heads;
* ``critic_score`` ``(N,)``: the critic's output (high = unlike the labeled data).

The strategies themselves only rank, so any source of those scores works (e.g. a human study).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eada.strategies.base import PoolOutputs, Selection, check_request, register, top_k_stable
from eada.strategies.clue import entropy_from_energies
from eada.strategies.diversity import min_sq_distances


def _softmax_neg(energies: np.ndarray) -> np.ndarray:
    e = -np.asarray(energies, dtype=np.float64)
    e -= e.max(axis=-1, keepdims=True)
    p = np.exp(e)
    return p / p.sum(axis=-1, keepdims=True)


@register(
    "aada",
    needs=("energies", "embeddings", "domain_source_prob"),
    summary="importance weight (1-D)/D of a domain discriminator times entropy",
    reference="Su et al., Active Adversarial Domain Adaptation, WACV 2020",
)
def aada_select(
    pool: PoolOutputs, budget: int, rng: np.random.Generator | None = None, **_: Any
) -> Selection:
    """AADA: ``s(x) = (1 - D(x)) / D(x) * H(p(y|x))``, ``D(x) = P(source | G_f(x))``; the top
    ``budget`` scores. ``D`` is clipped to ``[1e-6, 1 - 1e-6]``."""
    check_request(pool, budget)
    d = np.clip(
        pool.require_extra("domain_source_prob", "aada", "domain_discriminator"), 1e-6, 1 - 1e-6
    )
    h = entropy_from_energies(pool.require_energies("aada"))
    s = (1.0 - d) / d * h
    return Selection(
        indices=top_k_stable(s, budget), scores={"aada": s, "entropy": h, "domain_source_prob": d}
    )


@register(
    "tqs",
    needs=("energies", "embeddings", "committee_energies", "domain_source_prob"),
    summary="committee disagreement + margin uncertainty + domainness (1 - D), summed",
    reference="Fu et al., Transferable Query Selection for Active Domain Adaptation, CVPR 2021",
)
def tqs_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator | None = None,
    *,
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
    **_: Any,
) -> Selection:
    """TQS's three transferable criteria, each in ``[0, 1]``, combined as a weighted sum:

    * committee: share of the ``K`` committee heads (plus the main head) whose vote differs from
      the majority vote, scaled to ``[0, 1]``;
    * uncertainty: ``1 - (p_1 - p_2)`` on the committee-mean posterior (margin);
    * domainness: ``1 - D(x)``, ``D`` the discriminator's ``P(source)``.

    ``weights`` weight (committee, uncertainty, domainness); equal by default.
    """
    n = check_request(pool, budget)
    if len(weights) != 3 or min(weights) < 0:
        raise ValueError(f"tqs weights must be three non-negative numbers, got {weights}")
    committee = np.asarray(pool.require_extra("committee_energies", "tqs", "committee"))
    if committee.ndim != 3:
        raise ValueError(f"committee_energies must be (N, K, C), got {committee.shape}")
    main = pool.require_energies("tqs")
    members = np.concatenate([main[:, None, :], committee], axis=1)  # (N, K+1, C)
    p = _softmax_neg(members)
    votes = p.argmax(axis=2)
    c = p.shape[2]
    counts = np.zeros((n, c), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n), votes.shape[1]), votes.ravel()), 1)
    k = votes.shape[1]
    disagree = (k - counts.max(axis=1)) / max(1, k - 1)
    pbar = p.mean(axis=1)
    top2 = -np.partition(-pbar, 1, axis=1)[:, :2]
    uncertainty = 1.0 - (top2[:, 0] - top2[:, 1])
    d = pool.require_extra("domain_source_prob", "tqs", "domain_discriminator")
    domainness = 1.0 - np.clip(d, 0.0, 1.0)
    s = weights[0] * disagree + weights[1] * uncertainty + weights[2] * domainness
    return Selection(
        indices=top_k_stable(s, budget),
        scores={
            "tqs": s,
            "committee_disagreement": disagree,
            "uncertainty": uncertainty,
            "domainness": domainness,
        },
    )


@register(
    "dbal",
    needs=("embeddings", "labeled_embeddings", "source_embeddings"),
    summary="greedy k-medoids on target embeddings, source and labeled data as fixed medoids",
    reference="de Mathelin et al., Discrepancy-Based Active Learning for Domain Adaptation, "
    "ICLR 2022 (arXiv 2021)",
)
def dbal_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator,
    *,
    n_candidates: int = 2000,
    n_eval: int = 5000,
    **_: Any,
) -> Selection:
    """DBAL's query: minimise the discrepancy bound ``sum_t min_{q in S u L u Q} ||z_t - z_q||``
    over the query set ``Q`` by greedy k-medoids, source ``S`` and labeled target ``L`` being
    fixed medoids (their distances are computed in chunks: O(D N (M + L))).

    As the authors' mini-batch k-medoids, the greedy gain is evaluated on a random subsample of
    ``n_eval`` pool points and the medoid is searched among ``n_candidates`` random pool points
    (both drawn from ``rng``; all points when the pool is smaller), so one pick costs
    O(n_candidates * n_eval) after an O(D * n_candidates * n_eval) distance block. The budget may
    exceed ``n_candidates``: later picks come from the remaining pool by the same rule.
    Score ``dbal_distance``: distance of every pool point to its nearest fixed medoid.
    """
    n = check_request(pool, budget)
    if n_candidates < 1 or n_eval < 1:
        raise ValueError("dbal needs n_candidates >= 1 and n_eval >= 1")
    z = np.ascontiguousarray(pool.require_embeddings("dbal"), dtype=np.float32)
    fixed = np.concatenate(
        [
            pool.require_rows("source_embeddings", "dbal").astype(np.float32),
            pool.require_rows("labeled_embeddings", "dbal").astype(np.float32),
        ]
    ).reshape(-1, z.shape[1])
    base = np.sqrt(min_sq_distances(z, fixed)).astype(np.float64)
    finite_max = float(base[np.isfinite(base)].max()) if np.isfinite(base).any() else 0.0
    scores = np.where(np.isfinite(base), base, finite_max)
    eval_idx = np.sort(rng.choice(n, size=min(n, n_eval), replace=False))
    cur = base[eval_idx].copy()
    if not np.isfinite(cur).all():  # no fixed medoids: start from the largest possible distance
        span = float(np.sqrt(np.ptp(z, axis=0) ** 2).sum()) + 1.0
        cur[~np.isfinite(cur)] = span
    taken = np.zeros(n, dtype=bool)
    picked: list[int] = []
    ze = z[eval_idx]
    while len(picked) < budget:
        free = np.flatnonzero(~taken)
        cand = np.sort(rng.choice(free, size=min(len(free), n_candidates), replace=False))
        dist = np.sqrt(
            np.maximum(
                np.einsum("ij,ij->i", z[cand], z[cand])[:, None]
                - 2.0 * z[cand] @ ze.T
                + np.einsum("ij,ij->i", ze, ze)[None, :],
                0.0,
            )
        )
        alive = np.ones(len(cand), dtype=bool)
        for _step in range(min(budget - len(picked), len(cand))):
            gain = np.maximum(cur[None, :] - dist, 0.0).sum(axis=1)
            gain[~alive] = -1.0
            b = int(np.argmax(gain))
            picked.append(int(cand[b]))
            taken[cand[b]] = True
            alive[b] = False
            np.minimum(cur, dist[b], out=cur)
    return Selection(
        indices=np.asarray(picked, dtype=np.int64),
        scores={"dbal_distance": scores},
        info={"n_fixed_medoids": len(fixed), "objective": float(cur.sum())},
    )


@register(
    "waal",
    needs=("energies", "embeddings", "critic_score"),
    summary="uncertainty upper bound minus a Wasserstein critic's score (most uncertain, least "
    "like the labeled data)",
    reference="Shui et al., Deep Active Learning: Unified and Principled Method for Query and "
    "Training (WAAL), AISTATS 2020",
)
def waal_select(
    pool: PoolOutputs,
    budget: int,
    rng: np.random.Generator | None = None,
    *,
    selection: float = 10.0,
    **_: Any,
) -> Selection:
    """WAAL's query (authors' code): ``u(x) = 0.5 ||log p||_2 + 0.5 (-sum_y log p_y)`` is an
    upper bound that is SMALL for uncertain samples, ``c(x)`` the critic's score (high = far from
    the labeled distribution); the ``budget`` smallest ``u(x) - selection * c(x)`` are picked.
    The returned score ``waal`` is the negation (larger = picked first)."""
    check_request(pool, budget)
    if selection < 0:
        raise ValueError(f"waal selection weight must be >= 0, got {selection}")
    p = np.clip(pool.probabilities("waal"), 1e-12, None)
    logp = np.log(p)
    u = 0.5 * np.linalg.norm(logp, axis=1) + 0.5 * (-logp.sum(axis=1))
    c = pool.require_extra("critic_score", "waal", "wasserstein_critic").astype(np.float64)
    s = selection * c - u
    return Selection(
        indices=top_k_stable(s, budget), scores={"waal": s, "uncertainty_bound": u, "critic": c}
    )
