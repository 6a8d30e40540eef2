"""Feature-matrix input and frozen-backbone feature extraction (cached on disk).

**Feature matrices** let any modality with precomputed embeddings use EADA: one file a domain,
``.npy`` (features; labels from a separate file), ``.npz`` / ``.mat`` (MATLAB v5, read with
SciPy; arrays named e.g. ``fts`` and ``labels`` as the Office-Caltech10 SURF release), or
``.parquet`` (a label column plus numeric feature columns, or one list column ``features``).
Raw label values are mapped to class ids through the sorted distinct labels of the source; a
target or held-out label outside that class map is an error.

**Frozen-backbone mode** runs a pretrained backbone once over every image (test view) and caches
the features under ``cache_dir`` in a file whose name is the SHA-256 of the model name, weights
hash, transform and the image list (paths, sizes, modification times), so a changed image,
weight file or transform never reuses stale features.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from eada.config import path_origin
from eada.runs import tmp_name, write_through

if TYPE_CHECKING:
    import torch
    from torch import nn

    from eada.data.base import TensorDomain
    from eada.models.engines import EngineName, FeatureEngine

FEATURE_KEYS = ("features", "fts", "feas", "feats", "x", "X", "data")
LABEL_KEYS = ("labels", "label", "y", "Y", "gt", "targets")


def _pick(keys: Sequence[str], wanted: str | None, candidates: Sequence[str], what: str) -> str:
    if wanted is not None:
        if wanted not in keys:
            raise ValueError(f"no {what} named {wanted!r}; found: {', '.join(keys)}")
        return wanted
    for c in candidates:
        if c in keys:
            return c
    raise ValueError(
        f"no {what} found (tried {', '.join(candidates)}); found: {', '.join(keys)}; "
        f"name it with {'features_key' if what == 'features' else 'labels_key'}"
    )


def _read_labels_file(path: Path) -> np.ndarray:
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=1)
    except (OSError, ValueError) as err:
        raise ValueError(f"labels file {path}: {err}") from None


def read_feature_file(
    path: str | Path,
    labels: str | Path | None = None,
    features_key: str | None = None,
    labels_key: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read ``(features (N, D) float32, raw labels (N,) int64)`` from one file.

    Args:
        path: ``.npy``, ``.npz``, ``.mat`` or ``.parquet``.
        labels: a separate labels file (``.npy`` or text, one integer a line); required for
            ``.npy`` features, optional otherwise (it wins over labels inside ``path``).
        features_key, labels_key: array / column names; default: the first of
            :data:`FEATURE_KEYS` / :data:`LABEL_KEYS` present.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "d.npz"
    >>> np.savez(f, fts=np.ones((3, 4)), labels=np.array([[1], [2], [1]]))
    >>> x, y = read_feature_file(f)
    >>> x.shape, y.tolist()
    ((3, 4), [1, 2, 1])
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"feature file not found: {path}{path_origin(path)}")
    try:
        x, y, fkey, lkey = _read_arrays(path, labels, features_key, labels_key)
    except ValueError as err:
        if str(err).startswith(str(path)):
            raise
        raise ValueError(f"{path}: {err}") from None
    except Exception as err:  # numpy/scipy/pyarrow errors for a damaged file
        raise ValueError(
            f"{path}: cannot read the feature file ({type(err).__name__}: {err})"
        ) from None
    where_y = f"labels file {labels}" if labels is not None else f"{path}: labels {lkey!r}"
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == object):
        raise ValueError(f"{path}: features {fkey!r} are {x.dtype} values, expected numbers")
    try:
        x = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: features {fkey!r} are not all numbers") from None
    y = np.asarray(y).reshape(-1)
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise ValueError(f"{where_y} are {y.dtype} values, expected integer class ids")
    if x.ndim != 2:
        raise ValueError(f"{path}: features must be a 2-D (N, D) matrix, got shape {x.shape}")
    if len(y) != len(x):
        raise ValueError(f"{path}: {len(x)} feature rows but {len(y)} labels")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{path}: features contain NaN or infinite values")
    if not np.all(np.isfinite(y)) or not np.all(np.equal(np.mod(y, 1), 0)):
        raise ValueError(f"{where_y} must be integers")
    return x, y.astype(np.int64)


def read_array_file(path: Path) -> dict[str, np.ndarray]:
    """The named arrays of a ``.npz`` (no pickles) or ``.mat`` file (MATLAB's ``__`` headers
    left out), or a :class:`ValueError` naming the file when it is truncated, damaged or
    holds an object array (which would need a pickle).

    Raises:
        ValueError: an unreadable file, named with the reason.
    """
    if path.suffix.lower() == ".npz":
        return _readable(path, lambda: _npz_arrays(path))
    from scipy.io import loadmat

    arrays = _readable(path, lambda: loadmat(path))
    out = {k: v for k, v in arrays.items() if not k.startswith("__")}
    for k, v in out.items():
        if isinstance(v, np.ndarray) and v.dtype == object:
            raise ValueError(
                f"{path}: array {k!r} holds MATLAB cells or structs (objects), not numbers or "
                "text; save it as a numeric matrix (ids as a char or string array)"
            )
    return out


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def load_npy(path: Path) -> np.ndarray:
    """A ``.npy`` array without pickles, or a :class:`ValueError` naming the file."""
    return _readable(path, lambda: np.load(path, allow_pickle=False))


def _readable(path: Path, read: Any) -> Any:
    """``read()``, with what numpy, zipfile and scipy raise on a bad file turned into one
    :class:`ValueError` that names ``path`` (an :class:`OSError` of the file system, e.g. a
    permission, stays as it is: it names the file itself)."""
    import zipfile
    import zlib

    try:
        return read()
    except (PermissionError, FileNotFoundError, IsADirectoryError):
        raise
    except ValueError as err:
        if "allow_pickle" in str(err) or "Object arrays" in str(err):
            raise ValueError(
                f"{path}: holds an object array (Python objects need a pickle, which eada "
                "never loads); save ids and paths as text arrays (np.array(ids, dtype=str))"
            ) from None
        raise ValueError(f"{path}: cannot be read as an array file ({err})") from None
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path}: truncated or damaged, cannot be read ({type(err).__name__}: {err}); "
            "write it again"
        ) from None
    except Exception as err:  # scipy's MatReadError and friends
        if type(err).__module__.startswith("scipy"):
            raise ValueError(
                f"{path}: truncated or damaged MATLAB file ({err}); write it again"
            ) from None
        raise


def _read_arrays(
    path: Path, labels: str | Path | None, features_key: str | None, labels_key: str | None
) -> tuple[Any, Any, str, str]:
    """Raw ``(features, labels, features key, labels key)`` of a feature file."""
    suffix = path.suffix.lower()
    y: Any = None
    fkey, lkey = "array", "labels"
    if suffix == ".npy":
        x = load_npy(path)
        if labels is None:
            raise ValueError(f"{path}: a .npy feature file needs a separate labels file")
    elif suffix in (".npz", ".mat"):
        arrays = read_array_file(path)
        fkey = _pick(list(arrays), features_key, FEATURE_KEYS, "features")
        x = arrays[fkey]
        if labels is None:
            lkey = _pick(list(arrays), labels_key, LABEL_KEYS, "labels")
            y = arrays[lkey]
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        cols = table.column_names
        lab = None if labels is not None else _pick(cols, labels_key, LABEL_KEYS, "labels")
        if lab is not None:
            lkey = lab
            y = table.column(lab).to_numpy(zero_copy_only=False)
        if "features" in cols or features_key is not None:
            fcol = _pick(cols, features_key or "features", FEATURE_KEYS, "features")
            fkey = fcol
            x = np.stack(table.column(fcol).to_numpy(zero_copy_only=False))
        else:
            import pyarrow.types as pat

            bad = [
                f"{c!r} ({table.schema.field(c).type})"
                for c in cols
                if c != lab
                and not pat.is_integer(table.schema.field(c).type)
                and not pat.is_floating(table.schema.field(c).type)
            ]
            if bad:
                raise ValueError(f"feature columns must be numeric; not numeric: {', '.join(bad)}")
            fkey = "numeric columns"
            x = np.stack([table.column(c).to_numpy() for c in cols if c != lab], axis=1)
    else:
        raise ValueError(f"{path}: unsupported feature file (use .npy, .npz, .mat or .parquet)")
    if labels is not None:
        y = _read_labels_file(Path(labels))
    return np.asarray(x), np.asarray(y), fkey, lkey


Normalize = Literal["none", "l2", "zscore", "l1_zscore"]


def _l1_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L1 norm, in ``x``'s memory layout. The norms are summed over a
    C-ordered copy, so a row's result depends neither on the file's layout (MATLAB's
    column-major arrays; a row-stacked copy) nor on the other rows."""
    return x / np.maximum(np.abs(np.ascontiguousarray(x)).sum(axis=1, keepdims=True), 1e-12)


