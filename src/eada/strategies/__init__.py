"""Query strategies: one registry (:data:`STRATEGIES`), one interface (:class:`Strategy`)."""

from eada.strategies import clue as _clue  # noqa: F401
from eada.strategies import diversity as _diversity  # noqa: F401  (CoreSet, BADGE)
from eada.strategies import domain as _domain  # noqa: F401  (AADA, TQS, DBAL, WAAL)
from eada.strategies import duc as _duc  # noqa: F401  (DUC)
from eada.strategies import eada as _eada  # noqa: F401  (registers EADA and its ablations)
from eada.strategies import lada as _lada  # noqa: F401  (LADA's LAS)
from eada.strategies import uncertainty as _uncertainty  # noqa: F401
from eada.strategies.base import (
    STRATEGIES,
    BudgetTooLargeError,
    EmptyPoolError,
    PoolOutputs,
    Selection,
    SelectionError,
    Strategy,
    StrategySpec,
    all_strategies,
    check_params,
    get_strategy,
    is_strategy,
    reference_random_budget,
    resolve_budget,
    top_k_stable,
)
from eada.strategies.eada import TWO_STEP_STRATEGIES, eada_select, stage_sizes

__all__ = [
    "STRATEGIES",
    "TWO_STEP_STRATEGIES",
    "BudgetTooLargeError",
    "EmptyPoolError",
    "PoolOutputs",
    "Selection",
    "SelectionError",
    "Strategy",
    "StrategySpec",
    "all_strategies",
    "check_params",
    "eada_select",
    "get_strategy",
    "is_strategy",
    "reference_random_budget",
    "resolve_budget",
    "stage_sizes",
    "top_k_stable",
]
