"""Project data beyond labeled domains: an UNLABELED target, a labeled held-out target split,
and image data with any backbone (``data.kind: images``) in the project store.

The ``store:`` section of a project config (only the store reads it; see
:class:`StoreOptions`) says whether the target carries labels. An unlabeled target is

* a **flat folder** of images (no class sub-folders; ``store.target: unlabeled`` also ignores
  class folders when present),
* a **file list**: a ``.csv`` with a ``path`` column and an optional ``id`` column, or a text
  file with one path a line and an optional ``TAB id`` (relative paths start at ``data.root``
  or the list's folder), or
* a **feature matrix without labels** (``data.kind: features``): ``.npy``, ``.npz``/``.mat``
  (optional ``ids``/``paths`` arrays) or ``.parquet`` (optional ``id``/``path`` columns).

Class names come from the source. The model needs a label for every sample only as a
placeholder (class 0); nothing reads it: the store never computes an accuracy on an unlabeled
target, and ``eada train --simulate`` refuses one. A labeled held-out split (class folders, a
``path label`` list, or a ``.csv`` with ``path`` and ``label`` (class name) columns) gives an
honest accuracy.
"""

from __future__ import annotations

import csv
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eada.config import FeatureData, ImageListData, path_origin
from eada.data.images import IMAGE_EXTENSIONS, ImageDataError, ImageList, load_image_list
from eada.store.config import (  # noqa: F401  (their home moved to eada.store.config)
    StoreOptions,
    absolute_config,
    absolute_data,
    load_project_config,
    split_store_section,
)
from eada.store.roots import (
    check_file_names,
    label_studio_root,  # noqa: F401  (its home: eada.store.roots)
)

Progress = Callable[[str], None] | None

SAMPLE_INFO_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sample_info (sample_id INTEGER PRIMARY KEY REFERENCES "
    "samples (id), external_id TEXT, external_path TEXT)"
)


@dataclass
class SampleInfo:
    """What a user named a sample: their id and (feature rows) a path, both optional."""

    ids: list[str | None] = field(default_factory=list)
    paths: list[str | None] = field(default_factory=list)


# -- image lists ----------------------------------------------------------------------------
def _has_class_folders(folder: Path) -> bool:
    base = folder / "images" if (folder / "images").is_dir() else folder
    return any(d.is_dir() and not d.name.startswith(".") for d in base.iterdir())


def target_is_labeled(spec: Path, option: str, kind: str = "images") -> bool:
    """Resolve ``store.target`` for a target ``spec`` (folder, list or feature file)."""
    if option != "auto":
        return option == "labeled"
    if kind == "features":
        return _feature_file_has_labels(spec)
    if spec.is_dir():
        return _has_class_folders(spec)
    if spec.suffix.lower() == ".csv":
        with open(spec, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), [])
        return "label" in header
    return not spec.is_file() or _text_list_has_labels(spec)


def _text_list_has_labels(spec: Path) -> bool:
    """Whether a text list is a ``path label`` list: some line ends in an integer label (a
    list of plain ``PATH`` or ``PATH<TAB>ID`` lines is an unlabeled target)."""
    for line in spec.read_text(encoding="utf-8").splitlines():
        parts = line.strip().rsplit(maxsplit=1)
        if line.strip().startswith("#") or len(parts) != 2:
            continue
        if parts[1].lstrip("-").isdigit():
            return True
    return False


def _flat_images(folder: Path) -> list[Path]:
    """Every image under ``folder`` (recursively, sorted), for an unlabeled target."""
    return sorted(
        p.resolve()
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")
    )