def domain_statistics(x: np.ndarray, how: Normalize) -> dict[str, Any]:
    """The per-domain statistics ``how`` normalises with: ``{"normalize": how, "mean": [...],
    "std": [...]}`` (the column means and standard deviations of the ``zscore`` step, after
    the L1 step for ``l1_zscore``, float32 values as JSON-ready floats) or just
    ``{"normalize": how}`` for the row-wise ``l2`` and ``none``.

    >>> domain_statistics(np.array([[1.0, 3.0], [3.0, 1.0]], dtype=np.float32), "zscore")
    {'normalize': 'zscore', 'mean': [2.0, 2.0], 'std': [1.0, 1.0]}
    """
    if how not in ("zscore", "l1_zscore"):
        return {"normalize": how}
    if len(x) == 0:
        raise ValueError(f"no rows to compute the {how} statistics of: the domain is empty")
    if how == "l1_zscore":
        x = _l1_rows(x)
    return {"normalize": how, "mean": x.mean(axis=0).tolist(), "std": x.std(axis=0).tolist()}


def normalize_features(
    x: np.ndarray, how: Normalize, stats: dict[str, Any] | None = None
) -> np.ndarray:
    """``l2``: each row divided by its L2 norm; ``zscore``: each column standardised with the
    domain's own mean and std (``(x - mu) / (sigma + 1e-8)``); ``l1_zscore``: rows divided by
    their sum, then ``zscore`` (the JDA code's preprocessing of the SURF features); ``none``:
    unchanged.

    ``stats``: the statistics to standardise with instead of ``x``'s own
    (:func:`domain_statistics` of the rows a domain was registered with): a project store
    freezes its target's statistics, so rows added later never change the earlier ones.

    >>> normalize_features(np.array([[1.0, 3.0], [3.0, 1.0]]), "l1_zscore").round(6).tolist()
    [[-1.0, 1.0], [1.0, -1.0]]

    Raises:
        ValueError: ``stats`` were computed for another normalisation or another dimension.
    """
    if how not in ("zscore", "l1_zscore"):
        if how == "l2":
            return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        return x
    if len(x) == 0 and stats is None:  # no statistics of no rows (the empty domain is refused
        return x  # by name where the task is checked, without numpy's warnings first)
    if stats is None:
        stats = domain_statistics(x, how)
    if stats.get("normalize") != how or len(stats.get("mean", ())) != x.shape[1]:
        raise ValueError(
            f"the frozen statistics are for normalize {stats.get('normalize')!r} on "
            f"{len(stats.get('mean', ()))} columns, not {how!r} on {x.shape[1]}"
        )
    if how == "l1_zscore":
        x = _l1_rows(x)
    mean = np.asarray(stats["mean"], dtype=x.dtype)
    std = np.asarray(stats["std"], dtype=x.dtype)
    return (x - mean) / (std + 1e-8)


