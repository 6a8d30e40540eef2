"""One contract suite run over EVERY registered strategy (new strategies are covered automatically).

Each strategy gets a pool with everything a strategy may need (energies, embeddings, n_target) and
must return exactly the budget, without duplicates, inside the pool, deterministically for a
fixed generator seed, and raise the documented errors on impossible requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from eada.strategies import (
    STRATEGIES,
    BudgetTooLargeError,
    EmptyPoolError,
    PoolOutputs,
    Selection,
    get_strategy,
)

N, C, D, N_TARGET = 200, 5, 16, 400
NAMES = sorted(STRATEGIES)

# Extra parameters a strategy needs to take the WHOLE pool in one round. EADA's stage 1 keeps
# only alpha1 (default 0.5) of the pool, so budget == pool is possible only with alpha1 = 1.
FULL_POOL_PARAMS: dict[str, dict[str, Any]] = {"eada": {"alpha1": 1.0}}


def make_pool(n: int = N, seed: int = 0) -> PoolOutputs:
    rng = np.random.default_rng(seed)
    return PoolOutputs(
        energies=rng.normal(scale=3.0, size=(n, C)),
        embeddings=rng.normal(size=(n, D)),
        n_target=N_TARGET,
        labeled_embeddings=rng.normal(size=(7, D)),
        source_embeddings=rng.normal(size=(40, D)),
        extra={  # the scores training components give (eada.train.aux)
            "domain_source_prob": rng.uniform(0.01, 0.99, size=n),
            "committee_energies": rng.normal(scale=3.0, size=(n, 3, C)),
            "critic_score": rng.normal(size=n),
        },
    )


def run(name: str, pool: PoolOutputs, budget: int, seed: int = 7, **params: Any) -> Selection:
    return get_strategy(name).fn(pool, budget, np.random.default_rng(seed), **params)


def check_indices(sel: Selection, budget: int, n: int) -> None:
    idx = np.asarray(sel.indices)
    assert idx.ndim == 1
    assert np.issubdtype(idx.dtype, np.integer)
    assert len(idx) == budget
    assert len(np.unique(idx)) == len(idx), "duplicate picks"
    assert idx.min() >= 0 and idx.max() < n, "index outside the pool"


def test_registry_is_populated() -> None:
    # the built-in strategies must be registered, so the parametrization below is never empty
    assert {"random", "eada", "mvsm", "free_energy", "entropy", "margin"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("budget", [1, 20, 57])
def test_returns_exactly_the_budget(name: str, budget: int) -> None:
    sel = run(name, make_pool(), budget)
    check_indices(sel, budget, N)


@pytest.mark.parametrize("name", NAMES)
def test_scores_cover_the_whole_pool(name: str) -> None:
    sel = run(name, make_pool(), 10)
    for key, values in sel.scores.items():
        assert np.shape(values) == (N,), f"score {key!r} is not per pool sample"
        assert np.isfinite(values).all()


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_the_same_seed(name: str) -> None:
    a = run(name, make_pool(), 25, seed=7)
    b = run(name, make_pool(), 25, seed=7)
    assert a.indices.tolist() == b.indices.tolist()


@pytest.mark.parametrize("name", NAMES)
def test_input_pool_is_not_modified(name: str) -> None:
    pool = make_pool()
    assert pool.energies is not None and pool.embeddings is not None
    energies, embeddings = pool.energies.copy(), pool.embeddings.copy()
    run(name, pool, 15)
    assert np.array_equal(pool.energies, energies)
    assert np.array_equal(pool.embeddings, embeddings)


@pytest.mark.parametrize("name", NAMES)
def test_empty_pool(name: str) -> None:
    empty = PoolOutputs(energies=np.zeros((0, C)), embeddings=np.zeros((0, D)), n_target=N_TARGET)
    assert len(empty) == 0
    with pytest.raises(EmptyPoolError):
        run(name, empty, 1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("excess", [1, 50])
def test_budget_larger_than_pool(name: str, excess: int) -> None:
    with pytest.raises(BudgetTooLargeError):
        run(name, make_pool(), N + excess, **FULL_POOL_PARAMS.get(name, {}))


@pytest.mark.parametrize("name", NAMES)
def test_budget_equal_to_pool_takes_everything(name: str) -> None:
    sel = run(name, make_pool(), N, **FULL_POOL_PARAMS.get(name, {}))
    check_indices(sel, N, N)
    assert sorted(sel.indices.tolist()) == list(range(N))


@pytest.mark.parametrize("name", NAMES)
def test_small_pool(name: str) -> None:
    pool = make_pool(n=3, seed=1)
    sel = run(name, pool, 1)
    check_indices(sel, 1, 3)
