"""One template run over EVERY registered strategy and training component (new ones are covered
automatically): the checks of :mod:`eada.testing`, which plugin authors run on theirs.

Each strategy gets a pool with everything a strategy may need (energies, embeddings, n_target)
and must return exactly the budget, without duplicates, inside the pool, deterministically for
a fixed generator seed, and raise the documented errors on impossible requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from eada.extend import PoolOutputs, Selection, check_request
from eada.strategies import STRATEGIES
from eada.strategies.components import COMPONENT_CLASSES
from eada.testing import (
    COMPONENT_CHECKS,
    STRATEGY_CHECKS,
    TemplateError,
    check_component,
    check_strategy,
)

NAMES = sorted(STRATEGIES)

# Extra parameters a strategy needs to take the WHOLE pool in one round. EADA's stage 1 keeps
# only alpha1 (default 0.5) of the pool, so budget == pool is possible only with alpha1 = 1.
FULL_POOL_PARAMS: dict[str, dict[str, Any]] = {
    "eada": {"alpha1": 1.0},
    "eada_centered": {"alpha1": 1.0},
}


def test_registry_is_populated() -> None:
    # the built-in strategies must be registered, so the parametrization below is never empty
    assert {"random", "eada", "mvsm", "free_energy", "entropy", "margin"} <= set(NAMES)
    assert {"domain_discriminator", "committee", "evidential"} <= set(COMPONENT_CLASSES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("check", list(STRATEGY_CHECKS))
def test_strategy_template(name: str, check: str) -> None:
    check_strategy(name, full_pool_params=FULL_POOL_PARAMS.get(name), checks=[check])


@pytest.mark.parametrize("name", sorted(COMPONENT_CLASSES))
@pytest.mark.parametrize("check", list(COMPONENT_CHECKS))
def test_component_template(name: str, check: str) -> None:
    check_component(name, checks=[check])


def _margin(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
    check_request(pool, budget)
    p = np.sort(pool.probabilities("margin"), axis=1)
    score = p[:, -2] - p[:, -1]
    return Selection(np.argsort(-score, kind="stable")[:budget], {"margin": -score})


def test_template_passes_a_plain_function_and_refuses_duplicates() -> None:
    check_strategy(_margin)  # an unregistered function passes as it is

    def repeats_the_best(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
        sel = _margin(pool, budget, rng)
        if budget > 1:
            sel.indices[-1] = sel.indices[0]  # one position twice
        return sel

    with pytest.raises(TemplateError, match=r"fails 'exact_budget': returned duplicate"):
        check_strategy(repeats_the_best)


def test_template_names_the_check_that_fails() -> None:
    def no_check(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
        return Selection(np.arange(min(budget, len(pool)), dtype=np.int64))

    with pytest.raises(TemplateError, match=r"fails 'empty_pool': an empty pool must raise"):
        check_strategy(no_check, checks=["empty_pool"])
    with pytest.raises(TemplateError, match=r"fails 'budget_over_the_pool'"):
        check_strategy(no_check, checks=["budget_over_the_pool"])

    def wrong_scores(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
        check_request(pool, budget)
        return Selection(np.arange(budget, dtype=np.int64), {"s": np.zeros(budget)})

    with pytest.raises(TemplateError, match=r"score 's' has shape \(10,\)"):
        check_strategy(wrong_scores, checks=["scores_cover_the_pool"])

    def unseeded(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
        check_request(pool, budget)
        return Selection(np.random.default_rng().permutation(len(pool))[:budget])

    with pytest.raises(TemplateError, match="fails 'seeded'"):
        check_strategy(unseeded, checks=["seeded"])