def feature_domains(
    parts: dict[str, tuple[np.ndarray, np.ndarray]],
    classes: Sequence[str] | None = None,
    normalize: Normalize = "none",
    frozen: dict[str, dict[str, Any]] | None = None,
) -> dict[str, TensorDomain]:
    """``TensorDomain``s from raw ``{role: (features, raw labels)}``, ``role`` ``source`` first.
    Each domain is normalised with its own statistics, or with ``frozen[role]``
    (:func:`normalize_features`).

    Class ids = positions of the raw label values in the sorted distinct SOURCE labels;
    ``classes`` names them (default: the raw values as text).

    Raises:
        ValueError: a domain's labels outside the source's class map, or differing dimensions.
    """
    import torch

    from eada.data.base import TensorDomain

    xs, ys = parts["source"]
    values = np.unique(ys)
    names = list(classes) if classes is not None else [str(v) for v in values]
    if len(names) != len(values):
        raise ValueError(
            f"classes names {len(names)} classes but the source has {len(values)} label values"
        )
    lookup = {int(v): i for i, v in enumerate(values)}
    out: dict[str, TensorDomain] = {}
    for role, (x, y) in parts.items():
        if x.shape[1] != xs.shape[1]:
            raise ValueError(f"{role} features are {x.shape[1]}-d but source's {xs.shape[1]}-d")
        unknown = sorted({int(v) for v in np.unique(y)} - set(lookup))
        if unknown:
            raise ValueError(
                f"{role} has label ids outside the class map {sorted(lookup)}: {unknown}"
            )
        ids = np.array([lookup[int(v)] for v in y], dtype=np.int64)
        xn = normalize_features(x, normalize, (frozen or {}).get(role)).astype(np.float32)
        out[role] = TensorDomain(role, torch.from_numpy(xn), torch.from_numpy(ids), names)
    return out


