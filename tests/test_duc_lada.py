"""DUC (ICLR 2023) and LADA (ICCV 2023) against their authors' code, on the same fixed outputs.

Each ``_authors_*`` function below is a small independent transcription, in our own words, of
what the authors' code does (BIT-DA/DUC ``core/active/active.py``, ``core/active/loss.py``,
``main.py``; tsun/LADA ``active/LASsampler.py``): a plain loop over the pool, full matrices,
Python sorts. Our strategies must pick the same samples and our loss must give the same value.
"""

from __future__ import annotations

import math
import sys
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans

from eada.config import ConfigError, load_config
from eada.strategies import PoolOutputs, get_strategy
from eada.strategies import lada as lada_mod
from eada.strategies.components import Evidential, StepBatch, evidential_loss
from eada.strategies.duc import dirichlet_uncertainties

# ---------------------------------------------------------------- DUC


def _authors_duc(
    logits: torch.Tensor, totality: int, active_ratio: float, kappa: float, batch: int = 32
) -> list[int]:
    """DUC_active's semantics: the float32 outputs scored a loader batch at a time (here a
    sequential loader: theirs is shuffled), one (index, U_dis, U_data) row per sample as
    Python floats, sorted by U_dis (descending, Python's stable sort), the first
    ceil(totality * ratio * kappa) kept, sorted by U_data, the first ceil(totality * ratio)."""
    rows: list[list[float]] = []
    for start in range(0, len(logits), batch):
        out = logits[start : start + batch]
        alpha = torch.exp(out)
        total = torch.sum(alpha, dim=1, keepdim=True)
        p = alpha / total
        point_entropy = -torch.sum(p * torch.log(p + 1e-7), dim=1)
        data = torch.sum((alpha / total) * (torch.digamma(total + 1) - torch.digamma(alpha + 1)), 1)
        dis = point_entropy - data
        for i in range(len(out)):
            rows.append([start + i, dis[i].item(), data[i].item()])
    first = sorted(rows, key=lambda r: r[1], reverse=True)
    first = first[: math.ceil(totality * active_ratio * kappa)]
    second = sorted(first, key=lambda r: r[2], reverse=True)
    return [int(r[0]) for r in second[: math.ceil(totality * active_ratio)]]


