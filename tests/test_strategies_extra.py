"""The baselines beyond the template suite: each against a brute-force reference or a case whose
answer is known, the memory bound of the clustering strategies, and their training components
inside the trainer."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from eada.data.tasks import load_task
from eada.hparams import preset_config
from eada.strategies import PoolOutputs, diversity, get_strategy
from eada.strategies import clue as clue_mod
from eada.train import ActiveDATrainer
from eada.train.aux import AuxTraining, StepBatch, grad_reverse


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_min_sq_distances_chunked_matches_brute_force(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diversity, "_CHUNK_ELEMENTS", 37)  # force many small blocks
    x, c = _rng().normal(size=(53, 4)), _rng(1).normal(size=(19, 4))
    brute = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1).min(1)
    np.testing.assert_allclose(diversity.min_sq_distances(x, c), brute, rtol=1e-4, atol=1e-4)
    assert np.isinf(diversity.min_sq_distances(x, c[:0])).all()


def test_coreset_is_k_center_greedy() -> None:
    rng = _rng(2)
    z, lab = rng.normal(size=(80, 5)), rng.normal(size=(6, 5))
    sel = get_strategy("coreset").fn(PoolOutputs(embeddings=z, labeled_embeddings=lab), 12, _rng())
    centers, picks = list(lab), []
    for _ in range(12):  # brute force: full distance matrix each step
        d = ((z[:, None, :] - np.asarray(centers)[None]) ** 2).sum(-1).min(1)
        d[picks] = -1
        picks.append(int(d.argmax()))
        centers.append(z[picks[-1]])
    assert sel.indices.tolist() == picks


def test_badge_factorised_equals_explicit_gradient_embeddings() -> None:
    rng = _rng(3)
    n, c, d, budget = 60, 4, 6, 9
    energies, z = rng.normal(scale=2.0, size=(n, c)), rng.normal(size=(n, d))
    sel = get_strategy("badge").fn(PoolOutputs(energies=energies, embeddings=z), budget, _rng(5))
    # explicit N x (C*D) gradient embeddings, same k-means++ draws
    p = np.exp(-energies) / np.exp(-energies).sum(1, keepdims=True)
    a = p.copy()
    a[np.arange(n), p.argmax(1)] -= 1
    g = (a[:, :, None] * z[:, None, :]).reshape(n, -1)
    ref_rng, picks = _rng(5), [int((g**2).sum(1).argmax())]
    dist = np.full(n, np.inf)
    while len(picks) < budget:
        dist = np.minimum(dist, ((g - g[picks[-1]]) ** 2).sum(1))
        w = dist.copy()
        w[picks] = 0
        picks.append(int(ref_rng.choice(n, p=w / w.sum())))
    assert sel.indices.tolist() == picks
    np.testing.assert_allclose(sel.scores["gradient_norm"], np.linalg.norm(g, axis=1), rtol=1e-4)


def test_clue_picks_one_sample_per_cluster() -> None:
    rng = _rng(4)
    centers = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0], [20.0, 20.0]])
    z = np.concatenate([c + rng.normal(scale=0.5, size=(30, 2)) for c in centers])
    energies = rng.normal(size=(120, 3))
    with threadpool_limits(1):  # OpenMP barriers crawl on an oversubscribed machine
        sel = get_strategy("clue").fn(PoolOutputs(energies=energies, embeddings=z), 4, _rng())
    assert sorted(sel.indices // 30) == [0, 1, 2, 3]
    np.testing.assert_allclose(
        sel.scores["entropy"], clue_mod.entropy_from_energies(energies), rtol=1e-12
    )


def test_nearest_unique_resolves_ties_to_distinct_samples() -> None:
    x = np.array([[0.0], [1.0], [5.0]])
    assert clue_mod.nearest_unique(x, np.array([[0.1], [0.1], [0.1]])).tolist() == [0, 1, 2]


def test_aada_score_formula() -> None:
    energies = np.zeros((3, 2))  # entropy log 2 everywhere
    d = np.array([0.5, 0.2, 0.9])
    pool = PoolOutputs(energies=energies, extra={"domain_source_prob": d})
    sel = get_strategy("aada").fn(pool, 1, _rng())
    np.testing.assert_allclose(sel.scores["aada"], (1 - d) / d * np.log(2))
    assert sel.indices.tolist() == [1]  # the most target-like


def test_tqs_prefers_disagreement_uncertainty_and_domainness() -> None:
    e_conf = np.array([0.0, 9.0, 9.0])
    main = np.stack([e_conf, e_conf, e_conf[[1, 0, 2]]])
    committee = np.stack([main, main, main], axis=1)  # (3, 3, 3) all agree with the main head
    committee[2, 0] = e_conf  # sample 2: one member disagrees
    pool = PoolOutputs(
        energies=main,
        extra={"committee_energies": committee, "domain_source_prob": np.array([0.9, 0.1, 0.9])},
    )
    sel = get_strategy("tqs").fn(pool, 3, _rng())
    s = sel.scores
    assert s["committee_disagreement"][0] == 0 and s["committee_disagreement"][2] > 0
    assert s["domainness"][1] == pytest.approx(0.9)
    assert set(sel.indices[:2].tolist()) == {1, 2}


def test_dbal_queries_the_region_the_source_does_not_cover() -> None:
    rng = _rng(6)
    covered = rng.normal(scale=0.3, size=(40, 2))
    uncovered = np.array([10.0, 10.0]) + rng.normal(scale=0.3, size=(40, 2))
    pool = PoolOutputs(
        embeddings=np.concatenate([covered, uncovered]),
        source_embeddings=rng.normal(scale=0.3, size=(50, 2)),
        labeled_embeddings=np.zeros((0, 2)),
    )
    sel = get_strategy("dbal").fn(pool, 2, _rng())
    assert (sel.indices >= 40).all()


def test_waal_takes_uncertain_samples_unlike_the_labeled_data() -> None:
    energies = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 8.0]])
    pool = PoolOutputs(energies=energies, extra={"critic_score": np.array([0.0, 1.0, 1.0])})
    assert get_strategy("waal").fn(pool, 1, _rng()).indices.tolist() == [1]


@pytest.mark.parametrize(
    ("name", "missing"),
    [("aada", "domain_discriminator"), ("tqs", "committee"), ("waal", "wasserstein_critic")],
)
def test_missing_training_scores_name_the_component(name: str, missing: str) -> None:
    pool = PoolOutputs(energies=_rng().normal(size=(10, 3)), embeddings=np.ones((10, 2)))
    with pytest.raises(ValueError, match=missing):
        get_strategy(name).fn(pool, 2, _rng())


@pytest.mark.parametrize("name", ["coreset", "dbal"])
def test_missing_labeled_embeddings_is_a_clear_error(name: str) -> None:
    pool = PoolOutputs(embeddings=np.ones((10, 2)), source_embeddings=np.ones((3, 2)))
    with pytest.raises(ValueError, match="labeled_embeddings"):
        get_strategy(name).fn(pool, 2, _rng())


@pytest.mark.parametrize("name", ["coreset", "badge"])
def test_clustering_never_builds_n_by_n_or_n_by_c_by_d(name: str) -> None:
    n, c, d = 20_000, 10, 64  # N x N float32 = 1.6 GB, N x C x D float32 = 51 MB
    rng = _rng(7)
    pool = PoolOutputs(
        energies=rng.normal(size=(n, c)).astype(np.float32),
        embeddings=rng.normal(size=(n, d)).astype(np.float32),
        labeled_embeddings=rng.normal(size=(50, d)).astype(np.float32),
    )
    tracemalloc.start()
    get_strategy(name).fn(pool, 20, _rng())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 30e6, f"{name} peaked at {peak / 1e6:.1f} MB"


def test_grad_reverse_flips_and_scales_the_gradient() -> None:
    x = torch.ones(3, requires_grad=True)
    (2 * grad_reverse(x, 0.25)).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [-0.5, -0.5, -0.5]


def test_waal_critic_scores_are_bounded_and_its_pull_on_the_features_is_small() -> None:
    torch.manual_seed(0)
    aux = AuxTraining(("wasserstein_critic",), 4, 3, {}, batch_size=8, seed=0)
    critic = aux.components[0]
    z = torch.randn(64, 4) * 100  # far outside the training range: still in [0, 1]
    s = critic.pool_scores(z)["critic_score"]
    assert s.min() >= 0.0 and s.max() <= 1.0
    assert critic.weight == pytest.approx(2e-3)  # WAAL's alpha, the authors' default
    feats = torch.randn(16, 4, requires_grad=True)
    head = torch.nn.Linear(4, 3)
    batch = StepBatch(
        feats[:8],
        torch.zeros(8, dtype=torch.long),
        feats[8:],
        feats[:0],
        torch.zeros(0, dtype=torch.long),
        head,
    )
    loss, _ = critic.loss(batch)
    loss.backward()
    critic_grad = sum(float(p.grad.abs().sum()) for p in critic.parameters())
    assert feats.grad is not None and 0 < float(feats.grad.abs().sum()) < 0.01 * critic_grad


@pytest.mark.parametrize(
    ("strategy", "logged", "extras"),
    [
        ("tqs", {"loss_committee", "loss_domain"}, {"committee_energies", "domain_source_prob"}),
        ("waal", {"wasserstein"}, {"critic_score"}),
        ("dbal", set(), set()),
    ],
)
def test_training_components_run_inside_the_trainer(
    strategy: str, logged: set[str], extras: set[str]
) -> None:
    cfg = preset_config(
        "toy",
        None,
        0,
        [
            "train.epochs=3",
            "active.rounds_at=[1,2]",
            f"active.strategy={strategy}",
            "data.n_per_class=60",
        ],
    )
    tr = ActiveDATrainer(cfg, load_task(cfg.data, 0))
    res = tr.run()
    picked = [i for r in res.rounds[1:] for i in r["selected"]]
    assert len(picked) == len(set(picked)) == 2 * 3  # 2% of 120 a round, no repeats
    assert logged <= set(res.history[-1])
    assert tr.last_proposal is not None
    out = tr.last_proposal.outputs
    assert extras <= set(out.extra)
    if strategy == "dbal":
        assert out.source_embeddings is not None and len(out.source_embeddings) == 120
        assert out.labeled_embeddings is not None and len(out.labeled_embeddings) == 3
    if tr.aux is not None:  # checkpoints carry the components
        state = tr.state_dict()
        other = AuxTraining(tuple(tr.aux.names), 2, 2, {}, 32, 99)
        other.load_state_dict(state["aux"])
        for a, b in zip(
            other.components.state_dict().values(),
            tr.aux.components.state_dict().values(),
            strict=True,
        ):
            assert torch.equal(a, b)


def _authors_clue(z: np.ndarray, energies: np.ndarray, k: int, seed: int) -> list[int]:
    """CLUE's selection as the authors' code does it (sample.py, CLUESampling.query, read and
    restated): entropy of softmax(logits / T) with 1e-8 added to the probabilities, scikit-learn
    ``KMeans(n)`` (0.22: ``n_init=10``) weighted by it, then each centroid's nearest sample, the
    next nearest ones where two centroids share a sample."""
    from sklearn.cluster import KMeans

    p = np.exp(-energies - np.log(np.exp(-energies).sum(1, keepdims=True))) + 1e-8
    w = -(p * np.log(p)).sum(1)
    km = KMeans(k, n_init=10, random_state=seed).fit(z, sample_weight=w)
    d = ((km.cluster_centers_[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    order = d.argsort(axis=1)
    picked: set[int] = set()
    col = 0
    while len(picked) < k:
        picked |= set(order[:, col][: k - len(picked)].tolist())
        col += 1
    return sorted(picked)


def test_clue_picks_match_the_authors_and_do_not_depend_on_the_kmeans_seed() -> None:
    """A weakly clustered pool (SURF-like: 10 classes, 150 samples, K = 2) where one k-means++
    initialisation lands in different local optima for different seeds: with ``n_init = 1``
    (our CLUE before) the picks of seeds 0-7 were two different pairs; with the authors'
    ``n_init = 10`` every seed picks what their code picks."""
    g = _rng(0)
    z = g.normal(size=(150, 16)) + np.repeat(g.normal(size=(10, 16)), 15, axis=0)
    z = z.astype(np.float32)
    energies = g.normal(scale=2.0, size=(150, 10))
    pool = PoolOutputs(energies=energies, embeddings=z)
    clue = get_strategy("clue").fn
    with threadpool_limits(1):
        picks = {tuple(sorted(clue(pool, 2, _rng(s)).indices.tolist())) for s in range(8)}
        reference = _authors_clue(z, energies, 2, seed=0)
        one_init = {
            tuple(sorted(clue(pool, 2, _rng(s), n_init=1).indices.tolist())) for s in range(8)
        }
    assert picks == {tuple(reference)}
    assert len(one_init) > 1  # the state does separate the two settings


def test_clue_rejects_a_bad_n_init() -> None:
    pool = PoolOutputs(energies=np.zeros((4, 2)), embeddings=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="n_init"):
        get_strategy("clue").fn(pool, 2, _rng(), n_init=0)