def cache_key(model_id: str, weights_id: str, transform_id: str, paths: Sequence[Path]) -> str:
    """SHA-256 naming a feature cache entry (model, weights, transform, images + their
    sizes and modification times)."""
    h = hashlib.sha256()
    h.update(json.dumps([model_id, weights_id, transform_id]).encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class PlainProgress:
    """Progress as plain lines on stderr, for logs (stderr not a terminal): one at the start,
    then every ``every_share`` of the work or ``every_seconds``, whichever comes first, and one
    at the end, e.g. ``extracting features: 320/1000 (32%), 41 s, about 87 s left``."""

    def __init__(
        self, what: str, total: int, every_share: float = 0.1, every_seconds: float = 30.0
    ) -> None:
        import sys

        self.what, self.total = what, total
        self.every_share, self.every_seconds = every_share, every_seconds
        self.t0 = self.last_t = time.perf_counter()
        self.last_done = 0
        self.stream = sys.stderr
        self._print(f"{what}: {total} samples")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, done: int) -> None:
        """Record ``done`` samples finished; prints a line when one is due."""
        now = time.perf_counter()
        due = (
            done >= self.total
            or done - self.last_done >= self.every_share * self.total
            or now - self.last_t >= self.every_seconds
        )
        if not due or done == self.last_done:
            return
        spent = now - self.t0
        left = spent / done * (self.total - done) if done else 0.0
        pct = 100.0 * done / max(1, self.total)
        tail = f", about {left:.0f} s left" if done < self.total else ""
        self._print(f"{self.what}: {done}/{self.total} ({pct:.0f}%), {spent:.0f} s{tail}")
        self.last_done, self.last_t = done, now


