"""The query-strategy interface: per-sample model outputs in, pool positions out.

A strategy is a plain function ``(pool, budget, rng, **params) -> Selection``. It never sees the
model, the labels or the data loaders, so the same code serves a simulated oracle and a human
annotator: compute :class:`PoolOutputs` for the unlabeled pool however you like, call the strategy,
send ``selection.indices`` (positions into the pool) to whoever labels them.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported where a strategy computes with it, not here: the registry (names, options,
# summaries) is read by the config and by `eada strategies`, which must not pay torch's start-up.


def is_tensor(value: Any) -> TypeGuard[torch.Tensor]:
    """Whether ``value`` is a ``torch.Tensor``, without importing torch (a process that never
    imported torch holds no tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


class SelectionError(ValueError):
    """Base class of the errors a strategy raises on impossible requests."""


class EmptyPoolError(SelectionError):
    """The unlabeled pool has no samples left to select from."""


class BudgetTooLargeError(SelectionError):
    """The requested budget exceeds what the pool (or a selection stage) can provide."""


@dataclass
class PoolOutputs:
    """Per-sample outputs of the current model on the unlabeled pool.

    Give whatever you have; missing scores that can be derived from ``energies`` are computed on
    first use. Streaming scorers can give only ``free_energy`` and ``mvsm`` (two floats a sample).

    Attributes:
        energies: ``(N, C)`` energies (lower = more likely), or ``None``.
        free_energy: ``(N,)`` free energies ``F(x)``, or ``None`` (derived from ``energies``).
        mvsm: ``(N,)`` MvSM ``U(x)``, or ``None`` (derived from ``energies``).
        embeddings: ``(N, D)`` penultimate features, for strategies that need them.
        n_target: size of the WHOLE target set (labeled + unlabeled); some rules use it.
        extra: further per-pool-sample arrays (first axis ``N``) that training components
            contribute, e.g. ``"domain_source_prob"`` of a domain discriminator.
        labeled_embeddings: ``(L, D)`` features of the LABELED target samples (``L`` may be 0),
            for diversity strategies (CoreSet, DBAL); not part of the pool.
        source_embeddings: ``(M, D)`` features of the source samples (DBAL); not part of the pool.
        predictions: ``(N,)`` predicted classes ``argmin_y E(x, y)`` (integers), or ``None``
            (derived from ``energies``); lets a streaming scorer report the model's error on
            the selected samples without keeping the ``(N, C)`` energies.
    """

    energies: np.ndarray | None = None
    free_energy: np.ndarray | None = None
    mvsm: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    n_target: int | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    labeled_embeddings: np.ndarray | None = None
    source_embeddings: np.ndarray | None = None
    predictions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.predictions is not None:
            pred = np.asarray(
                self.predictions.detach().cpu() if is_tensor(self.predictions) else self.predictions
            )
            if pred.ndim != 1 or not np.issubdtype(pred.dtype, np.integer):
                raise ValueError(
                    f"predictions must be (N,) integers, got {pred.dtype} of shape {pred.shape}"
                )
            self.predictions = pred
        for name in ("energies", "free_energy", "mvsm", "embeddings"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = value.detach().cpu().numpy() if is_tensor(value) else np.asarray(value)
            if not np.issubdtype(arr.dtype, np.floating):
                arr = arr.astype(np.float64)
            # min and max carry any NaN or infinity: two reads, no (N, C) boolean temporary
            if arr.size and not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
                raise ValueError(f"pool {name} contain NaN or infinite values")
            setattr(self, name, arr)
        sizes = {n: len(v) for n, v in self._arrays().items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"pool outputs disagree on the number of samples: {sizes}")
        if self.energies is not None and self.energies.ndim != 2:
            raise ValueError(f"energies must be (N, C), got shape {self.energies.shape}")
        n = len(self)
        for key, value in self.extra.items():
            if np.shape(value)[:1] != (n,):
                raise ValueError(
                    f"pool extra {key!r} has shape {np.shape(value)}, expected ({n}, ...)"
                )
        for name in ("labeled_embeddings", "source_embeddings"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = np.asarray(value.detach().cpu() if is_tensor(value) else value)
            if arr.ndim != 2:
                raise ValueError(f"{name} must be (rows, D), got shape {arr.shape}")
            if self.embeddings is not None and arr.shape[1] != self.embeddings.shape[1]:
                raise ValueError(
                    f"{name} have {arr.shape[1]} features but the pool embeddings "
                    f"{self.embeddings.shape[1]}"
                )
            if not np.isfinite(arr).all():
                raise ValueError(f"{name} contain NaN or infinite values")
            setattr(self, name, arr)

    def _arrays(self) -> dict[str, np.ndarray]:
        names = ("energies", "free_energy", "mvsm", "embeddings", "predictions")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def __len__(self) -> int:
        arrays = self._arrays()
        return len(next(iter(arrays.values()))) if arrays else 0

    def require_energies(self, strategy: str) -> np.ndarray:
        """The ``(N, C)`` energies, or a clear error naming ``strategy``."""
        if self.energies is None:
            raise ValueError(f"strategy {strategy!r} needs the pool's energies (N x C outputs)")
        return self.energies

    def require_embeddings(self, strategy: str) -> np.ndarray:
        """The ``(N, D)`` embeddings, or a clear error naming ``strategy``."""
        if self.embeddings is None:
            raise ValueError(f"strategy {strategy!r} needs the pool's embeddings")
        return self.embeddings

    def require_extra(self, key: str, strategy: str, component: str) -> np.ndarray:
        """``extra[key]``, or a clear error naming ``strategy`` and the training ``component``
        that produces it (see :mod:`eada.train.aux`)."""
        if key not in self.extra:
            raise ValueError(
                f"strategy {strategy!r} needs the pool score {key!r}, produced by the training "
                f"component {component!r} (eada.train.aux); it is missing from the pool outputs"
            )
        return np.asarray(self.extra[key])

    def require_rows(self, name: str, strategy: str) -> np.ndarray:
        """``labeled_embeddings`` or ``source_embeddings`` (possibly 0 rows), or a clear error."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"strategy {strategy!r} needs {name} (give a (0, D) array if none)")
        return np.asarray(value)

    def _scores_from_energies(self, what: str) -> None:
        """Fill the missing ``free_energy`` and ``mvsm`` from the energies in ONE pass over
        them, a block of rows at a time (about 1 MiB each), so the cost is about one read of
        the ``(N, C)`` matrix and the temporaries stay block-sized; the values are those of
        :func:`eada.energy.free_energy` / :func:`eada.energy.mvsm` on the whole matrix."""
        import torch

        from eada import energy as energy_ops

        e = torch.from_numpy(np.asarray(self.require_energies(what)))
        n = e.shape[0]
        rows = max(1, (1 << 20) // max(1, e.shape[1] * e.element_size()))
        f = np.empty(n, dtype=e.numpy().dtype) if self.free_energy is None else None
        want_u = self.mvsm is None and (e.shape[1] >= 2 or what == "MvSM")
        u = np.empty(n, dtype=e.numpy().dtype) if want_u else None
        for start in range(0, n, rows):
            block = e[start : start + rows]
            if f is not None:
                f[start : start + rows] = energy_ops.free_energy(block).numpy()
            if u is not None:
                u[start : start + rows] = energy_ops.mvsm(block).numpy()
        if f is not None:
            self.free_energy = f
        if u is not None:
            self.mvsm = u

    def get_free_energy(self) -> np.ndarray:
        """``F(x)`` for every pool sample (computed from the energies if not given)."""
        if self.free_energy is None:
            self._scores_from_energies("free energy")
        assert self.free_energy is not None
        return self.free_energy

    def get_mvsm(self) -> np.ndarray:
        """``U(x)`` for every pool sample (computed from the energies if not given)."""
        if self.mvsm is None:
            self._scores_from_energies("MvSM")
        assert self.mvsm is not None
        return self.mvsm

    def get_predictions(self) -> np.ndarray:
        """Predicted class ``argmin_y E(x, y)`` of every pool sample (from the energies if not
        given)."""
        if self.predictions is None:
            self.predictions = self.require_energies("predictions").argmin(axis=1).astype(np.int64)
        return self.predictions

    def probabilities(self, strategy: str) -> np.ndarray:
        """Class posteriors ``p(y|x) = softmax(-E(x, .))``."""
        import torch

        e = torch.from_numpy(self.require_energies(strategy))
        return torch.softmax(-e, dim=1).numpy()


@dataclass
class Selection:
    """What a strategy chose.

    Attributes:
        indices: positions into the pool, in the order chosen (best first), ``int64``.
        scores: per-sample scores over the WHOLE pool that the strategy used (name -> ``(N,)``),
            so users can inspect why a sample was or was not chosen.
        info: small facts about the decision (stage sizes, thresholds, ...).
    """

    indices: np.ndarray
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class Strategy(Protocol):
    """The call signature every registered strategy implements."""

    def __call__(
        self, pool: PoolOutputs, budget: int, rng: np.random.Generator, **params: Any
    ) -> Selection: ...


def check_request(pool: PoolOutputs, budget: int) -> int:
    """Validate a request: non-empty pool, ``1 <= budget <= len(pool)``. Returns ``len(pool)``."""
    n = len(pool)
    if n == 0:
        raise EmptyPoolError("the unlabeled pool is empty: there is nothing left to select")
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise TypeError(f"budget must be an integer count, got {budget!r}")
    if budget < 1:
        raise ValueError(f"budget must be at least 1, got {budget}")
    if budget > n:
        raise BudgetTooLargeError(
            f"budget {budget} is larger than the unlabeled pool ({n} samples)"
        )
    return n


def top_k_stable(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest scores, best first, ties broken by lower position.

    A partial sort: one ``np.partition`` (O(N)) finds the threshold, then only the candidates at
    or above it are sorted (stable), so the cost is O(N + m log m) with ``m`` about ``k``.
    """
    n = len(scores)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return np.argsort(-scores, kind="stable").astype(np.int64)
    threshold = np.partition(scores, n - k)[n - k]
    candidates = np.flatnonzero(scores >= threshold)
    order = np.argsort(-scores[candidates], kind="stable")
    return candidates[order[:k]].astype(np.int64)


def resolve_budget(budget: int | float, n_target: int) -> int:
    """Turn a budget spec into a count: an ``int`` is a count; a ``float`` in ``(0, 1]`` is a share
    of the WHOLE target set, rounded up (``ceil``) so a share never rounds to zero."""
    if isinstance(budget, bool):
        raise TypeError("budget must be an int (count) or a float (share of the target set)")
    if isinstance(budget, (int, np.integer)):
        if budget < 1:
            raise ValueError(f"a budget count must be >= 1, got {budget}")
        return int(budget)
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"a budget share must lie in (0, 1], got {budget}")
    return max(1, math.ceil(Fraction(str(budget)) * n_target))


def reference_random_budget(share: float, n_target: int) -> int:
    """The Random baseline's per-round count in the authors' code: Python's ``round`` of the
    float product ``n_target * share`` (half to even: 2.5 -> 2, 3.5 -> 4), at least 1 (theirs
    would label nothing below ``n_target * share = 0.5``). Office-31 amazon (2,817) at 1%: 28
    where :func:`resolve_budget` gives 29.

    Example:
        >>> reference_random_budget(0.01, 2817), resolve_budget(0.01, 2817)
        (28, 29)
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"a budget share must lie in (0, 1], got {share}")
    return max(1, round(n_target * share))


@dataclass(frozen=True)
class StrategySpec:
    """A registered strategy: its function, what it needs, and where it comes from."""

    name: str
    fn: Callable[..., Selection]
    needs: tuple[str, ...]
    summary: str
    reference: str

    @property
    def options(self) -> tuple[str, ...]:
        """The strategy's own settings: the keyword-only parameters of its function (what
        ``active.params`` may set), e.g. ``("selection",)`` for WAAL."""
        sig = inspect.signature(self.fn)
        return tuple(p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY)

    def own_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The settings of ``params`` the strategy takes: all of them for a function with
        ``**params``, else its own :attr:`options` (``active.params`` also holds the training
        components' settings, which a plugin's strategy need not accept)."""
        sig = inspect.signature(self.fn)
        if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            return dict(params)
        return {k: v for k, v in params.items() if k in self.options}


def check_params(
    strategy: str,
    params: dict[str, Any],
    also: tuple[str, ...] = (),
    owned: dict[str, str] | None = None,
) -> None:
    """Reject settings that ``strategy`` would silently ignore.

    Args:
        strategy: a registered strategy name (``"none"`` accepts only ``also``).
        params: the settings (``active.params``).
        also: further keys the caller reads itself (e.g. the training components' settings).
        owned: keys the caller sets from its own config fields, mapped to that field's name
            (e.g. ``{"alpha1": "active.alpha1"}``): setting them in ``params`` is an error.

    Raises:
        ValueError: naming the unknown (or owned) key and listing the accepted ones.
    """
    owned = owned or {}
    spec_options = get_strategy(strategy).options if strategy != "none" else ()
    accepted = sorted((set(spec_options) - set(owned)) | set(also))
    for key in params:
        if key in owned and key in spec_options:
            raise ValueError(f"active.params.{key}: set {owned[key]} instead")
        if key not in accepted:
            raise ValueError(
                f"active.params.{key} is not a setting of strategy {strategy!r}; "
                f"accepted: {', '.join(accepted) or 'none'}"
            )


STRATEGIES: dict[str, StrategySpec] = {}


def _thread_limited(fn: Callable[..., Selection]) -> Callable[..., Selection]:
    """``fn`` run under :func:`eada.threads.blas_limits` (BLAS/OpenMP pools limited to the
    process's chosen thread count: k-means, pairwise distances, ...)."""

    @functools.wraps(fn)
    def limited(*args: Any, **kwargs: Any) -> Selection:
        from eada.threads import blas_limits

        with blas_limits():
            return fn(*args, **kwargs)

    return limited


def register(
    name: str, *, needs: tuple[str, ...], summary: str, reference: str
) -> Callable[[Callable[..., Selection]], Callable[..., Selection]]:
    """Decorator adding a strategy function to :data:`STRATEGIES` under ``name``.

    The one registration path: the built-ins use it, and so does a plugin (it is
    :func:`eada.extend.register_strategy`). A name already registered is refused with a
    message (a built-in is never replaced); registering the same function again (a module
    imported twice, a notebook cell run again) replaces it.

    Args:
        name: the strategy's name (``active.strategy``).
        needs: the pool outputs it reads (``energies``, ``free_energy``, ``mvsm``,
            ``embeddings``, ``labeled_embeddings``, ``source_embeddings``, or a training
            component's score in ``PoolOutputs.extra``).
        summary: one line for ``eada strategies``.
        reference: where the method comes from (paper, year).

    Raises:
        ValueError: a bad name or ``needs``, or a name registered by another function.
    """
    from eada import plugins

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a strategy name must be an identifier, got {name!r}")
    if isinstance(needs, str) or not all(isinstance(n, str) and n for n in needs):
        raise ValueError(f"strategy {name!r}: needs must be a tuple of names, got {needs!r}")

    def wrap(fn: Callable[..., Selection]) -> Callable[..., Selection]:
        module = str(getattr(fn, "__module__", "") or "")
        old = STRATEGIES.get(name)
        if old is not None:
            old_module = str(getattr(old.fn, "__module__", ""))
            same = old_module == module and old.fn.__qualname__ == fn.__qualname__
            if not same or plugins.is_builtin(module):
                raise ValueError(plugins.collision_message("strategy", name, old_module, module))
        if not callable(fn) or len(_positional(fn)) < 3:
            raise ValueError(
                f"strategy {name!r}: {getattr(fn, '__qualname__', fn)!r} must be a function "
                "(pool, budget, rng, **params) -> Selection"
            )
        STRATEGIES[name] = StrategySpec(name, _thread_limited(fn), tuple(needs), summary, reference)
        plugins.register_origin("strategy", name, module)
        return fn

    return wrap


def _positional(fn: Callable[..., Any]) -> list[str]:
    """The names of ``fn``'s positional parameters."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ["pool", "budget", "rng"]  # a builtin: let the call say
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        return ["pool", "budget", "rng"]
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def get_strategy(name: str) -> StrategySpec:
    """Look up a strategy by name, with an error listing the known ones. A name that is not
    a built-in is looked for in the installed plugins' entry points (``eada.strategies``)."""
    if name not in STRATEGIES:
        from eada import plugins

        plugins.load_entry_points("strategy")
    try:
        return STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown strategy {name!r}; known strategies: {known}") from None


def is_strategy(name: str) -> bool:
    """Whether ``name`` is a registered strategy (looking in the plugins' entry points for a
    name that is not a built-in)."""
    try:
        get_strategy(name)
    except ValueError as err:
        if "unknown strategy" in str(err):
            return False
        raise
    return True


def all_strategies() -> dict[str, StrategySpec]:
    """Every strategy, the installed plugins' included (their entry points are loaded)."""
    from eada import plugins

    plugins.load_entry_points("strategy")
    return dict(STRATEGIES)
