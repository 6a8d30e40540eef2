"""Template tests for plugin authors: the checks every built-in strategy and training
component passes, callable on yours.

:func:`check_strategy` runs the strategy template (:data:`STRATEGY_CHECKS`): exactly the
budget, no duplicates, positions inside the pool, the same picks under the same seed, the
input pool left unmodified, scores for the whole pool, :class:`~eada.strategies.EmptyPoolError`
on an empty pool and :class:`~eada.strategies.BudgetTooLargeError` on a budget over the pool,
the whole pool when the budget is the pool. eada's own test suite runs the same checks over
every registered strategy, so there is one template.

:func:`check_component` runs the training-component template (:data:`COMPONENT_CHECKS`): it
builds from its declared settings, gives a finite scalar loss that back-propagates, the same
loss under the same seed, and pool scores with one row a pool sample.

Each check raises :class:`TemplateError` (an ``AssertionError``) naming the check and what
went wrong, so it reads as a failed test under pytest::

    from eada.testing import check_strategy
    from my_plugin import my_margin

    def test_my_margin_passes_the_template():
        check_strategy(my_margin)

Example:
    >>> import numpy as np
    >>> from eada.strategies import Selection
    >>> def takes_the_first_twice(pool, budget, rng):
    ...     return Selection(np.zeros(budget, dtype=np.int64))
    >>> try:
    ...     check_strategy(takes_the_first_twice)
    ... except TemplateError as err:
    ...     print(str(err).split(":")[0])
    strategy takes_the_first_twice fails 'exact_budget'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from eada.strategies import (
    BudgetTooLargeError,
    EmptyPoolError,
    PoolOutputs,
    Selection,
    StrategySpec,
    get_strategy,
)

N, C, D, N_TARGET = 200, 5, 16, 400
"""The template pool: ``N`` samples, ``C`` classes, ``D`` embedding features, a target set of
``N_TARGET`` samples."""


class TemplateError(AssertionError):
    """A strategy or component that fails a template check (the message names the check)."""


PoolMaker = Callable[[int, int], PoolOutputs]


def make_pool(n: int = N, seed: int = 0) -> PoolOutputs:
    """The template pool: every output a strategy may need (energies, embeddings, labeled
    and source embeddings, ``n_target``) and the built-in components' pool scores
    (``domain_source_prob``, ``committee_energies``, ``critic_score``).

    >>> len(make_pool(10))
    10
    """
    rng = np.random.default_rng(seed)
    return PoolOutputs(
        energies=rng.normal(scale=3.0, size=(n, C)),
        embeddings=rng.normal(size=(n, D)),
        n_target=N_TARGET,
        labeled_embeddings=rng.normal(size=(7, D)),
        source_embeddings=rng.normal(size=(40, D)),
        extra={
            "domain_source_prob": rng.uniform(0.01, 0.99, size=n),
            "committee_energies": rng.normal(scale=3.0, size=(n, 3, C)),
            "critic_score": rng.normal(size=n),
        },
    )


def _call(
    fn: Callable[..., Selection],
    pool: PoolOutputs,
    budget: int,
    seed: int = 7,
    params: dict[str, Any] | None = None,
) -> Selection:
    return fn(pool, budget, np.random.default_rng(seed), **(params or {}))


def _indices(sel: Any, budget: int, n: int) -> np.ndarray:
    if not isinstance(sel, Selection):
        raise TemplateError(f"returned {type(sel).__name__}, not a Selection")
    idx = np.asarray(sel.indices)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise TemplateError(f"indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if len(idx) != budget:
        raise TemplateError(f"asked for {budget} samples, returned {len(idx)}")
    values, counts = np.unique(idx, return_counts=True)
    if len(values) != len(idx):
        dup = int(values[counts > 1][0])
        raise TemplateError(f"returned duplicate positions (position {dup} more than once)")
    if len(idx) and (idx.min() < 0 or idx.max() >= n):
        raise TemplateError(f"returned a position outside the pool of {n} (0..{n - 1})")
    return idx


def _exact_budget(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    for budget in (1, 20, 57):
        _indices(_call(fn, ctx["pool"](N, 0), budget, params=ctx["params"]), budget, N)


def _scores_cover_the_pool(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    sel = _call(fn, ctx["pool"](N, 0), 10, params=ctx["params"])
    for key, values in sel.scores.items():
        if np.shape(values) != (N,):
            raise TemplateError(
                f"score {key!r} has shape {np.shape(values)}, not one value a pool sample ({N},)"
            )
        if not np.isfinite(values).all():
            raise TemplateError(f"score {key!r} holds NaN or infinite values")


def _seeded(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    a = _call(fn, ctx["pool"](N, 0), 25, seed=7, params=ctx["params"])
    b = _call(fn, ctx["pool"](N, 0), 25, seed=7, params=ctx["params"])
    if np.asarray(a.indices).tolist() != np.asarray(b.indices).tolist():
        raise TemplateError("two calls with the same pool and generator seed picked differently")


def _pool_unmodified(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    pool = ctx["pool"](N, 0)
    before = {k: v.copy() for k, v in pool._arrays().items()}
    _call(fn, pool, 15, params=ctx["params"])
    for key, value in before.items():
        if not np.array_equal(getattr(pool, key), value):
            raise TemplateError(f"changed the input pool's {key}")


def _empty_pool(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    empty = PoolOutputs(energies=np.zeros((0, C)), embeddings=np.zeros((0, D)), n_target=N_TARGET)
    try:
        _call(fn, empty, 1, params=ctx["params"])
    except EmptyPoolError:
        return
    except Exception as err:
        raise TemplateError(
            f"an empty pool must raise EmptyPoolError (check_request does), got "
            f"{type(err).__name__}: {err}"
        ) from err
    raise TemplateError("an empty pool must raise EmptyPoolError (check_request does)")


def _budget_over_the_pool(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    for excess in (1, 50):
        try:
            _call(fn, ctx["pool"](N, 0), N + excess, params=ctx["full_pool_params"])
        except BudgetTooLargeError:
            continue
        except Exception as err:
            raise TemplateError(
                f"a budget of {N + excess} over a pool of {N} must raise BudgetTooLargeError "
                f"(check_request does), got {type(err).__name__}: {err}"
            ) from err
        raise TemplateError(
            f"a budget of {N + excess} over a pool of {N} must raise BudgetTooLargeError"
        )


def _whole_pool(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    idx = _indices(_call(fn, ctx["pool"](N, 0), N, params=ctx["full_pool_params"]), N, N)
    if sorted(idx.tolist()) != list(range(N)):
        raise TemplateError("a budget equal to the pool must take every sample")


def _small_pool(fn: Callable[..., Selection], ctx: dict[str, Any]) -> None:
    _indices(_call(fn, ctx["pool"](3, 1), 1, params=ctx["params"]), 1, 3)


STRATEGY_CHECKS: dict[str, Callable[[Callable[..., Selection], dict[str, Any]], None]] = {
    "exact_budget": _exact_budget,
    "scores_cover_the_pool": _scores_cover_the_pool,
    "seeded": _seeded,
    "pool_unmodified": _pool_unmodified,
    "empty_pool": _empty_pool,
    "budget_over_the_pool": _budget_over_the_pool,
    "whole_pool": _whole_pool,
    "small_pool": _small_pool,
}
"""The strategy template, check by check (name -> check)."""


def check_strategy(
    strategy: Callable[..., Selection] | str | StrategySpec,
    *,
    params: dict[str, Any] | None = None,
    full_pool_params: dict[str, Any] | None = None,
    pool: PoolMaker | None = None,
    checks: list[str] | None = None,
) -> None:
    """Run the strategy template (:data:`STRATEGY_CHECKS`) on ``strategy``.

    Args:
        strategy: the function, or a registered strategy's name (or spec).
        params: settings passed to every call (``active.params``).
        full_pool_params: settings for the calls whose budget is the whole pool (default
            ``params``; EADA needs ``alpha1=1`` there).
        pool: ``pool(n, seed) -> PoolOutputs`` (default :func:`make_pool`): give one where
            your strategy reads a score your component puts into ``PoolOutputs.extra``.
        checks: run only these (default: all).

    Raises:
        TemplateError: the first check that fails, with its name and what went wrong.
    """
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    name = (
        strategy.name
        if isinstance(strategy, StrategySpec)
        else getattr(strategy, "__name__", repr(strategy))
    )
    fn = strategy.fn if isinstance(strategy, StrategySpec) else strategy
    ctx = {
        "params": params or {},
        "full_pool_params": full_pool_params if full_pool_params is not None else params or {},
        "pool": pool or make_pool,
    }
    for check in checks or list(STRATEGY_CHECKS):
        if check not in STRATEGY_CHECKS:
            raise ValueError(f"unknown check {check!r}; known: {', '.join(STRATEGY_CHECKS)}")
        try:
            STRATEGY_CHECKS[check](fn, ctx)
        except TemplateError as err:
            raise TemplateError(f"strategy {name} fails {check!r}: {err}") from None


# -- training components -------------------------------------------------------------------------
def _component_batch(cls: Any, seed: int) -> tuple[Any, Any, Any]:
    """A component built from its defaults and one training step's :class:`StepBatch`
    (embeddings from a small linear encoder over random inputs, with gradient), as the
    runner (:mod:`eada.train.aux`) hands them."""
    import torch
    from torch import nn

    from eada.strategies.components import StepBatch, TargetAccess

    torch.manual_seed(seed)
    comp = cls.from_params(D, C, {})
    encoder = nn.Linear(8, D)
    head = nn.Linear(D, C)
    n_target = 40
    xt = torch.randn(n_target, 8)
    labeled = torch.arange(6)
    labels = torch.randint(C, (n_target,))

    def embed(positions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return encoder(xt[positions])

    access = TargetAccess(n_target, labeled, labels, True, 8, embed, epoch=1, step=3)
    request = comp.target_request(access)
    requested = {}
    if request is not None:
        pos, lab = request
        requested[comp.name] = (encoder(xt[pos]), lab)
    zs, zu = encoder(torch.randn(8, 8)), encoder(xt[10:18])
    batch = StepBatch(
        zs,
        torch.randint(C, (8,)),
        zu,
        encoder(xt[labeled[:4]]),
        labels[labeled[:4]],
        head,
        requested,
        access,
        [encoder(xt[10:18] + 0.01 * torch.randn(8, 8)) for _ in range(comp.strong_views)],
    )
    return comp, batch, encoder


def _builds_from_settings(cls: type, ctx: dict[str, Any]) -> None:
    from eada.strategies.components import AuxComponent

    if not (isinstance(cls, type) and issubclass(cls, AuxComponent)):
        raise TemplateError(f"{cls!r} is not an AuxComponent subclass")
    for key, value in cls.settings.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TemplateError(f"setting {key!r} must default to a number, got {value!r}")
    comp = cls.from_params(D, C, {})
    if not isinstance(comp, AuxComponent):
        raise TemplateError(f"from_params returned {type(comp).__name__}, not the component")
    comp = cls.from_params(D, C, dict(cls.settings))
    if not isinstance(comp, AuxComponent):
        raise TemplateError("from_params with every setting given returned no component")


def _loss_back_propagates(cls: type, ctx: dict[str, Any]) -> None:
    import torch

    comp, batch, encoder = _component_batch(cls, 0)
    loss, logs = comp.loss(batch)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TemplateError(f"loss must be a scalar tensor, got {loss!r}")
    if not torch.isfinite(loss):
        raise TemplateError(f"loss is not finite: {float(loss)}")
    if not isinstance(logs, dict) or not all(isinstance(v, float) for v in logs.values()):
        raise TemplateError(f"the loss's logs must map names to floats, got {logs!r}")
    if loss.requires_grad:
        loss.backward()
        grads = [p.grad for p in [*comp.parameters(), *encoder.parameters()] if p.grad is not None]
        if not all(torch.isfinite(g).all() for g in grads):
            raise TemplateError("the loss's gradients hold NaN or infinite values")


def _seeded_loss(cls: type, ctx: dict[str, Any]) -> None:
    import torch

    def seeded_loss() -> float:
        comp, batch, _ = _component_batch(cls, 3)
        torch.manual_seed(4)  # the step's own draws (a critic's interpolation, ...)
        return float(comp.loss(batch)[0].detach())

    la, lb = seeded_loss(), seeded_loss()
    if la != lb:
        raise TemplateError(f"the same seed gave two losses: {la} and {lb}")


def _pool_scores(cls: type, ctx: dict[str, Any]) -> None:
    import torch

    comp, _, _ = _component_batch(cls, 0)
    scores = comp.pool_scores(torch.randn(N, D))
    if not isinstance(scores, dict):
        raise TemplateError(f"pool_scores must return a dict, got {type(scores).__name__}")
    for key, value in scores.items():
        arr = np.asarray(value)
        if arr.shape[:1] != (N,):
            raise TemplateError(f"pool score {key!r} has shape {arr.shape}, not ({N}, ...)")
        if not np.isfinite(arr).all():
            raise TemplateError(f"pool score {key!r} holds NaN or infinite values")


COMPONENT_CHECKS: dict[str, Callable[[type, dict[str, Any]], None]] = {
    "builds_from_settings": _builds_from_settings,
    "loss_back_propagates": _loss_back_propagates,
    "seeded_loss": _seeded_loss,
    "pool_scores": _pool_scores,
}
"""The training-component template, check by check (name -> check)."""


def check_component(component: type | str, *, checks: list[str] | None = None) -> None:
    """Run the training-component template (:data:`COMPONENT_CHECKS`) on ``component``.

    Args:
        component: the :class:`~eada.strategies.components.AuxComponent` subclass, or a
            registered component's name.
        checks: run only these (default: all).

    Raises:
        TemplateError: the first check that fails, with its name and what went wrong.
    """
    if isinstance(component, str):
        from eada.strategies.components import get_component

        component = get_component(component)
    name = getattr(component, "name", repr(component))
    for check in checks or list(COMPONENT_CHECKS):
        if check not in COMPONENT_CHECKS:
            raise ValueError(f"unknown check {check!r}; known: {', '.join(COMPONENT_CHECKS)}")
        try:
            COMPONENT_CHECKS[check](component, {})
        except TemplateError as err:
            raise TemplateError(f"training component {name} fails {check!r}: {err}") from None


__all__ = [
    "COMPONENT_CHECKS",
    "STRATEGY_CHECKS",
    "TemplateError",
    "check_component",
    "check_strategy",
    "make_pool",
]
