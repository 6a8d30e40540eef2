"""DUC (ICLR 2023) and LADA (ICCV 2023) against their authors' code, on the same fixed outputs.

Each ``_authors_*`` function below is a small independent transcription, in our own words, of
what the authors' code does (BIT-DA/DUC ``core/active/active.py``, ``core/active/loss.py``,
``main.py``; tsun/LADA ``active/LASsampler.py``): a plain loop over the pool, full matrices,
Python sorts. Our strategies must pick the same samples and our loss must give the same value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans

from eada.strategies import PoolOutputs, get_strategy
from eada.strategies import lada as lada_mod
from eada.strategies.components import Evidential, StepBatch, evidential_loss
from eada.strategies.duc import duc_scores

# ---------------------------------------------------------------- DUC


def _authors_duc(logits: torch.Tensor, active_ratio: float, kappa: float) -> list[int]:
    """DUC_active: per-sample (index, U_dis, U_data) rows, sort by U_dis (descending, stable),
    keep ceil(N * ratio * kappa), sort those by U_data, take ceil(N * ratio)."""
    rows = []
    for i in range(len(logits)):
        alpha = torch.exp(logits[i : i + 1])
        total = torch.sum(alpha, dim=1, keepdim=True)
        p = alpha / total
        point_entropy = -torch.sum(p * torch.log(p + 1e-7), dim=1)
        data = torch.sum(p * (torch.digamma(total + 1) - torch.digamma(alpha + 1)), dim=1)
        rows.append([i, (point_entropy - data).item(), data.item()])
    n = len(logits)
    first = sorted(rows, key=lambda r: r[1], reverse=True)[: math.ceil(n * active_ratio * kappa)]
    second = sorted(first, key=lambda r: r[2], reverse=True)
    return [int(r[0]) for r in second[: math.ceil(n * active_ratio)]]


@pytest.mark.parametrize("kappa", [2, 10])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_duc_picks_equal_the_authors(kappa: int, scale: float) -> None:
    rng = np.random.default_rng(int(kappa * 10 + scale))
    energies = rng.normal(scale=scale, size=(700, 12)) - 2.0  # evidence above and below 1
    budget = math.ceil(700 * 0.01)
    ours = get_strategy("duc").fn(PoolOutputs(energies=energies), budget, None, kappa=kappa)
    theirs = _authors_duc(-torch.from_numpy(energies), 0.01, kappa)
    assert ours.indices.tolist() == theirs
    # the two stages matter: the plain top data uncertainty picks other samples
    u_dis, u_data = duc_scores(energies)
    assert set(np.argsort(-u_data)[:budget].tolist()) != set(theirs)
    np.testing.assert_allclose(ours.scores["distributional_uncertainty"], u_dis)


def test_duc_rejects_overflowing_evidence_and_small_kappa() -> None:
    pool = PoolOutputs(energies=np.array([[-800.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="overflows"):
        get_strategy("duc").fn(pool, 1, None)
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
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    # and the same gradient on the head
    g_ours = torch.autograd.grad(ours, head.weight)[0]
    theirs = _authors_step_loss(-head(zs), ys, -head(zu), -head(zl), yl, 1.0, 0.05)
    g_theirs = torch.autograd.grad(theirs, head.weight)[0]
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-6)
    nll, kl = (t.detach() for t in evidential_loss(-head(zs), ys))
    assert logs["duc_nll"] == pytest.approx(float(nll)) and float(kl) > 0
    # beta = 0 drops the unlabeled terms, as their `if cfg.TRAINER.BETA > 0`
    no_u, logs0 = Evidential(beta=0.0, lam=0.05).loss(batch)
    assert "duc_u_dis" not in logs0 and float(no_u) < float(ours)


# ---------------------------------------------------------------- LAS


def _authors_las(
    probs: torch.Tensor, embs: torch.Tensor, n: int, k: int, m: int, seed: int
) -> tuple[torch.Tensor, set[int]]:
    """LASSampling.query on fixed outputs: full N x N similarity, topk, one propagation,
    KMeans on the n(1+M) top candidates, their column loop over sorted distances."""
    embs = torch.nn.functional.normalize(embs, dim=-1)
    sim = embs.mm(embs.transpose(1, 0))
    sim_topk, topk = torch.topk(sim, k=k + 1, dim=1)
    sim_topk, topk = sim_topk[:, 1:], topk[:, 1:]
    wgt = sim_topk / sim_topk.sum(dim=1, keepdim=True)
    q = -((probs[topk] * probs.unsqueeze(1)).sum(-1) * wgt).sum(-1)
    q = q + (wgt * q[topk]).sum(-1) * 1.0
    m_idxs = q.sort(descending=True)[1]
    m_top = m_idxs[: n * (1 + m)]
    km = KMeans(n_clusters=n, random_state=seed)
    km.fit(embs[m_top].numpy())
    centres = km.cluster_centers_
    x = embs[m_top].numpy()
    dists = np.sqrt(((centres[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    sort_idxs = dists.argsort(axis=1)
    picked: list[int] = []
    ax, rem = 0, n
    while rem > 0:
        picked = list(set(picked) | set(sort_idxs[:, ax][:rem].tolist()))
        rem = n - len(picked)
        ax += 1
    return q, set(m_idxs[picked].tolist())


@pytest.mark.parametrize(("n", "budget", "k", "m"), [(400, 8, 10, 10), (300, 20, 5, 5)])
def test_las_picks_equal_the_authors(n: int, budget: int, k: int, m: int) -> None:
    rng = np.random.default_rng(n + budget)
    energies = rng.normal(scale=2.0, size=(n, 6))
    z = np.abs(rng.normal(size=(n, 16))).astype(np.float32)  # ReLU features, as theirs
    sel = get_strategy("las").fn(
        PoolOutputs(energies=energies, embeddings=z),
        budget,
        np.random.default_rng(11),
        neighbours=k,
        oversample=m,
    )
    seed = int(np.random.default_rng(11).integers(2**31 - 1))
    probs = torch.softmax(-torch.from_numpy(energies).float(), dim=1)
    q, theirs = _authors_las(probs, torch.from_numpy(z), budget, k, m, seed)
    np.testing.assert_allclose(sel.scores["local_inconsistency"], q.numpy(), rtol=1e-5, atol=1e-6)
    assert set(sel.indices.tolist()) == theirs
    assert len(sel.indices) == budget


def test_las_blocked_neighbours_equal_the_full_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lada_mod, "_BLOCK_ELEMENTS", 50)  # many blocks of one or two rows
    z = np.random.default_rng(0).normal(size=(37, 5))
    sims, idx = lada_mod.cosine_neighbours(z, 4)
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    full = zn @ zn.T
    ref = np.argsort(-full, axis=1)[:, 1:5]
    assert idx.tolist() == ref.tolist()
    np.testing.assert_allclose(sims.numpy(), np.take_along_axis(full, ref, 1), rtol=1e-5)


def test_las_centroid_picks_take_next_nearest_when_shared() -> None:
    # both centres are nearest to row 0; the second centre takes its next nearest (row 2)
    x = np.array([[0.0], [5.0], [0.4], [10.0]])
    centres = np.array([[0.1], [0.3]])
    assert lada_mod.centroid_picks(centres, x).tolist() == [0, 2]