def _duc_pools() -> list[tuple[str, np.ndarray, int]]:
    """(what, energies, totality): many pool shapes. Sizes 40-5,000 (Office-Home Art's 2,427,
    where the stage-1 rules differ), 2-65 classes, pools of later rounds (smaller than the
    target set), exact ties (quantised energies, duplicated rows), confident pools."""
    rng = np.random.default_rng(32)
    pools = []
    for n, c in [(40, 2), (243, 5), (700, 12), (1000, 31), (2427, 65), (5000, 10)]:
        e = rng.normal(scale=3.0, size=(n, c)) - 1.0
        pools.append((f"normal {n}x{c}", e, n))
        pools.append((f"later round {n}x{c}", e[: n - n // 20], n))
        pools.append((f"quantised {n}x{c}", np.round(e), n))
        dup = e.copy()
        dup[n // 2 :] = dup[: n - n // 2]  # every sample twice
        pools.append((f"duplicates {n}x{c}", dup, n))
        conf = rng.normal(size=(n, c)) * 2.0
        conf[np.arange(n), rng.integers(0, c, n)] -= rng.uniform(25, 30, n)  # logit gaps 25-30
        pools.append((f"confident {n}x{c}", conf, n))
    pools.append(("saturated", np.tile([[-80.0, 0.0, 0.0]], (300, 1)), 300))
    return pools


@pytest.mark.parametrize("ratio", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("kappa", [2, 10])
def test_duc_picks_equal_the_authors_semantics(kappa: int, ratio: float) -> None:
    """100 % identical picks (same samples, same order) with the authors' selection on every
    pool shape of :func:`_duc_pools`, by default (stage1 authors, float32 scores)."""
    differ = 0
    for what, energies, totality in _duc_pools():
        budget = math.ceil(totality * ratio)
        if budget > len(energies):
            continue
        pool = PoolOutputs(energies=energies, n_target=totality)
        ours = get_strategy("duc").fn(pool, budget, None, kappa=kappa, budget_share=ratio)
        theirs = _authors_duc(-torch.from_numpy(energies).float(), totality, ratio, kappa)
        assert ours.indices.tolist() == theirs, what
        old = get_strategy("duc").fn(pool, budget, None, kappa=kappa, stage1="budget")
        differ += old.indices.tolist() != theirs
    if kappa == 10 and ratio == 0.01:  # the earlier rule is not theirs (Office-Home Art)
        assert differ > 0


def test_duc_stage1_count_is_the_authors() -> None:
    from eada.strategies.duc import stage1_count

    assert stage1_count(2427, 25, 10, "authors", 2427, 0.01) == 243  # Office-Home Art
    assert stage1_count(2427, 25, 10, "budget") == 250  # ours before, an option
    assert stage1_count(55388, 554, 10, "authors", 55388, 0.01) == 5539  # VisDA-2017 real
    assert stage1_count(55388, 554, 10, "budget") == 5540
    assert stage1_count(2402, 25, 10, "authors", 2427, 0.01) == 243  # later round: N_T fixed
    assert stage1_count(100, 5, 10, "authors", 2427, 0.01) == 100  # capped at the pool
    with pytest.raises(ValueError, match="stage1"):
        stage1_count(10, 1, 2, "nope")


def test_duc_float32_and_float64_scores_differ_on_confident_pools() -> None:
    """The authors score float32 outputs; on a confident pool float64 picks other samples."""
    rng = np.random.default_rng(0)
    e = rng.normal(size=(2000, 10)) * 2.0
    e[np.arange(2000), rng.integers(0, 10, 2000)] -= rng.uniform(25, 30, 2000)
    pool = PoolOutputs(energies=e, n_target=2000)
    f32 = get_strategy("duc").fn(pool, 20, None, budget_share=0.01)
    f64 = get_strategy("duc").fn(pool, 20, None, budget_share=0.01, precision="float64")
    assert f32.info["precision"] == "float32"
    assert set(f32.indices.tolist()) != set(f64.indices.tolist())


def test_duc_rejects_overflowing_evidence_and_small_kappa() -> None:
    # float32: exp(-E) overflows below about -88.7 (the old bound said -709)
    pool = PoolOutputs(energies=np.array([[-89.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"overflows below about -88\.7"):
        get_strategy("duc").fn(pool, 1, None)
    ok = get_strategy("duc").fn(PoolOutputs(energies=np.array([[-88.0, 0.0], [0.0, 0.0]])), 1, None)
    assert len(ok.indices) == 1
    assert get_strategy("duc").fn(pool, 1, None, precision="float64").indices.tolist() == [1]
    with pytest.raises(ValueError, match=r"overflows below about -709\.8"):
        get_strategy("duc").fn(
            PoolOutputs(energies=np.array([[-710.0, 0.0]])), 1, None, precision="float64"
        )
    with pytest.raises(ValueError, match="not a finite positive"):  # S underflows to 0
        get_strategy("duc").fn(PoolOutputs(energies=np.array([[104.0, 105.0]])), 1, None)
    with pytest.raises(ValueError, match="kappa"):
        get_strategy("duc").fn(PoolOutputs(energies=np.zeros((3, 2))), 1, None, kappa=0.5)


def _authors_edl(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EDL_Loss.forward (without .cuda())."""
    alpha = torch.exp(logits)
    total_alpha = torch.sum(alpha, dim=1, keepdim=True)
    one_hot = torch.eye(logits.shape[1])[labels]
    nll = torch.sum(one_hot * (total_alpha.log() - alpha.log())) / logits.shape[0]
    total_beta = torch.sum(torch.ones((1, logits.shape[1])), dim=1)
    new_alpha = one_hot + (1.0 - one_hot) * alpha
    new_total = torch.sum(new_alpha, dim=1)
    kl = (
        torch.sum(
            torch.lgamma(new_total)
            - torch.lgamma(total_beta)
            - torch.sum(torch.lgamma(new_alpha), dim=1)
            + torch.sum(
                (new_alpha - 1) * (torch.digamma(new_alpha) - torch.digamma(new_total[:, None])),
                dim=1,
            )
        )
        / logits.shape[0]
    )
    return nll, kl


def _authors_step_loss(
    out_s: torch.Tensor,
    ys: torch.Tensor,
    out_u: torch.Tensor,
    out_l: torch.Tensor,
    yl: torch.Tensor,
    beta: float,
    lam: float,
) -> torch.Tensor:
    """The total_loss of one step of their main.py (not VisDA's halving)."""
    c = out_s.shape[1]
    nll_s, kl_s = _authors_edl(out_s, ys)
    total = nll_s + kl_s / c
    alpha = torch.exp(out_u)
    s = torch.sum(alpha, dim=1, keepdim=True)
    p = alpha / s
    ent = -torch.sum(p * torch.log(p + 1e-7), dim=1)
    data = torch.sum(p * (torch.digamma(s + 1) - torch.digamma(alpha + 1)), dim=1)
    total = total + beta * torch.sum(ent - data) / len(out_u)
    total = total + lam * torch.sum(data) / len(out_u)
    nll_t, kl_t = _authors_edl(out_l, yl)
    return total + nll_t + kl_t / c


def test_duc_loss_equals_the_authors_on_a_fixed_batch() -> None:
    torch.manual_seed(3)
    head = torch.nn.Linear(8, 5)
    z = torch.randn(40, 8) * 2
    ys, yl = torch.randint(0, 5, (16,)), torch.randint(0, 5, (8,))
    zs, zu, zl = z[:16], z[16:32], z[32:]
    batch = StepBatch(zs, ys, zu, zl, yl, head)
    ours, logs = Evidential(beta=1.0, lam=0.05).loss(batch)
    theirs = _authors_step_loss(-head(zs), ys, -head(zu), -head(zl), yl, 1.0, 0.05)
    assert ours.dtype == torch.float64  # accumulated in float64 (log space)
    torch.testing.assert_close(ours.float(), theirs, rtol=2e-6, atol=1e-6)
    # and the same gradient on the head
    g_ours = torch.autograd.grad(ours, head.weight)[0]
    theirs = _authors_step_loss(-head(zs), ys, -head(zu), -head(zl), yl, 1.0, 0.05)
    g_theirs = torch.autograd.grad(theirs, head.weight)[0]
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-6)
    # the same in float64 on both sides: equal to rounding
    x = torch.randn(16, 5, dtype=torch.float64) * 4
    nll64, kl64 = evidential_loss(x, ys)
    nll_a, kl_a = _authors_edl(x, ys)
    torch.testing.assert_close((nll64, kl64), (nll_a, kl_a), rtol=1e-10, atol=1e-10)
    nll, kl = (t.detach() for t in evidential_loss(-head(zs), ys))
    assert logs["duc_nll"] == pytest.approx(float(nll)) and float(kl) > 0
    # beta = 0 drops the unlabeled terms, as their `if cfg.TRAINER.BETA > 0`
    no_u, logs0 = Evidential(beta=0.0, lam=0.05).loss(batch)
    assert "duc_u_dis" not in logs0 and float(no_u.detach()) < float(ours.detach())


def _kl_reference(logits: list[float], y: int) -> float:
    """KL(Dir(a) || Dir(1)), a = y + (1 - y) exp(logits), in 160-digit arithmetic (mpmath)."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(160):
        a = [mp.mpf(1) if j == y else mp.exp(mp.mpf(v)) for j, v in enumerate(logits)]
        big = mp.fsum(a)
        val = (
            mp.loggamma(big)
            - mp.loggamma(len(a))
            - mp.fsum(mp.loggamma(v) for v in a)
            + mp.fsum((v - 1) * (mp.digamma(v) - mp.digamma(big)) for v in a)
        )
        return float(val)


def test_duc_kl_is_finite_nonnegative_and_right_for_large_logits() -> None:
    """|logit| 50-100 (where the authors' float32 KL is NaN or negative) and beyond: finite,
    non-negative, equal to a 160-digit reference up to 100."""
    rng = np.random.default_rng(5)
    rows, labels = [], []
    for _ in range(60):
        c = int(rng.integers(2, 13))
        row = rng.normal(scale=3.0, size=c)
        row[rng.integers(0, c)] = rng.uniform(50, 100) * rng.choice([-1.0, 1.0])
        rows.append(row.astype(np.float32).tolist())
        labels.append(int(rng.integers(0, c)))
    rows.append([0.0, 55.0, 3.0])  # the authors: a finite NEGATIVE KL
    labels.append(0)
    for row, y in zip(rows, labels, strict=True):
        x = torch.tensor([row], dtype=torch.float32)
        nll, kl = evidential_loss(x, torch.tensor([y]))
        ref = _kl_reference(row, y)
        assert math.isfinite(float(kl)) and float(kl) >= 0, row
        assert float(kl) == pytest.approx(ref, rel=1e-9, abs=1e-9), row
        assert float(nll) == pytest.approx(float(torch.logsumexp(x.double(), 1) - x[0, y]))
    # the authors' float32 code on the same rows: NaN or negative somewhere (what this fixes)
    bad = 0
    for row, y in zip(rows, labels, strict=True):
        _, kl_a = _authors_edl(torch.tensor([row]), torch.tensor([y]))
        bad += not (math.isfinite(float(kl_a)) and float(kl_a) >= 0)
    assert bad > 10
    # beyond: the target's logit any float32 (1e30 and -1e30), the others up to 1e30 and down
    # to -700; the KL grows like exp(-logit) for a negative non-target logit, so below about
    # -709.8 its true value passes float64's range: +inf, never NaN
    for v in (150.0, 1e3, 1e6, 1e30, -1e30, -700.0):
        x = torch.tensor([[v, 200.0, 1e4, -3.0]], dtype=torch.float32, requires_grad=True)
        for y in range(4):
            nll, kl = evidential_loss(x, torch.tensor([y]))
            if v == -1e30 and y != 0:
                assert float(kl.detach()) == math.inf
                continue
            assert math.isfinite(float(kl.detach())) and float(kl.detach()) >= 0, (v, y)
            assert math.isfinite(float(nll.detach())) and float(nll.detach()) >= 0
            (g,) = torch.autograd.grad(nll + kl, x)
            if v == -700.0 and y != 0:  # d KL / d logit = -exp(700): past float32's range
                continue
            assert torch.isfinite(g).all(), (v, y)
    # the unlabeled terms too
    from eada.energy import dirichlet_uncertainties_stable

    x = torch.tensor([[90.0, 0.0, -60.0], [1e6, 1e6, 0.0], [0.5, 0.2, 0.1]])
    u_dis, u_data = dirichlet_uncertainties_stable(x)
    assert torch.isfinite(u_dis).all() and torch.isfinite(u_data).all()
    ref_dis, ref_data = dirichlet_uncertainties(x[2:].double())
    torch.testing.assert_close((u_dis[2:], u_data[2:]), (ref_dis, ref_data))


# ---------------------------------------------------------------- LAS


def _authors_las(
    logits: torch.Tensor, embs: torch.Tensor, n: int, k: int, m: int, seed: int
) -> tuple[torch.Tensor, set[int]]:
    """LASSampling.query's semantics on fixed float32 outputs: softmax of the logits, full
    N x N cosine similarity, topk(K + 1) without the first, one propagation, the unstable
    descending torch sort of Q, KMeans (scikit-learn < 1.4 defaults: n_init 10) on the
    n(1 + M) top candidates given as float64 (what scikit-learn makes of their torch tensor),
    scikit-learn's euclidean distances, NumPy's default argsort, their column loop."""
    from sklearn.metrics.pairwise import euclidean_distances

    probs = torch.softmax(logits, dim=-1)
    embs = torch.nn.functional.normalize(embs, dim=-1)
    sim = embs.mm(embs.transpose(1, 0))
    sim_topk, topk = torch.topk(sim, k=k + 1, dim=1)
    sim_topk, topk = sim_topk[:, 1:], topk[:, 1:]
    wgt = sim_topk / sim_topk.sum(dim=1, keepdim=True)
    q = -((probs[topk] * probs.unsqueeze(1)).sum(-1) * wgt).sum(-1)
    q = q + (wgt * q[topk]).sum(-1) * 1.0
    m_idxs = q.sort(descending=True)[1]
    m_top = m_idxs[: n * (1 + m)]
    x = embs[m_top].numpy().astype(np.float64)
    km = KMeans(n_clusters=n, n_init=10, random_state=seed)
    km.fit(x)
    sort_idxs = euclidean_distances(km.cluster_centers_, x).argsort(axis=1)
    picked: list[int] = []
    ax, rem = 0, n
    while rem > 0:
        picked = list(set(picked) | set(sort_idxs[:, ax][:rem].tolist()))
        rem = n - len(picked)
        ax += 1
    return q, set(m_idxs[picked].tolist())


def _las_pools() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(what, energies, embeddings): sizes 60-3,000, 2-31 classes, ReLU features (theirs),
    saturated predictions (exactly tied Q), duplicated samples (tied neighbours and
    distances), few distinct embeddings."""
    rng = np.random.default_rng(7)
    pools = []
    for n, c, d in [(60, 2, 8), (300, 5, 16), (1000, 12, 32), (3000, 31, 64)]:
        e = rng.normal(scale=2.0, size=(n, c))
        z = np.abs(rng.normal(size=(n, d))).astype(np.float32)
        pools.append((f"normal {n}x{c}", e, z))
        sat = np.zeros((n, c))
        sat[np.arange(n), rng.integers(0, c, n)] = -60.0  # one-hot posteriors: Q ties
        pools.append((f"saturated {n}x{c}", sat, z))
        dup_e, dup_z = e.copy(), z.copy()
        dup_e[n // 2 :], dup_z[n // 2 :] = e[: n - n // 2], z[: n - n // 2]
        pools.append((f"duplicates {n}x{c}", dup_e, dup_z))
        few = np.abs(rng.normal(size=(12, d))).astype(np.float32)[rng.integers(0, 12, n)]
        few = few + np.abs(rng.normal(scale=1e-3, size=few.shape)).astype(np.float32)
        pools.append((f"clustered {n}x{c}", np.round(e), few))
    return pools


@pytest.mark.parametrize(("budget", "k", "m"), [(3, 10, 10), (8, 5, 5), (20, 10, 5)])
def test_las_picks_equal_the_authors_semantics(budget: int, k: int, m: int) -> None:
    """100 % identical picks with the authors' LAS on every pool of :func:`_las_pools`, by
    default (ranking authors, k-means on float64 with 10 initialisations, knn exact)."""
    stable_differs = 0
    for what, energies, z in _las_pools():
        if budget * 2 > len(z):
            continue
        pool = PoolOutputs(energies=energies, embeddings=z)
        sel = get_strategy("las").fn(
            pool, budget, np.random.default_rng(11), neighbours=k, oversample=m
        )
        seed = int(np.random.default_rng(11).integers(2**31 - 1))
        logits = -torch.from_numpy(energies).float()
        q, theirs = _authors_las(logits, torch.from_numpy(z), budget, k, m, seed)
        assert np.array_equal(sel.scores["local_inconsistency"], q.double().numpy()), what
        assert set(sel.indices.tolist()) == theirs, what
        assert len(sel.indices) == budget
        stable = get_strategy("las").fn(
            pool, budget, np.random.default_rng(11), neighbours=k, oversample=m, ranking="stable"
        )
        stable_differs += set(stable.indices.tolist()) != theirs
    if budget == 20:  # the stable ranking is another rule where Q ties (saturated pools)
        assert stable_differs > 0


def test_las_ranking_and_n_init_are_validated() -> None:
    pool = PoolOutputs(energies=np.zeros((20, 2)), embeddings=np.ones((20, 3)))
    with pytest.raises(ValueError, match="ranking"):
        get_strategy("las").fn(pool, 2, np.random.default_rng(0), ranking="nope")
    with pytest.raises(ValueError, match="n_init"):
        get_strategy("las").fn(pool, 2, np.random.default_rng(0), n_init=0)
    q = np.zeros(200, dtype=np.float32)  # all tied: torch's sort order is not the positions'
    assert lada_mod.rank_scores(q, "stable").tolist() == list(range(200))
    assert lada_mod.rank_scores(q, "authors").tolist() == (
        torch.from_numpy(q).sort(descending=True)[1].tolist()
    )


def test_las_blocked_neighbours_equal_the_full_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lada_mod, "_BLOCK_ELEMENTS", 50)  # many blocks of one or two rows
    z = np.random.default_rng(0).normal(size=(37, 5))
    sims, idx = lada_mod.cosine_neighbours(z, 4)
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    full = zn @ zn.T
    ref = np.argsort(-full, axis=1)[:, 1:5]
    assert idx.tolist() == ref.tolist()
    np.testing.assert_allclose(sims.numpy(), np.take_along_axis(full, ref, 1), rtol=1e-5)


def _clustered_pool(n: int, seed: int) -> PoolOutputs:
    """``n`` samples around 10 class centres in 32 dimensions, energies from a linear head."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(10, 32))
    z = (centres[rng.integers(10, size=n)] + rng.normal(size=(n, 32))).astype(np.float32)
    return PoolOutputs(energies=-(z @ centres.T) / np.linalg.norm(centres, axis=1), embeddings=z)


@pytest.mark.parametrize("seed", [0, 1])
def test_las_faiss_above_the_threshold_agrees_with_exact(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("faiss")
    monkeypatch.setattr(lada_mod, "EXACT_BELOW", 1000)  # 3,000 samples: auto takes faiss
    pool = _clustered_pool(3000, seed)
    z = np.asarray(pool.embeddings)
    _, exact = lada_mod.cosine_neighbours(z, 10)
    _, approx, used = lada_mod.knn_neighbours(z, 10)
    assert used == "faiss"
    recall = np.mean(
        [len(set(a) & set(b)) / 10 for a, b in zip(exact.tolist(), approx.tolist(), strict=True)]
    )
    assert recall >= 0.95
    las = get_strategy("las").fn
    # M = 0: the picks are the budget samples of highest Q, nearly the same ones
    ex = las(pool, 60, np.random.default_rng(1), oversample=0, knn="exact")
    fa = las(pool, 60, np.random.default_rng(1), oversample=0)
    assert fa.info["knn"] == "faiss" and ex.info["knn"] == "exact"
    assert len(set(ex.indices.tolist()) & set(fa.indices.tolist())) >= 0.9 * 60
    # the default M = 10: the k-means candidates (the 30 x 11 of highest Q) nearly the same
    q_ex, q_fa = ex.scores["local_inconsistency"], fa.scores["local_inconsistency"]
    top_ex, top_fa = (set(np.argsort(-q, kind="stable")[:330].tolist()) for q in (q_ex, q_fa))
    assert len(top_ex & top_fa) >= 0.95 * 330


def test_las_faiss_is_deterministic() -> None:
    pytest.importorskip("faiss")
    z = np.asarray(_clustered_pool(1500, 3).embeddings)
    first = lada_mod.faiss_neighbours(z, 10, threads=1)
    again = lada_mod.faiss_neighbours(z, 10, threads=2)  # the search's threads change nothing
    assert torch.equal(first[1], again[1]) and torch.equal(first[0], again[0])
    pool = _clustered_pool(1500, 3)
    picks = [
        get_strategy("las").fn(pool, 15, np.random.default_rng(5), knn="faiss").indices
        for _ in range(2)
    ]
    np.testing.assert_array_equal(picks[0], picks[1])


def test_las_without_faiss_searches_exactly_with_a_note(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss raises ImportError
    monkeypatch.setattr(lada_mod, "EXACT_BELOW", 10)
    monkeypatch.setattr(lada_mod, "_noted", set())
    pool = _clustered_pool(200, 0)
    sel = get_strategy("las").fn(pool, 4, np.random.default_rng(0))
    assert sel.info["knn"] == "exact"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "faiss is not installed" in err
    with pytest.raises(ImportError, match=r"eada\[fast\]"):
        get_strategy("las").fn(pool, 4, np.random.default_rng(0), knn="faiss")


def test_las_knn_is_validated() -> None:
    pool = _clustered_pool(50, 0)
    with pytest.raises(ValueError, match=r"active\.params\.knn must be one of auto, exact, faiss"):
        get_strategy("las").fn(pool, 4, np.random.default_rng(0), knn="hnsw")
    with pytest.raises(ConfigError, match=r"active\.params\.knn must be one of"):
        load_config(
            "configs/office_caltech10_surf.yaml", ["active.strategy=las", "active.params.knn=ivf"]
        )


def test_las_centroid_picks_take_next_nearest_when_shared() -> None:
    # both centres are nearest to row 0; the second centre takes its next nearest (row 2)
    x = np.array([[0.0], [5.0], [0.4], [10.0]])
    centres = np.array([[0.1], [0.3]])
    assert lada_mod.centroid_picks(centres, x).tolist() == [0, 2]


def _protocol_configs(prefix: str, method: str) -> list[tuple[Any, Any]]:
    """``configs/{prefix}_*.yaml`` (Office-31 A->W, Office-Home Ar->Cl, VisDA-2017), loaded,
    each checked to say in its header that it follows ``method``'s authors and has not been
    run to completion."""
    from pathlib import Path

    from eada.config import load_config

    paths = sorted((Path(__file__).resolve().parents[1] / "configs").glob(f"{prefix}_*.yaml"))
    assert [p.name for p in paths] == [
        f"{prefix}_office31_amazon_webcam.yaml",
        f"{prefix}_office_home_ar_cl.yaml",
        f"{prefix}_visda2017.yaml",
    ]
    out = []
    for path in paths:
        header = " ".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))
        assert f"{method} authors' protocol" in header
        assert "not yet run to completion here" in header
        out.append((path, load_config(path)))
    return out


def test_duc_configs_follow_the_authors_protocol() -> None:
    from eada.hparams import METHODS

    for path, cfg in _protocol_configs("duc", "DUC"):
        assert cfg.active.strategy == "duc" and cfg.active.rounds_at == [10, 12, 14, 16, 18]
        visda = "visda" in path.name
        extra = {"duc_source_weight": 0.5} if visda else {}  # their main.py:148-150
        assert cfg.active.params == {**METHODS["duc"]["active"]["params"], **extra}
        assert (cfg.train.gamma, cfg.train.delta_s, cfg.train.delta_t) == (0.0, 0.0, 0.0)
        assert cfg.optim.name == "sgd" and cfg.optim.weight_decay == 1e-3
        assert cfg.optim.lr == (0.001 if visda else 0.004)
        assert cfg.optim.nesterov and cfg.optim.schedule == "inv"
        assert (cfg.optim.schedule_gamma, cfg.optim.schedule_power) == (0.001, 0.75)
        tf = cfg.data.transforms  # type: ignore[union-attr]
        assert tf.train_crop == ("center" if visda else "random_resized")
        assert (tf.scoring_view, tf.unlabeled_view) == ("train_plain", "train_plain")
        assert tf.jitter == (0.4, 0.4, 0.4, 0.1) and tf.hflip  # COLORJITTER_SCALAR 0.5
        assert cfg.model.bottleneck_dim == 256 and cfg.model.bottleneck_relu  # their ResNetFc


def test_inv_schedule_and_nesterov_in_the_trainer() -> None:
    """optim.schedule inv: step i trains at lr (1 + 0.001 i)^-0.75 in every group (their
    LrScheduler), counted in the optimiser state; optim.nesterov needs SGD with momentum."""
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer

    sets = ["train.epochs=1", "active.rounds_at=[]", "optim.name=sgd", "optim.lr=0.01"]
    cfg = preset_config("toy", "duc", 0, [*sets, "optim.nesterov=true", "optim.schedule=inv"])
    tr = ActiveDATrainer(cfg, load_task(cfg.data))
    assert tr.optimizer.param_groups[0]["nesterov"] is True
    lrs = []
    for _ in range(4):
        tr.train_step()
        lrs.append(tr.optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.01 * (1 + 0.001 * i) ** -0.75 for i in range(4)], rel=1e-12)
    assert tr.optimizer.state_dict()["param_groups"][0]["schedule_step"] == 4
    with pytest.raises(ConfigError, match="nesterov"):
        preset_config("toy", "duc", 0, ["optim.nesterov=true"])  # Adadelta


def test_duc_trains_its_evidential_loss_also_between_rounds() -> None:
    # a project store trains each segment between rounds as a run without rounds: DUC's whole
    # classifier loss is its component, so the component must be built there too
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer

    cfg = preset_config("toy", "duc", 0, ["train.epochs=1", "active.rounds_at=[]"])
    tr = ActiveDATrainer(cfg, load_task(cfg.data))
    assert tr.aux is not None and tr.aux.names == ["evidential"]
    step = tr.train_step()
    assert step["loss"] > 0 and "duc_kl" in step


def test_duc_in_the_trainer_uses_the_authors_stage1_and_per_domain_passes() -> None:
    """The trainer hands DUC the round's share (stage 1 = ceil(N_T * r * kappa)); DUC's runner
    embeds the source, unlabeled and labeled batches in separate forward passes (batch-norm
    statistics per domain) and draws its target batches without replacement."""
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer

    cfg = preset_config("toy", "duc", 0, ["train.epochs=2", "active.rounds_at=[1]"])
    tr = ActiveDATrainer(cfg, load_task(cfg.data))
    n_t = len(tr.task.target)
    share = cfg.active.budget_per_round
    assert isinstance(share, float)
    rec = tr.select_round(1, 1, math.ceil(n_t * share))
    assert rec["selection_info"]["stage1"] == math.ceil(n_t * share * 10)
    prop = tr.last_proposal
    assert tr.aux is not None and tr.aux.per_domain and tr.aux.without_replacement
    seen: list[int] = []
    calls: list[int] = []
    embed = tr.model.embed

    def counting(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        return embed(x)

    tr.model.embed = counting  # type: ignore[method-assign]
    orig = tr.aux._draw

    def record(idx: torch.Tensor, which: str) -> torch.Tensor:
        out = orig(idx, which)
        if which == "unlabeled":
            seen.extend(out.tolist())
        return out

    tr.aux._draw = record  # type: ignore[method-assign]
    steps = (n_t - len(prop.chosen)) // cfg.train.batch_size
    for _ in range(steps):
        calls.clear()
        tr.aux.loss(tr, *tr.source_stream.next())
        assert len(calls) == 3  # source, unlabeled, labeled: one pass each
    assert len(seen) == len(set(seen))  # one pass over the unlabeled set: no repeats


# ---------------------------------------------------------------- RAA / LAA


def _authors_additions(
    nn_idxs: torch.Tensor,
    prob_nn: torch.Tensor,
    seed_idxs: list[int],
    seed_labels: list[int],
    th: float,
    randoms: list[float],
) -> tuple[list[int], list[int]]:
    """The acceptance loop of RAASolver/LAASolver.solve after a step (tgt_idxs = positions)."""
    dist = np.eye(prob_nn.shape[-1])[np.array(seed_labels)].sum(0) + 1
    dist = dist / dist.max()  # LAA's extra normalisation (RAA skips it: same sp)
    sp = 1 - dist / dist.max() + dist.min() / dist.max()
    conf_idx, conf_pl = [], []
    for i in range(prob_nn.shape[0]):
        idx = int(nn_idxs[i].item())
        pl_i = prob_nn[i].argmax(-1).item()
        if randoms[i] <= sp[pl_i] and prob_nn[i].max(-1)[0] >= th and idx not in seed_idxs:
            conf_idx.append(idx)
            conf_pl.append(pl_i)
    return conf_idx, conf_pl


@pytest.mark.parametrize("local", [False, True])
def test_anchor_augmentation_adds_what_the_authors_add(local: bool) -> None:
    from eada.strategies.components import accept_anchors, local_candidates

    gen = torch.Generator().manual_seed(1)
    n, c, d, k, bs = 300, 5, 8, 10, 200
    cache = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
    seed_idxs = torch.randperm(n, generator=gen)[:40].tolist()
    seed_labels = torch.randint(c, (40,), generator=gen).tolist()
    seed_labels[:20] = [0] * 20  # unbalanced: class 0 is accepted less often
    emb_ts = torch.randn(bs, d, generator=gen)
    if local:  # LAA: sim to the cache, topk K, one random column each
        cols = torch.randint(k, (bs, 1), generator=gen)
        sim = torch.nn.functional.normalize(emb_ts).mm(cache.transpose(1, 0))
        theirs_nn = torch.gather(torch.topk(sim, k=k, dim=1)[1], -1, cols).squeeze(1)
        nn_idxs = local_candidates(emb_ts, cache, k, cols.squeeze(1))
        assert nn_idxs.tolist() == theirs_nn.tolist()
    else:  # RAA: uniform positions
        nn_idxs = torch.randint(0, n, (bs,), generator=gen)
    logits = torch.randn(bs, c, generator=gen) * 8
    prob_nn = torch.softmax(logits, dim=-1)
    randoms = torch.rand(bs, generator=gen).double().numpy()
    theirs = _authors_additions(nn_idxs, prob_nn, seed_idxs, seed_labels, 0.9, randoms.tolist())
    ours = accept_anchors(
        nn_idxs.numpy(),
        prob_nn.double().numpy(),
        np.array(seed_labels),
        set(seed_idxs),
        0.9,
        randoms,
    )
    assert ours == theirs
    assert 0 < len(theirs[0]) < bs  # the fixed state exercises both outcomes


def test_anchor_component_restarts_each_epoch_and_adds_confident_samples() -> None:
    from eada.strategies.components import LocalAnchors, TargetAccess

    torch.manual_seed(0)
    n, d = 60, 4
    z_all = torch.randn(n, d)
    head = torch.nn.Linear(d, 3)
    with torch.no_grad():
        head.weight.mul_(20)  # confident predictions: candidates pass the threshold
    comp = LocalAnchors(3, k=5, threshold=0.5)
    labeled, labels = torch.arange(6), torch.full((n,), -1, dtype=torch.long)
    labels[:6] = torch.tensor([0, 1, 2, 0, 1, 2])

    def access(new_epoch: bool) -> TargetAccess:
        return TargetAccess(n, labeled, labels, new_epoch, 4, lambda idx: z_all[idx])

    acc = access(True)
    idx, y = comp.target_request(acc)  # type: ignore[misc]
    assert set(idx.tolist()) <= set(range(6)) and (y == labels[idx]).all()
    batch = StepBatch(
        z_all[:2],
        torch.zeros(2, dtype=torch.long),
        z_all[:0],
        z_all[:0],
        torch.zeros(0, dtype=torch.long),
        head,
        {comp.name: (z_all[idx], y)},
        acc,
    )
    loss, logs = comp.loss(batch)
    assert loss.requires_grad and logs["anchors"] > 6  # confident neighbours joined
    added = comp.anchor_idx[6:]
    assert not set(added) & set(range(6))
    pred = (-head(z_all[added])).argmax(1).tolist()
    assert comp.anchor_lab[6:] == pred  # pseudo-labels = the model's predictions
    comp.target_request(access(True))  # a new epoch: back to the labeled set
    assert comp.anchor_idx == list(range(6))


# ---------------------------------------------------------------- LADA's protocol (issue 32)


def _toy_trainer(method: str, overrides: list[str]):  # type: ignore[no-untyped-def]
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train import ActiveDATrainer

    cfg = preset_config("toy", method, 0, overrides)
    return ActiveDATrainer(cfg, load_task(cfg.data))


def test_lada_budget_rule_splits_the_rounded_total() -> None:
    """active.budget_total: np.round(N x share) (half to even), total // R a round, the
    remainder in the last: their BudgetAllocator."""
    from eada.config import ActiveConfig
    from eada.train.plan import lada_budgets, round_plan

    def allocator(n: int, share: float, rounds: int) -> list[int]:  # their budget.py
        budget = np.round(n * share)
        per = np.zeros(rounds, dtype=np.int32)
        per[:] = budget // rounds
        per[-1] += budget - per.sum()
        return per.tolist()

    for n in (498, 795, 2427, 2817, 4439, 55388, 10, 130):
        for share in (0.05, 0.1):
            assert lada_budgets(share, n, 5) == allocator(n, share, 5), (n, share)
    plan = round_plan(ActiveConfig(strategy="las", budget_total=0.05), 2427)
    assert [p["budget"] for p in plan] == [24, 24, 24, 24, 25]
    assert [p["pool_before"] for p in plan] == [2427, 2403, 2379, 2355, 2331]
    assert [p["budget"] for p in round_plan(ActiveConfig(budget_total=23), 500)] == [4] * 4 + [7]
    with pytest.raises(ValueError, match="budget_total"):
        round_plan(ActiveConfig(strategy="las", budget_total=0.05), 60)  # 3 // 5 = 0


def test_epoch_length_options() -> None:
    """train.epoch_length: max (EADA/DUC), source (LADA's ft/RAA/LAA), min (LADA's MME)."""
    got = {}
    for how in ("max", "source", "min"):
        tr = _toy_trainer("las", [f"train.epoch_length={how}", "active.rounds_at=[1]"])
        s = tr.source_stream.batches_per_pass
        u = tr.unlabeled_stream.batches_per_pass
        got[how] = tr.steps_per_epoch()
    assert got == {"max": max(s, u), "source": s, "min": min(s, u)}


def test_round_at_epoch_zero_after_a_source_epoch() -> None:
    """LADA's VisDA-2017 protocol: one source epoch (train.source_epochs), then a query before
    the first epoch (rounds_at 0)."""
    tr = _toy_trainer(
        "las",
        [
            "train.epochs=2",
            "active.rounds_at=[0, 1]",
            "train.source_epochs=1",
            "train.eval_every=1",
        ],
    )
    before = [p.detach().clone() for p in tr.model.parameters()]
    res = tr.run()
    assert [r["epoch"] for r in res.rounds] == [0, 0, 1]
    assert res.rounds[1]["n_labeled"] == tr.plan[0]["budget"]
    assert res.rounds[1]["after_training"]["epoch"] == 1  # trained on before the next round
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))
    with pytest.raises(ConfigError, match="rounds_at"):
        from eada.hparams import preset_config

        preset_config("toy", "las", 0, ["active.rounds_at=[-1, 2]"])


def test_mme_separate_step_takes_two_optimiser_steps() -> None:
    """LADA's MMEsolver: the supervised step, then a step on the adversarial entropy alone
    (active.params.mme_separate_step 1); 0 keeps one joint step."""
    for sep, steps in ((0, 1), (1, 2)):
        tr = _toy_trainer(
            "las_mme", ["active.rounds_at=[1]", f"active.params.mme_separate_step={sep}"]
        )
        calls: list[int] = []
        orig = tr.optimizer.step

        def counted(*a, _orig=orig, _calls=calls, **k):  # type: ignore[no-untyped-def]
            _calls.append(1)
            return _orig(*a, **k)

        tr.optimizer.step = counted  # type: ignore[method-assign]
        logs = tr.train_step()
        assert len(calls) == steps and "entropy_unlabeled" in logs


def _mcc_paper(logits: torch.Tensor, t: float) -> float:
    """MCC as the paper defines it (Jin et al. 2020, Eqs. 1-6), with plain loops."""
    y = torch.softmax(logits.double() / t, dim=1)
    b, c = y.shape
    h = [-sum(float(y[i, j]) * math.log(float(y[i, j]) + 1e-5) for j in range(c)) for i in range(b)]
    w = [b * (1 + math.exp(-hi)) / sum(1 + math.exp(-hk) for hk in h) for hi in h]
    conf = [
        [sum(float(y[i, j]) * w[i] * float(y[i, k]) for i in range(b)) for k in range(c)]
        for j in range(c)
    ]
    norm = [[conf[j][k] / sum(conf[j]) for k in range(c)] for j in range(c)]
    return sum(norm[j][k] for j in range(c) for k in range(c) if j != k) / c


def test_mcc_equals_the_papers_definition_on_a_fixed_batch() -> None:
    from eada.energy import min_class_confusion

    torch.manual_seed(1)
    e = torch.randn(16, 6, dtype=torch.float64) * 3
    for t in (2.5, 1.0, 0.05):
        assert float(min_class_confusion(e, t)) == pytest.approx(_mcc_paper(-e, t), rel=1e-9)
    # their code divides column k by its class's sum; C is symmetric, so the same value
    y = torch.softmax(-e / 2.5, dim=1)
    hh = -(y * torch.log(y + 1e-5)).sum(1)
    w = 1 + torch.exp(-hh)
    w = 16 * w / w.sum()
    cov = y.mul(w.view(-1, 1)).T.mm(y)
    cov = cov / (cov.sum(dim=1) + 1e-12)
    theirs = (cov.sum() - torch.trace(cov)) / 6
    assert float(min_class_confusion(e, 2.5)) == pytest.approx(float(theirs), rel=1e-9)
    tr = _toy_trainer("las_mcc", ["active.rounds_at=[1]"])
    logs = tr.train_step()
    assert 0 <= logs["mcc"] <= 1


def test_cdac_losses_equal_their_definitions_on_a_fixed_batch() -> None:
    from eada.energy import cdac_losses, rank_pair_similarity, sigmoid_rampup

    torch.manual_seed(2)
    e, e_bar, e_bar2 = (torch.randn(8, 4, dtype=torch.float64) * 3 for _ in range(3))
    f = torch.randn(8, 10, dtype=torch.float64)
    aac, pl, con = cdac_losses(e, e_bar, e_bar2, f, threshold=0.9, topk=3, consistency_weight=7.0)
    p, pb, pb2 = (torch.softmax(-x, 1) for x in (e, e_bar, e_bar2))
    top = [set(torch.argsort(f[i], descending=True)[:3].tolist()) for i in range(8)]
    bce = 0.0
    for i in range(8):
        for j in range(8):
            s = 1.0 if top[i] == top[j] else 0.0
            pij = float(p[i] @ pb[j])
            bce += -(s * math.log(pij + 1e-7) + (1 - s) * math.log(1 - pij + 1e-7))
    assert float(aac) == pytest.approx(-bce / 64, rel=1e-9)
    want_pl = (
        sum(
            -math.log(float(pb2[i, int(p[i].argmax())])) * (float(p[i].max()) >= 0.9)
            for i in range(8)
        )
        / 8
    )
    assert float(pl) == pytest.approx(want_pl, rel=1e-9)
    assert float(con) == pytest.approx(7.0 * float(((pb - pb2) ** 2).mean()), rel=1e-9)
    assert rank_pair_similarity(f, 3).diagonal().eq(1).all()
    assert sigmoid_rampup(20000, 20000) == 1.0 and sigmoid_rampup(0, 20000) < 0.01
    # in the trainer: a step of its own after the supervised one, once a label exists
    tr = _toy_trainer("las_cdac", ["active.rounds_at=[1]", "active.params.cdac_topk=1"])
    tr.select_round(1, 1, 5)
    calls = []
    orig = tr.optimizer.step

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return orig(*a, **k)

    tr.optimizer.step = counted  # type: ignore[method-assign]
    logs = tr.train_step()
    assert len(calls) == 2 and {"cdac_aac", "cdac_pl", "cdac_con"} <= set(logs)


def test_anchor_mixup_mixes_each_anchor_with_its_anchor_view() -> None:
    """anchor_mixup_alpha > 0: the runner feeds m x + (1 - m) x_aug for the anchors
    (m ~ Beta(a, a) per anchor, x_aug the domain's "anchor" RandAugment view); a domain
    without that view (in-memory inputs) is left as it is."""
    from eada.data.base import TensorDomain

    tr = _toy_trainer("las_laa", ["active.rounds_at=[1]", "active.params.anchor_mixup_alpha=0.2"])
    tr.select_round(1, 1, 10)
    tgt = tr.task.target

    class WithStrong(TensorDomain):
        transforms: ClassVar[dict[str, None]] = {"train": None, "anchor": None}

        def view(self, kind: str) -> TensorDomain:
            if kind == "anchor":
                return TensorDomain(self.name, self.x + 100.0, self.y, list(self.classes))
            return self

    tr.task.target = WithStrong(tgt.name, tgt.x, tgt.y, list(tgt.classes))
    seen: list[torch.Tensor] = []
    embed = tr.model.embed

    def spy(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.detach().clone())
        return embed(x)

    tr.model.embed = spy  # type: ignore[method-assign]
    assert float(tgt.x.abs().max()) < 20  # the toy inputs
    xs, ys = tr.source_stream.next()
    tr.aux.loss(tr, xs, ys)
    assert tr.aux.per_domain is False  # one fused pass: source, unlabeled, labeled, anchors
    # the step's pass: source, unlabeled, labeled (10) and a batch of the anchor set (the ten
    # labeled samples at the epoch's start); the other calls embed candidates (eval mode)
    n_anchor = 10
    (fused,) = [x for x in seen if len(x) == len(xs) + tr.aux.batch_size + 10 + n_anchor]
    assert float(fused[-n_anchor:].max()) > 20  # pulled towards the +100 view by 1 - m
    assert float(fused[:-n_anchor].abs().max()) < 20  # nothing else is mixed
    tr.task.target = tgt  # no anchor view: the anchors' inputs as they are
    seen.clear()
    tr.aux.loss(tr, *tr.source_stream.next())
    assert max(float(x.abs().max()) for x in seen) < 20


def test_lada_configs_follow_the_authors_protocol() -> None:
    for path, cfg in _protocol_configs("lada", "LADA"):
        visda = "visda" in path.name
        a, t, o = cfg.active, cfg.train, cfg.optim
        assert a.strategy == "las" and a.budget_total == 0.05
        assert a.rounds_at == ([0, 2, 4, 6, 8] if visda else [10, 12, 14, 16, 18])
        assert (t.epochs, t.source_epochs) == ((10, 1) if visda else (40, 0))
        assert t.epoch_length == "source" and (t.gamma, t.delta_s, t.delta_t) == (0, 1, 0)
        assert (o.name, o.lr, o.backbone_lr_mult, t.batch_size) == ("adadelta", 0.1, 0.1, 32)
        p = a.params
        k = 5 if "office31" in path.name else 10
        assert (p["neighbours"], p["oversample"]) == (k, 5 if visda else 10)
        assert p["aux_components"] == ["local_anchors"] and p["anchor_neighbours"] == k
        assert (p["anchor_threshold"], p["anchor_mixup_alpha"]) == (0.9, 0.2)
        tr = cfg.data.transforms  # type: ignore[union-attr]
        assert (tr.jitter, tr.hflip, tr.scoring_view) == (None, False, "test")


def test_lada_dann_solver_cosine_head_and_target_only_epochs() -> None:
    """LADA's DANN (a discriminator on the logits + conditional entropy), their cosine
    classifier (model.cosine_temperature) and ft_tgt's epoch (train.epoch_length labeled)."""
    from eada.strategies.components import LogitDiscriminator

    torch.manual_seed(4)
    head = torch.nn.Linear(6, 3)
    z = torch.randn(12, 6)
    comp = LogitDiscriminator(3, 0.1, 0.1)
    batch = StepBatch(
        z[:5],
        torch.zeros(5, dtype=torch.long),
        z[5:],
        z[:0],
        torch.zeros(0, dtype=torch.long),
        head,
    )
    loss, logs = comp.loss(batch)
    logits = -head(z)
    pred = comp.disc(logits)
    domain = torch.tensor([1] * 5 + [0] * 7)
    want_d = torch.nn.functional.cross_entropy(pred, domain)
    p_u = torch.softmax(logits[5:], 1)
    want_h = -(p_u * torch.log_softmax(logits[5:], 1)).sum(1).mean()
    want = (0.1 * want_d + 0.1 * want_h).detach()
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-6)
    # the gradient reversal: the discriminator descends the domain loss, the head ascends it
    only_d = LogitDiscriminator(3, 0.1, 0.0)
    only_d.disc.load_state_dict(comp.disc.state_dict())
    rev, _ = only_d.loss(batch)  # the same batch
    g_head_rev, g_disc_rev = torch.autograd.grad(rev, [head.weight, only_d.disc[0].weight])
    plain = 0.1 * torch.nn.functional.cross_entropy(only_d.disc(-head(z)), domain)
    g_head, g_disc = torch.autograd.grad(plain, [head.weight, only_d.disc[0].weight])
    torch.testing.assert_close(g_disc_rev, g_disc)
    torch.testing.assert_close(g_head_rev, -g_head)
    tr = _toy_trainer("las_dann", ["active.rounds_at=[1]", "train.epoch_length=min"])
    logs = tr.train_step()
    assert {"dann_domain", "dann_entropy"} <= set(logs)
    assert "domain_source_prob" in tr.aux.pool_scores(np.zeros((4, 2), np.float32), tr.device)
    # DUC's bottleneck: Linear -> BN -> ReLU (model.bottleneck_relu)
    tr = _toy_trainer("duc", ["model.bottleneck_dim=8", "model.bottleneck_relu=true"])
    assert [type(m).__name__ for m in tr.model.bottleneck] == ["Linear", "BatchNorm1d", "ReLU"]
    assert (tr.model.embed(tr.task.target.x[:16]) >= 0).all()
    with pytest.raises(ConfigError, match="bottleneck_relu"):
        from eada.hparams import preset_config

        preset_config("toy", "duc", 0, ["model.bottleneck_relu=true"])
    # the cosine classifier: the head sees normalize(z) / T
    tr = _toy_trainer("las", ["active.rounds_at=[1]", "model.cosine_temperature=0.05"])
    x = tr.task.target.x[:8]
    z_raw = tr.model.bottleneck(tr.model.backbone(x))
    want = tr.model.head(torch.nn.functional.normalize(z_raw, dim=1) / 0.05)
    torch.testing.assert_close(tr.model(x), want)
    # ft_tgt: epochs of labeled-target batches (one step before any label)
    tr = _toy_trainer(
        "las", ["active.rounds_at=[1]", "train.epoch_length=labeled", "train.delta_s=0"]
    )
    assert tr.steps_per_epoch() == 1
    tr.select_round(1, 1, 40)
    assert tr.steps_per_epoch() == tr.labeled_stream.batches_per_pass >= 1


def test_randaugment_views_of_images() -> None:
    """The image domains' 'strong' (CDAC) and 'anchor' (RAA/LAA mixup) views: RandAugment,
    224 x 224 tensors, a new augmentation each read."""
    from PIL import Image

    from eada.data.transforms import TransformSpec, build_transform
    from eada.models.normalization import normalization_for

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (300, 260, 3), dtype=np.uint8))
    norm = normalization_for("resnet50")
    for view in ("strong", "anchor"):
        t = build_transform(view, TransformSpec(), norm)  # type: ignore[arg-type]
        torch.manual_seed(0)
        a, b = t(img), t(img)
        assert a.shape == b.shape == (3, 224, 224) and not torch.equal(a, b)
    names = [
        type(op).__name__ for op in build_transform("anchor", TransformSpec(), norm).transforms
    ]
    assert names[0] == "RandAugment" and "RandomHorizontalFlip" in names