def read_path_list(path: Path, root: Path | None = None) -> tuple[list[Path], list[str | None]]:
    """A list of image paths with optional ids: a ``.csv`` with ``path`` (+ optional ``id``)
    columns, or text with ``PATH`` or ``PATH<TAB>ID`` a line (``#`` comments).

    Raises:
        ImageDataError: no ``path`` column, empty entries, duplicate ids, no paths.
    """
    base = root if root is not None else path.parent
    paths: list[Path] = []
    ids: list[str | None] = []
    errors: list[str] = []
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            if "path" not in (reader.fieldnames or []):
                raise ImageDataError(f"{path}: a CSV list needs a 'path' column")
            for row in reader:
                p = (row.get("path") or "").strip()
                if not p:
                    errors.append(f"row {reader.line_num}: empty path")
                    continue
                paths.append(Path(p))
                ids.append((row.get("id") or "").strip() or None)
    else:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            p, _, ident = line.partition("\t")
            if not p.strip():
                errors.append(f"line {n}: empty path")
                continue
            paths.append(Path(p.strip()))
            ids.append(ident.strip() or None)
    given = [i for i in ids if i is not None]
    if len(set(given)) != len(given):
        errors.append("ids are not unique")
    if errors:
        raise ImageDataError(f"{path}: " + "; ".join(errors[:20]))
    if not paths:
        raise ImageDataError(f"{path}: no images listed")
    return [p if p.is_absolute() else (base / p) for p in paths], ids


def unlabeled_images(
    spec: Path, classes: list[str], root: Path | None = None, files: list[Path] | None = None
) -> tuple[ImageList, SampleInfo]:
    """An unlabeled target: every image of a folder, or a path list. Labels are class 0
    placeholders (nothing reads them); ``classes`` are the source's. ``files``: the images
    in this order instead (a store's registered pool, see :mod:`eada.store.pool`)."""
    name = spec.stem if spec.is_file() else spec.name
    if files is not None:
        return ImageList(name, list(files), [0] * len(files), list(classes)), SampleInfo()
    if not spec.exists():
        raise FileNotFoundError(f"target not found: {spec}{path_origin(spec)}")
    if spec.is_dir():
        paths = _flat_images(spec)
        ids: list[str | None] = [None] * len(paths)
        if not paths:
            raise ImageDataError(f"{spec}: no images ({', '.join(IMAGE_EXTENSIONS)})")
    else:
        paths, ids = read_path_list(spec, root)
    return ImageList(name, paths, [0] * len(paths), list(classes)), SampleInfo(ids, [])


