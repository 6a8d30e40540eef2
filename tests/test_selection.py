"""Selection arithmetic and EADA's two-step rule, checked against brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from eada.energy import free_energy, mvsm
from eada.strategies import (
    BudgetTooLargeError,
    EmptyPoolError,
    PoolOutputs,
    eada_select,
    get_strategy,
    resolve_budget,
    stage_sizes,
    top_k_stable,
)

RNG = np.random.default_rng(0)

# scores with many ties (a handful of values, signed zeros included) or arbitrary finite floats
TIED = st.sampled_from([-2.0, -1.0, -0.0, 0.0, 0.5, 3.0])
ANY = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def _scores(n: st.SearchStrategy[int]) -> st.SearchStrategy[np.ndarray]:
    return n.flatmap(
        lambda size: st.one_of(
            arrays(np.float64, (size,), elements=TIED), arrays(np.float64, (size,), elements=ANY)
        )
    )


def _reference_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.arange(len(scores)), -scores))  # by -score, then by index
    return order[: max(k, 0)]


# -- top_k_stable ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(_scores(st.integers(0, 60)), st.data())
def test_top_k_stable_matches_brute_force(scores: np.ndarray, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(scores) + 3))
    got = top_k_stable(scores, k)
    assert got.dtype == np.int64
    assert got.tolist() == _reference_top_k(scores, k).tolist()


def test_top_k_stable_edges() -> None:
    s = np.array([1.0, 5.0, 5.0, -1.0, 5.0])
    assert top_k_stable(s, 0).tolist() == []
    assert top_k_stable(s, -2).tolist() == []
    assert top_k_stable(s, 2).tolist() == [1, 2]
    assert top_k_stable(s, 3).tolist() == [1, 2, 4]
    assert top_k_stable(s, 5).tolist() == [1, 2, 4, 0, 3]
    assert top_k_stable(s, 9).tolist() == [1, 2, 4, 0, 3]
    assert top_k_stable(np.zeros(4), 2).tolist() == [0, 1]
    assert top_k_stable(np.array([]), 3).tolist() == []


# -- resolve_budget -------------------------------------------------------------------------------


def test_resolve_budget_counts_and_shares() -> None:
    assert resolve_budget(29, 2817) == 29
    assert resolve_budget(np.int64(7), 100) == 7
    assert resolve_budget(0.01, 2817) == 29  # ceil(28.17)
    assert resolve_budget(0.01, 100) == 1  # exactly 1, not rounded up to 2
    assert resolve_budget(0.07, 100) == 7  # 0.07 * 100 == 7.000000000000001 in floats
    assert resolve_budget(0.05, 2817) == 141  # ceil(140.85)
    assert resolve_budget(1.0, 2817) == 2817
    assert resolve_budget(1e-6, 10) == 1  # a share never rounds to zero
    assert isinstance(resolve_budget(0.01, 2817), int)


@pytest.mark.parametrize("bad", [0, -3, 0.0, -0.1, 1.5, float("nan")])
def test_resolve_budget_rejects_bad_values(bad: float) -> None:
    with pytest.raises(ValueError):
        resolve_budget(bad, 100)


@pytest.mark.parametrize("bad", [True, False])
def test_resolve_budget_rejects_bool(bad: bool) -> None:
    with pytest.raises(TypeError):
        resolve_budget(bad, 100)


# -- stage sizes ----------------------------------------------------------------------------------


def test_stage_sizes_paper_rule() -> None:
    assert stage_sizes(100, 10, 0.5) == (50, 10)
    assert stage_sizes(101, 10, 0.5) == (51, 10)  # ceil
    assert stage_sizes(100, 7, 0.07) == (7, 7)  # 0.07 * 100 == 7.000000000000001 in floats
    assert stage_sizes(100, 50, 0.5) == (50, 50)  # budget == stage 1
    assert stage_sizes(7, 7, 1.0) == (7, 7)  # budget == pool with alpha1 = 1


def test_stage_sizes_reference_rule_office31_amazon() -> None:
    n_target, share, per_round = 2817, 0.01, 29
    pool = n_target
    for _ in range(5):
        assert stage_sizes(pool, per_round, 0.5, "reference", n_target, share) == (1409, 29)
        pool -= per_round
    assert pool == 2817 - 5 * 29
    # the first shrunk pool explicitly
    assert stage_sizes(2817 - 29, 29, 0.5, "reference", 2817, 0.01) == (1409, 29)


def test_stage_sizes_reference_rule_caps_at_pool() -> None:
    # alpha1 * n_target = 1408.5 > pool = 1000: stage 1 keeps the whole pool; n2 comes from the
    # uncapped n1 = 1409 (the authors' code): ceil(1409 * 0.02) = 29
    assert stage_sizes(1000, 29, 0.5, "reference", 2817, 0.01) == (1000, 29)
    assert stage_sizes(40, 1, 0.5, "reference", 2817, 0.01) == (40, 29)
    with pytest.raises(BudgetTooLargeError):  # 29 from a pool of 10
        stage_sizes(10, 1, 0.5, "reference", 2817, 0.01)


def test_stage_sizes_reference_rule_needs_n_target() -> None:
    with pytest.raises(ValueError, match="n_target"):
        stage_sizes(100, 5, 0.5, "reference", None, 0.01)
    with pytest.raises(ValueError, match="n_target"):
        stage_sizes(100, 5, 0.5, "reference", 50, 0.01)  # smaller than the pool


@pytest.mark.parametrize("alpha1", [0.0, -0.5, 1.01, 2.0, float("nan")])
def test_stage_sizes_alpha1_out_of_range(alpha1: float) -> None:
    with pytest.raises(ValueError, match="alpha1"):
        stage_sizes(100, 5, alpha1)


def test_stage_sizes_alpha1_too_small() -> None:
    with pytest.raises(BudgetTooLargeError):
        stage_sizes(100, 51, 0.5)
    with pytest.raises(BudgetTooLargeError):
        stage_sizes(100, 2, 0.01)  # stage 1 keeps 1 sample
    # reference rule: n2 = ceil(1409 * 0.6 / 0.5) > 1409
    with pytest.raises(BudgetTooLargeError):
        stage_sizes(2817, 29, 0.5, "reference", 2817, 0.6)


def test_stage_sizes_bad_rule() -> None:
    with pytest.raises(ValueError, match="rule"):
        stage_sizes(100, 5, 0.5, "other")  # type: ignore[arg-type]


# -- EADA selection -------------------------------------------------------------------------------


def _brute_force_eada(f: np.ndarray, u: np.ndarray, n1: int, b: int) -> list[int]:
    stage1 = sorted(range(len(f)), key=lambda i: (-float(f[i]), i))[:n1]
    stage2 = sorted(range(n1), key=lambda r: (-float(u[stage1[r]]), r))[:b]
    return [stage1[r] for r in stage2]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40).flatmap(lambda n: st.tuples(_scores(st.just(n)), _scores(st.just(n)))),
    st.integers(1, 20),
    st.data(),
)
def test_eada_matches_brute_force(
    fu: tuple[np.ndarray, np.ndarray], twentieths: int, data: st.DataObject
) -> None:
    f, u = fu
    u = -np.abs(u)  # MvSM values are <= 0
    n = len(f)
    alpha1 = twentieths / 20  # exact decimal, so the expected ceil is integer arithmetic
    n1 = -(-twentieths * n // 20)
    b = data.draw(st.integers(1, n1))
    sel = eada_select(PoolOutputs(free_energy=f, mvsm=u), b, None, alpha1=alpha1)
    assert sel.indices.tolist() == _brute_force_eada(f, u, n1, b)
    assert sel.indices.dtype == np.int64
    assert sel.info["n_stage1"] == n1 and sel.info["n_stage2"] == b
    assert np.array_equal(sel.scores["free_energy"], f)
    assert np.array_equal(sel.scores["mvsm"], u)


def test_eada_docstring_example() -> None:
    pool = PoolOutputs(
        free_energy=np.array([5.0, 1.0, 4.0, 3.0]), mvsm=np.array([-0.1, -0.0, -2.0, -0.5])
    )
    sel = eada_select(pool, 1, np.random.default_rng(0), alpha1=0.5)
    # stage 1 keeps {0, 2}; sample 1 has the best U overall but a low F
    assert sel.indices.tolist() == [0]
    assert sel.info["free_energy_threshold"] == 4.0


def test_eada_scores_from_energies_cover_whole_pool() -> None:
    e = RNG.normal(size=(50, 4)) * 3
    sel = eada_select(PoolOutputs(energies=e), 5, None, alpha1=0.5)
    et = torch.from_numpy(e)
    assert sel.scores["free_energy"].shape == (50,)
    assert np.allclose(sel.scores["free_energy"], free_energy(et).numpy())
    assert np.allclose(sel.scores["mvsm"], mvsm(et).numpy())
    f, u = sel.scores["free_energy"], sel.scores["mvsm"]
    assert sel.indices.tolist() == _brute_force_eada(f, u, 25, 5)
    # the picked samples are in the top half by F
    assert (f[sel.indices] >= np.sort(f)[-25]).all()


def test_eada_reference_rule_counts() -> None:
    n_target = 2817
    f, u = RNG.normal(size=n_target), -np.abs(RNG.normal(size=n_target))
    pool = PoolOutputs(free_energy=f, mvsm=u, n_target=n_target)
    sel = eada_select(pool, 29, None, alpha1=0.5, rule="reference", budget_share=0.01)
    assert len(sel.indices) == 29 and sel.info["n_stage1"] == 1409
    assert sel.indices.tolist() == _brute_force_eada(f, u, 1409, 29)

    keep = np.setdiff1d(np.arange(n_target), sel.indices)  # the pool after round 1
    shrunk = PoolOutputs(free_energy=f[keep], mvsm=u[keep], n_target=n_target)
    sel2 = eada_select(shrunk, 29, None, alpha1=0.5, rule="reference", budget_share=0.01)
    assert len(sel2.indices) == 29 and sel2.info["n_stage1"] == 1409
    assert sel2.indices.max() < len(keep)


def test_eada_reference_rule_without_n_target() -> None:
    pool = PoolOutputs(free_energy=RNG.normal(size=20), mvsm=-np.abs(RNG.normal(size=20)))
    with pytest.raises(ValueError, match="n_target"):
        eada_select(pool, 2, None, rule="reference", budget_share=0.05)


def test_eada_alpha1_one_equals_mvsm_strategy() -> None:
    e = RNG.normal(size=(120, 6))
    pool = PoolOutputs(energies=e)
    u = pool.get_mvsm()
    assert len(np.unique(u)) == len(u)  # no ties in U (with ties the tie-breaks differ by design)
    for b in (1, 17, 120):
        a = eada_select(pool, b, None, alpha1=1.0)
        m = get_strategy("mvsm").fn(pool, b, np.random.default_rng(0))
        assert a.indices.tolist() == m.indices.tolist()


def test_eada_budget_equal_to_pool_selects_everything() -> None:
    pool = PoolOutputs(free_energy=RNG.normal(size=13), mvsm=-np.abs(RNG.normal(size=13)))
    sel = eada_select(pool, 13, None, alpha1=1.0)
    assert sorted(sel.indices.tolist()) == list(range(13))
    ref = PoolOutputs(free_energy=pool.free_energy, mvsm=pool.mvsm, n_target=13)
    sel_r = eada_select(ref, 13, None, alpha1=1.0, rule="reference", budget_share=1.0)
    assert sorted(sel_r.indices.tolist()) == list(range(13))
    with pytest.raises(BudgetTooLargeError):  # stage 1 keeps only 7
        eada_select(pool, 13, None, alpha1=0.5)
    # a budget beyond the pool is named as such, not as an alpha1 to raise (it is already 1)
    # (the round plan asks stage_sizes directly: pool 0 after earlier rounds, alpha1 = 1)
    for n_pool, budget in ((13, 14), (0, 5)):
        with pytest.raises(BudgetTooLargeError, match=f"budget {budget} is larger than the unl"):
            stage_sizes(n_pool, budget, 1.0)


def test_eada_alpha1_errors() -> None:
    pool = PoolOutputs(free_energy=RNG.normal(size=10), mvsm=-np.abs(RNG.normal(size=10)))
    with pytest.raises(BudgetTooLargeError):
        eada_select(pool, 6, None, alpha1=0.5)
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="alpha1"):
            eada_select(pool, 1, None, alpha1=bad)


SCORE_BASED = ["eada", "mvsm", "free_energy", "entropy", "margin", "least_confidence"]


@pytest.mark.parametrize("name", SCORE_BASED)
def test_all_equal_scores_pick_first_positions(name: str) -> None:
    pool = PoolOutputs(energies=np.ones((12, 3)))
    sel = get_strategy(name).fn(pool, 4, np.random.default_rng(0))
    assert sel.indices.tolist() == [0, 1, 2, 3]


def test_eada_is_independent_of_rng() -> None:
    pool = PoolOutputs(energies=RNG.normal(size=(40, 3)))
    a = eada_select(pool, 5, np.random.default_rng(1))
    b = eada_select(pool, 5, np.random.default_rng(2))
    c = eada_select(pool, 5, None)
    assert a.indices.tolist() == b.indices.tolist() == c.indices.tolist()


# -- request errors -------------------------------------------------------------------------------


def test_eada_empty_pool() -> None:
    for pool in (
        PoolOutputs(energies=np.zeros((0, 3))),
        PoolOutputs(free_energy=np.zeros(0), mvsm=np.zeros(0)),
        PoolOutputs(),
    ):
        with pytest.raises(EmptyPoolError):
            eada_select(pool, 1, None)


def test_eada_budget_larger_than_pool() -> None:
    pool = PoolOutputs(free_energy=np.arange(5.0), mvsm=-np.arange(5.0))
    with pytest.raises(BudgetTooLargeError):
        eada_select(pool, 6, None, alpha1=1.0)


@pytest.mark.parametrize("bad", [0, -1])
def test_eada_nonpositive_budget(bad: int) -> None:
    pool = PoolOutputs(free_energy=np.arange(5.0), mvsm=-np.arange(5.0))
    with pytest.raises(ValueError, match="at least 1"):
        eada_select(pool, bad, None)


@pytest.mark.parametrize("bad", [2.0, 0.5, True])
def test_eada_non_integer_budget(bad: object) -> None:
    pool = PoolOutputs(free_energy=np.arange(5.0), mvsm=-np.arange(5.0))
    with pytest.raises(TypeError):
        eada_select(pool, bad, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["energies", "free_energy", "mvsm", "embeddings"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_pool_outputs_reject_non_finite(field: str, bad: float) -> None:
    arrays_ = {
        "energies": np.zeros((4, 3)),
        "free_energy": np.zeros(4),
        "mvsm": np.zeros(4),
        "embeddings": np.zeros((4, 2)),
    }
    arrays_[field].flat[1] = bad
    with pytest.raises(ValueError, match="NaN"):
        PoolOutputs(**arrays_)  # type: ignore[arg-type]


def test_pool_outputs_reject_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="number of samples"):
        PoolOutputs(free_energy=np.zeros(5), mvsm=np.zeros(4))
    with pytest.raises(ValueError, match="number of samples"):
        PoolOutputs(energies=np.zeros((5, 3)), embeddings=np.zeros((6, 2)))


def test_pool_outputs_reject_bad_energy_shape() -> None:
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        PoolOutputs(energies=np.zeros(5))


def test_pool_outputs_accepts_tensors_and_ints() -> None:
    pool = PoolOutputs(energies=torch.tensor([[0.0, 1.0], [2.0, 0.5]]), mvsm=np.array([-1, 0]))
    assert isinstance(pool.energies, np.ndarray)
    assert pool.mvsm is not None and pool.mvsm.dtype == np.float64
    assert len(pool) == 2
    assert pool.get_free_energy()[0] == pytest.approx(-math.log(1 + math.exp(-1)), rel=1e-6)


def test_centered_first_step_ignores_the_common_mode_and_is_the_margin_with_two_classes() -> None:
    rng = np.random.default_rng(3)
    e = rng.normal(size=(200, 2))
    shift = rng.normal(scale=5.0, size=(200, 1))  # a per-sample common mode, as an init gives
    centered = get_strategy("eada_centered").fn
    base = centered(PoolOutputs(energies=e), 10, alpha1=0.5).indices
    moved = centered(PoolOutputs(energies=e + shift), 10, alpha1=0.5).indices
    assert base.tolist() == moved.tolist()  # G = F - mean_y E does not see the shift
    # ... where the plain first step does (F moves with the common mode)
    plain = eada_select(PoolOutputs(energies=e + shift), 10, alpha1=0.5).indices
    assert plain.tolist() != base.tolist()
    # two classes: G and MvSM both rank by |E0 - E1|, so the picks are the 10 closest to the
    # boundary (BvSB's margin)
    margin = np.argsort(np.abs(e[:, 0] - e[:, 1]), kind="stable")[:10]
    assert sorted(base.tolist()) == sorted(margin.tolist())
    sel = centered(PoolOutputs(energies=e), 10, alpha1=0.5)
    assert sel.info["n_stage1"] == 100 and "centered_free_energy" in sel.scores
    with pytest.raises(ValueError, match="'eada_centered' needs the pool's energies"):
        centered(PoolOutputs(free_energy=e[:, 0], mvsm=e[:, 1]), 10)


def test_the_trainer_gives_the_centred_step_alpha1_and_plans_its_stages() -> None:
    from eada.data.tasks import load_task
    from eada.hparams import preset_config
    from eada.train.loop import ActiveDATrainer

    cfg = preset_config("toy-calibrated", "eada_centered", 0, ["active.alpha1=0.25"])
    trainer = ActiveDATrainer(cfg, load_task(cfg.data, 0))
    plan = trainer.make_plan()
    assert [p["stage1"] for p in plan] == [250, 245, 240]  # ceil(0.25 x the pool)
    proposal = trainer.propose(budget=plan[0]["budget"])
    info = proposal.selection.info
    assert info["alpha1"] == 0.25 and info["n_stage1"] == 250