def extract_features(
    backbone: nn.Module,
    domain: Any,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    reasons: list[str] | None = None,
    what: str = "extracting features",
    cache_dir: Path | None = None,
    engine: EngineName = "auto",
    record: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Features ``(N, D)`` of every sample of ``domain`` (eval mode, in order).

    The backbone runs on the engine :func:`eada.models.engines.feature_engine` picks: ONNX
    Runtime on the CPU when installed (its export cached under ``cache_dir/onnx``; without a
    ``cache_dir``, or without the extra, eager PyTorch in ``channels_last``; on CUDA under
    bfloat16 autocast), with the process's torch thread count. Images are decoded off the main
    thread, in a pool of ``domain.workers`` threads (at least one) that reads ahead of the
    engine (:func:`eada.data.batches.iterate_items_threaded`).

    ``reasons``: receives the second field of every sample in order (a
    :class:`~eada.data.images.DecodeChecked` domain's decode failures). ``what`` names the pass
    in the progress bar and the plain log lines. ``record``: receives the engine's record
    (:meth:`~eada.models.engines.FeatureEngine.record`) and the decoding threads.
    """
    import torch

    with torch.no_grad():
        return _extract_features(
            backbone, domain, batch_size, device, reasons, what, cache_dir, engine, record
        )


def _extract_features(
    backbone: nn.Module,
    domain: Any,
    batch_size: int,
    device: torch.device | str,
    reasons: list[str] | None,
    what: str,
    cache_dir: Path | None,
    engine: EngineName,
    record: dict[str, Any] | None,
) -> torch.Tensor:

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from eada.data.batches import chunks, iterate_items_threaded
    from eada.models.engines import feature_engine

    out = []
    console = Console(stderr=True)
    # a bar with ETA on a terminal; plain lines (every 10% or 30 s) when stderr is not one
    bar = Progress(
        f"  {what}",
        BarColumn(),
        MofNCompleteColumn(),
        "left",
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
    task = bar.add_task("features", total=None)
    plain = PlainProgress(what, len(domain)) if not console.is_terminal else None

    def on_batch(done: int, total: int) -> None:
        bar.update(task, total=total, completed=done)
        if plain is not None:
            plain.update(min(len(domain), done * batch_size))

    decode = max(1, int(getattr(domain, "workers", 0) or 0))
    run: FeatureEngine | None = None
    batches = chunks(torch.arange(len(domain)), batch_size)
    with bar:
        for x, second in iterate_items_threaded(domain, batches, decode, on_batch):
            if reasons is not None:
                reasons.extend(second)
            if run is None:  # the input shape is known now
                run = feature_engine(backbone, tuple(x.shape[1:]), cache_dir, device, engine)
                if record is not None:
                    record.update(run.record(), decode_threads=decode)
            out.append(run(x))
    return torch.cat(out)


def cached_features(
    cache_dir: Path,
    key: str,
    backbone: nn.Module,
    domain: Any,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    what: str = "extracting features",
    engine: EngineName = "auto",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """:func:`extract_features`, read from ``cache_dir/<key>.pt`` when there (saved after
    a miss; the ONNX export lives under ``cache_dir/onnx``). Returns the features and
    ``{"cache": "hit"|"miss", "file", "seconds"}`` plus, after a miss, the engine's record
    (``engine``, ``threads``, ``decode_threads``, ...)."""
    import torch

    f = cache_dir / f"{key}.pt"
    t0 = time.perf_counter()
    if f.is_file():
        feats = torch.load(f, map_location="cpu", weights_only=True)
        if isinstance(feats, torch.Tensor) and feats.shape[0] == len(domain):
            return feats, {"cache": "hit", "file": str(f), "seconds": time.perf_counter() - t0}
    used: dict[str, Any] = {}
    feats = extract_features(
        backbone,
        domain,
        batch_size,
        device,
        what=what,
        cache_dir=cache_dir,
        engine=engine,
        record=used,
    )
    save_cached_features(cache_dir, key, feats)
    info = {"cache": "miss", "file": str(f), "seconds": time.perf_counter() - t0}
    return feats, {**info, **used}


def save_cached_features(cache_dir: Path, key: str, feats: torch.Tensor) -> Path:
    """Write ``feats`` to ``cache_dir/<key>.pt`` (atomically: concurrent runs never read a
    partial file) and return the file."""
    import torch

    cache_dir.mkdir(parents=True, exist_ok=True)
    f = cache_dir / f"{key}.pt"
    tmp = tmp_name(f)
    try:
        write_through(tmp, lambda fh: torch.save(feats, fh))
        tmp.replace(f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return f