def labeled_heldout(spec: Path, classes: list[str], root: Path | None = None) -> ImageList:
    """A labeled held-out target split: class folders, a ``path label`` list, or a ``.csv``
    with ``path`` and ``label`` (a class NAME) columns. Paths are not confined here: the store
    confines every file to its data roots (:func:`eada.store.roots.check_within_roots`)."""
    if spec.suffix.lower() != ".csv":
        return load_image_list(spec, root, classes, allow_outside=True)
    base = root if root is not None else spec.parent
    lookup = {c: i for i, c in enumerate(classes)}
    paths: list[Path] = []
    labels: list[int] = []
    errors: list[str] = []
    with open(spec, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if not {"path", "label"} <= set(reader.fieldnames or []):
            raise ImageDataError(f"{spec}: a held-out CSV needs 'path' and 'label' columns")
        for row in reader:
            name = (row.get("label") or "").strip()
            if name not in lookup:
                errors.append(f"row {reader.line_num}: unknown class name {name!r}")
                continue
            p = Path((row.get("path") or "").strip())
            paths.append(p if p.is_absolute() else base / p)
            labels.append(lookup[name])
    if errors:
        raise ImageDataError(f"{spec}: " + "; ".join(errors[:20]))
    if not paths:
        raise ImageDataError(f"{spec}: no images listed")
    return ImageList(spec.stem, paths, labels, list(classes))


def load_store_images(
    data: ImageListData,
    model: Any,
    labeled: bool,
    device: str = "cpu",
    progress: Progress = None,
    target_files: list[Path] | None = None,
) -> tuple[Any, dict[str, list[Path] | None], SampleInfo]:
    """The domains of an image project (any backbone, frozen through the feature cache or
    fine-tuned), the file of every sample by role, and the target's ids.

    Every image is decoded once before any training (for a frozen backbone by its first
    feature extraction; not at all when the feature cache holds the domain); all missing or
    unreadable ones are listed in one error (``data.skip_bad_images: true`` drops them)."""
    from eada.data.image_tasks import cached_feature_domains, drop_bad_images, image_domains
    from eada.data.tasks import Task

    # every file is confined to the project's data roots by eada.store.roots at init (roots
    # the user names with --allow-root included), not to each list's folder here
    source = load_image_list(data.source, data.root, allow_outside=True)
    info = SampleInfo()
    if labeled:
        target = load_image_list(data.target, data.root, source.classes, allow_outside=True)
    else:
        target, info = unlabeled_images(Path(data.target), source.classes, data.root, target_files)
    lists = {"source": source, "target": target}
    if data.heldout is not None:
        lists["heldout"] = labeled_heldout(Path(data.heldout), source.classes, data.root)
    if Path(data.source).resolve() == Path(data.target).resolve():
        raise ImageDataError(
            f"the source and target are the same ({data.source}): domain adaptation needs a "
            "labeled source and a different target"
        )
    for role, il in lists.items():  # before anything is decoded or written
        check_file_names(il.paths, f"{role} {il.name!r}")
    check = cached_feature_domains(data, model, device, progress)
    lists, bad = drop_bad_images(
        lists, data.skip_bad_images, check, check.extract if check else None
    )
    if bad:
        keep = [i for i, p in enumerate(target.paths) if p not in bad]
        info = SampleInfo([info.ids[i] for i in keep] if info.ids else [], [])
    for role, il in lists.items():
        if not il.paths:
            raise ImageDataError(f"{role} {il.name!r}: no images")
    domains, notes = image_domains(data, model, lists, device, progress, check)
    task = Task(domains["source"], domains["target"], domains.get("heldout"), notes)
    files: dict[str, list[Path] | None] = {k: list(v.paths) for k, v in lists.items()}
    return task, files, info


# -- feature matrices -----------------------------------------------------------------------
def _feature_file_has_labels(path: Path) -> bool:
    from eada.data.features import LABEL_KEYS, read_array_file

    suffix = path.suffix.lower()
    if suffix in (".npz", ".mat"):
        if not path.is_file():
            raise FileNotFoundError(f"feature file not found: {path}")
        return any(k in LABEL_KEYS for k in read_array_file(path))  # a bad file: named
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return any(k in LABEL_KEYS for k in pq.read_schema(path).names)
    return False


def read_unlabeled_features(
    path: Path, features_key: str | None = None
) -> tuple[np.ndarray, SampleInfo]:
    """Features ``(N, D)`` of an unlabeled feature file and its optional ``ids``/``paths``
    (``.npz``/``.mat`` arrays, ``.parquet`` columns ``id``/``path``)."""
    from eada.data.features import FEATURE_KEYS, LABEL_KEYS, _pick, load_npy, read_array_file

    if not path.is_file():
        raise FileNotFoundError(f"feature file not found: {path}")
    suffix = path.suffix.lower()
    extra: dict[str, Any] = {}
    if suffix == ".npy":
        x = load_npy(path)
    elif suffix in (".npz", ".mat"):
        arrays = read_array_file(path)
        x = arrays[_pick(list(arrays), features_key, FEATURE_KEYS, "features")]
        extra = {k: arrays[k] for k in ("ids", "paths") if k in arrays}
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        named = {"id": "ids", "path": "paths"}
        extra = {named[c]: table.column(c).to_numpy() for c in named if c in table.column_names}
        if "features" in table.column_names or features_key is not None:
            x = np.stack(table.column(features_key or "features").to_numpy(zero_copy_only=False))
        else:
            skip = {*named, *LABEL_KEYS}
            cols = [c for c in table.column_names if c not in skip]
            x = np.stack([table.column(c).to_numpy() for c in cols], axis=1)
    else:
        raise ValueError(f"{path}: unsupported feature file (use .npy, .npz, .mat or .parquet)")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{path}: features must be a 2-D (N, D) matrix, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{path}: features contain NaN or infinite values")
    info = SampleInfo()
    for key in ("ids", "paths"):
        if key in extra:
            vals = [str(v).strip() for v in np.asarray(extra[key]).reshape(-1)]
            if len(vals) != len(x):
                raise ValueError(f"{path}: {len(x)} feature rows but {len(vals)} {key}")
            setattr(info, key, [v or None for v in vals])
    if info.ids and len(set(info.ids)) != len(info.ids):
        from collections import Counter

        dup = [i for i, n in Counter(info.ids).items() if n > 1]
        raise ValueError(
            f"{path}: ids are not unique ({len(dup)} repeated, first: {dup[0]!r}); "
            "every row needs its own id"
        )
    return x, info


@dataclass
class TargetRows:
    """A feature-row target as a project store registered it: the raw rows of its registered
    samples in position order (``x``), their ids/paths (``info``) and the frozen statistics
    they are normalised with (:func:`eada.data.features.domain_statistics`), see
    :mod:`eada.store.pool`."""

    x: np.ndarray
    info: SampleInfo
    stats: dict[str, Any]


def load_store_features(
    data: FeatureData, labeled: bool, rows: TargetRows | None = None
) -> tuple[Any, SampleInfo]:
    """The domains of a feature-matrix project whose target may be unlabeled. ``rows``: an
    unlabeled target's registered rows with their frozen statistics (a project store's pool,
    see :mod:`eada.store.pool`) instead of the whole file with its own statistics."""
    from eada.data.features import feature_domains, read_feature_file
    from eada.data.image_tasks import load_feature_task
    from eada.data.tasks import Task

    if labeled:
        return load_feature_task(data), SampleInfo()
    src = read_feature_file(data.source, data.source_labels, data.features_key, data.labels_key)
    if rows is not None:
        x_t, info = rows.x, rows.info
    else:
        x_t, info = read_unlabeled_features(Path(data.target), data.features_key)
    placeholder = np.full(len(x_t), src[1].min(), dtype=np.int64)  # class 0, never read
    parts = {"source": src, "target": (x_t, placeholder)}
    if data.heldout is not None:
        parts["heldout"] = read_feature_file(
            data.heldout, data.heldout_labels, data.features_key, data.labels_key
        )
    frozen = {"target": rows.stats} if rows is not None else None
    doms = feature_domains(parts, data.classes, data.normalize, frozen)
    doms["source"].name = data.source.stem
    doms["target"].name = data.target.stem
    if "heldout" in doms:
        doms["heldout"].name = data.heldout.stem if data.heldout else "heldout"
    return Task(doms["source"], doms["target"], doms.get("heldout")), info


# -- the sample_info table ------------------------------------------------------------------
def record_sample_info(conn: sqlite3.Connection, target_ids: list[int], info: SampleInfo) -> None:
    """Store the user's ids/paths of the target samples (call inside the init transaction)."""
    conn.execute(SAMPLE_INFO_SCHEMA)
    n = len(target_ids)
    ids = info.ids or [None] * n
    paths = info.paths or [None] * n
    rows = [
        (sid, i, p)
        for sid, i, p in zip(target_ids, ids, paths, strict=True)
        if i is not None or p is not None
    ]
    conn.executemany(
        "INSERT INTO sample_info (sample_id, external_id, external_path) VALUES (?, ?, ?)", rows
    )


def sample_info(conn: sqlite3.Connection) -> dict[int, tuple[str | None, str | None]]:
    """``{sample id: (external id, external path)}`` (empty for stores without the table)."""
    has = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sample_info'"
    ).fetchone()
    if has is None:
        return {}
    return {
        r[0]: (r[1], r[2])
        for r in conn.execute("SELECT sample_id, external_id, external_path FROM sample_info")
    }
