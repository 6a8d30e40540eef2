"""The public extension API: your strategy, training component, backbone or method beside
eada's own, without editing eada.

Everything a plugin needs is here; the built-ins register through the same calls. A plugin
is a Python module (a single ``.py`` file, or a module of an installed package) that calls
these at import:

* :func:`register_strategy` - a query strategy ``(pool, budget, rng, **params) -> Selection``.
  It reads the pool outputs it declares in ``needs`` from :class:`PoolOutputs` and returns
  :class:`Selection` (``budget`` distinct positions into the pool, best first, and the
  per-sample scores it used over the WHOLE pool). It starts with :func:`check_request` (an
  empty pool raises :class:`EmptyPoolError`, a budget over the pool
  :class:`BudgetTooLargeError`). Its keyword-only parameters are its settings
  (``active.params``); any other key is an error naming the accepted ones.
  :func:`eada.testing.check_strategy` runs the template tests every built-in passes.
* :func:`register_component` - a training component (a loss beside the classifier's and,
  optionally, per-sample pool scores that a strategy reads from ``PoolOutputs.extra``): an
  :class:`AuxComponent` subclass with a ``name``, the ``settings`` it reads (with defaults),
  ``from_params``, ``loss`` and optionally ``pool_scores``.
* :func:`register_backbone` - a feature extractor ``fn(pretrained) -> nn.Module`` for
  ``model.backbone: NAME``.
* :func:`register_method` - a method: a strategy + components + settings under one name that
  ``eada bench --methods`` and ``eada run --method`` accept.

A name already taken by eada is refused with a message; so is one registered by two plugins.
How a plugin is loaded: ``--plugin FILE_OR_MODULE`` on ``eada run``/``bench``/``query``/
``train``, a ``plugins:`` list in a config, or an entry point of an installed package in the
groups ``eada.strategies``, ``eada.components``, ``eada.backbones``, ``eada.methods``
(:mod:`eada.plugins`). Every run record names the plugins it used, with their package version
or the file's SHA-256 (:func:`plugins_of`).

A strategy in a plugin file::

    import numpy as np
    from eada.extend import PoolOutputs, Selection, check_request, register_strategy

    @register_strategy("my_margin", needs=("energies",), summary="smallest top-2 margin",
                       reference="Scheffer et al., 2001")
    def my_margin(pool: PoolOutputs, budget: int, rng: np.random.Generator) -> Selection:
        check_request(pool, budget)
        p = np.sort(pool.probabilities("my_margin"), axis=1)
        score = p[:, -2] - p[:, -1]              # higher = more uncertain
        return Selection(np.argsort(-score, kind="stable")[:budget], {"margin": -score})

Example:
    The contract on a pool of 3 samples (energies: lower = more likely):

    >>> import numpy as np
    >>> pool = PoolOutputs(energies=np.array([[0.0, 3.0], [1.0, 1.1], [2.0, 0.0]]))
    >>> check_request(pool, 2)
    3
    >>> p = np.sort(pool.probabilities("doc"), axis=1)
    >>> int(np.argmax(p[:, -2] - p[:, -1]))  # the least certain sample
    1
"""

from __future__ import annotations

import sys
from typing import Any

from eada import plugins
from eada.hparams import register_method as _register_method
from eada.models.backbones import register_backbone
from eada.plugins import PluginError, PluginInfo
from eada.strategies.base import (
    BudgetTooLargeError,
    EmptyPoolError,
    PoolOutputs,
    Selection,
    SelectionError,
    check_request,
    top_k_stable,
)
from eada.strategies.base import register as register_strategy
from eada.strategies.components import (
    STRATEGY_COMPONENTS,
    AuxComponent,
    StepBatch,
    TargetAccess,
    register_component,
)


def register_method(
    name: str,
    *,
    strategy: str,
    components: tuple[str, ...] | list[str] = (),
    params: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """Register a method: a strategy, the training components it trains and settings, under a
    name that ``eada bench --methods`` and ``eada run --method`` accept.

    Args:
        name: the method's name; a built-in method's name is refused.
        strategy: a registered strategy (``none``: no target labels).
        components: training components (``active.params.aux_components``); empty: the
            strategy's defaults.
        params: further ``active.params``, validated like a config's (an unknown key is an
            error naming the accepted ones).
        settings: other config changes by section, e.g. ``{"train": {"gamma": 0.0}}`` (plain
            NLL training without EADA's alignment loss, as the baselines train).
        label: its name in tables (default: ``name``).

    Returns:
        The method's config changes.

    Raises:
        ValueError: a taken name, an unknown strategy or component, or an unknown setting.

    Example:
        A built-in's name is refused:

        >>> try:
        ...     register_method("source_only", strategy="none")
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        method 'source_only' is a built-in of eada (eada.hparams)
    """
    module = str(sys._getframe(1).f_globals.get("__name__", ""))
    return _register_method(
        name,
        strategy=strategy,
        components=components,
        params=params,
        settings=settings,
        label=label,
        _module=module,
    )


def plugins_of(config: Any, method: str | None = None) -> list[dict[str, str]]:
    """The plugins a run uses, as its record names them: the plugins that registered its
    strategy, its training components, its backbone and its method, and those its config
    lists under ``plugins`` (one entry a plugin module).

    Args:
        config: the run's :class:`~eada.config.ExperimentConfig`.
        method: the method the run was made with (``eada bench``, ``eada run --method``).

    Example:
        >>> from eada.hparams import preset_config
        >>> plugins_of(preset_config("toy", "eada"), "eada")
        []
    """
    found: list[PluginInfo | None] = []
    a = config.active
    if a.strategy != "none":
        found.append(plugins.provider("strategy", a.strategy))
    names = a.params.get("aux_components", STRATEGY_COMPONENTS.get(a.strategy, ()))
    found += [plugins.provider("component", n) for n in names]
    if config.model.name == "backbone":
        found.append(plugins.provider("backbone", config.model.backbone))
    if method:  # a method, or a strategy run as one
        found.append(plugins.provider("method", method) or plugins.provider("strategy", method))
    found += [plugins.load_plugin(p) for p in getattr(config, "plugins", [])]
    out: dict[str, dict[str, str]] = {}
    for info in found:
        if info is not None:
            out.setdefault(info.module, info.record())
    return list(out.values())


__all__ = [
    "AuxComponent",
    "BudgetTooLargeError",
    "EmptyPoolError",
    "PluginError",
    "PoolOutputs",
    "Selection",
    "SelectionError",
    "StepBatch",
    "TargetAccess",
    "check_request",
    "plugins_of",
    "register_backbone",
    "register_component",
    "register_method",
    "register_strategy",
    "top_k_stable",
]
