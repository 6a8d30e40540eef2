"""What a run's data are: the absolute path and a content digest of every input file a data
config reads, stored in each run record so that a stored result is reused only for the same
data (:func:`eada.runs.input_differences`).

- feature files (and their label files), digits files, a local weights file: SHA-256 of the
  bytes;
- an image list: SHA-256 of the list's text plus each image's resolved path, size and
  modification time (an image folder: the same, over the images the scan finds); the images'
  bytes are not read, so a large image folder costs one ``stat`` an image;
- any other set of files a loader lists (the image/label pairs of a segmentation domain,
  :func:`eada.segmentation.data.seg_data_inputs`): the same, through :func:`files_identity`.

Digests are cached by ``(path, size, mtime)`` within the process, so a command that runs many
configs over the same files hashes each file once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from eada.config import (
    DATA_PATH_KEYS,
    ConfigError,
    DataConfig,
    DigitsData,
    FeatureData,
    ImageListData,
    ModelConfig,
)
from eada.executors import WorkerEnvironmentError
from eada.runs import sha256_file

#: ``(resolved path, size, mtime_ns) -> sha256``: files hashed by this process
_DIGESTS: dict[tuple[str, int, int], str] = {}

# the files each digits domain reads under ``root`` (see eada.data.digits.load_digits)
_DIGIT_FILES: dict[str, dict[str, list[str]]] = {
    "mnist": {
        s: ["mnist/t10k-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz"]
        for s in ("all", "test")
    },
    "usps": {
        "train": ["usps/zip.train.gz"],
        "test": ["usps/zip.test.gz"],
        "all": ["usps/zip.train.gz", "usps/zip.test.gz"],
    },
    "mnist_m": {s: ["mnist_m/mnist_m_test_labels.txt"] for s in ("all", "test")},
}


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes, hashed once per ``(path, size, mtime)`` in this
    process.

    Raises:
        FileNotFoundError: naming the file.
    """
    real = path.resolve()
    st = real.stat()  # FileNotFoundError names the path
    key = (str(real), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = "sha256:" + sha256_file(real)
    return _DIGESTS[key]


def _stat_digest(h: Any, paths: list[Path]) -> None:
    """Feed each path with its size and modification time (or ``missing``) into ``h``."""
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}\tmissing\n".encode())


def files_identity(
    where: Path, files: Sequence[Path], text: bytes | None = None, **counts: int
) -> dict[str, Any]:
    """The identity of a set of files read from one place (a list file, a folder): the
    place's absolute path, ``counts`` (e.g. ``images=120``) and a ``stat-sha256:`` digest of
    ``text`` (a list's bytes, where there is one) plus every file's path, size and
    modification time (``missing`` for one that is not there). The files' bytes are not
    read, so a changed file is seen by its size or time, not its content.

    >>> a = files_identity(Path("/d"), [Path("/d/none.png")], images=1)
    >>> a["path"], a["images"], a["digest"].startswith("stat-sha256:")
    ('/d', 1, True)
    """
    h = hashlib.sha256()
    if text is not None:
        h.update(text)
    _stat_digest(h, list(files))
    return {"path": str(where.resolve()), **counts, "digest": "stat-sha256:" + h.hexdigest()}


def image_domain_digest(spec: Path, cfg: ImageListData) -> dict[str, Any]:
    """The identity of one image domain (a list file or a domain folder): its absolute path,
    the number of images and a digest of the list's text (a folder: of its listing) plus every
    image's path, size and modification time."""
    from eada.data.images import load_image_list

    images = load_image_list(spec, cfg.root, allow_outside=cfg.allow_outside_root)
    text = spec.read_bytes() if spec.is_file() else None
    return files_identity(spec, images.paths, text, images=len(images.paths))


def file_entry(path: Path) -> dict[str, Any]:
    """``{"path", "digest"}`` of one input file: its absolute path and :func:`file_digest`.

    Raises:
        FileNotFoundError: naming the file.
    """
    return {"path": str(path.resolve()), "digest": file_digest(path)}


def data_inputs(data: DataConfig, model: ModelConfig | None = None) -> dict[str, Any]:
    """Every input file of a run's data (and a local weights file): ``{role: {"path",
    "digest", ...}}``; empty for the toy data (generated from the config).

    Raises:
        FileNotFoundError: a feature, label, list, digits or weights file that is not there
            (the message names it).
    """
    out: dict[str, Any] = {}
    if isinstance(data, FeatureData):
        for role in ("source", "target", "heldout"):
            for suffix in ("", "_labels"):
                p = getattr(data, role + suffix)
                if p is not None:
                    out[role + suffix] = file_entry(Path(p))
    elif isinstance(data, DigitsData):
        splits = {"source": data.source_split, "target": data.target_split}
        if data.heldout_split is not None:
            splits["heldout"] = data.heldout_split
        for role, split in splits.items():
            name = getattr(data, "target" if role == "heldout" else role)
            for rel in _DIGIT_FILES[name].get(split, []):
                out[f"{role}:{rel}"] = file_entry(Path(data.root) / rel)
            if name == "mnist_m":  # the image folder: size and time of each image
                folder = Path(data.root) / "mnist_m" / "mnist_m_test"
                files = sorted(folder.iterdir()) if folder.is_dir() else []
                out[f"{role}:mnist_m/mnist_m_test"] = files_identity(
                    folder, files, images=len(files)
                )
    elif isinstance(data, ImageListData):
        for role in ("source", "target", "heldout"):
            spec = getattr(data, role)
            if spec is not None:
                out[role] = image_domain_digest(Path(spec), data)
    if model is not None and model.name == "backbone" and model.weights:
        w = Path(model.weights)
        if not model.weights.startswith("pretrained") and model.weights != "none" and w.is_file():
            out["model.weights"] = file_entry(w)
    return out


# -- data paths that travel to other machines (``eada bench --dask``) ---------------------------
#: the ``data`` keys a run reads its inputs from (not its caches: each worker keeps its own)
INPUT_PATH_KEYS = tuple(k for k in DATA_PATH_KEYS if not k.endswith("cache_dir"))

#: the environment variable of a worker's own prefix rewrites (``OLD=NEW``, ``os.pathsep``
#: between rules, e.g. ``/lab/data=/scratch/data``)
DATA_MAP_ENV = "EADA_DATA_MAP"

DataMap = list[tuple[str, str]]


class DataMapError(ConfigError):
    """A ``--data-map`` rule (or one of ``EADA_DATA_MAP``) that is not ``/OLD=/NEW``."""


class DataNotOnWorkerError(WorkerEnvironmentError):
    """A run's data are not where its worker looks for them: the worker's fault, not the
    run's (the grid runs it elsewhere and gives that worker no more runs of that data set)."""


def input_paths(data: DataConfig) -> dict[str, str]:
    """``{key: absolute path}`` of every input path of a data config, made absolute against
    this process's working folder (where :func:`eada.config.load_config` left a path that a
    config file, named by a relative path, gave relative to its own folder).

    >>> from eada.config import FeatureData
    >>> p = input_paths(FeatureData(source="/d/s.npz", target="t.npz"))
    >>> p["source"], p["target"] == os.path.abspath("t.npz")
    ('/d/s.npz', True)
    """
    if data.kind == "toy":
        return {}
    keys = ("root",) if data.kind == "digits" else INPUT_PATH_KEYS
    out = {}
    for key in keys:
        value = getattr(data, key, None)
        if value is not None:
            out[key] = os.path.abspath(value)
    return out


def parse_data_map(rules: Iterable[str], where: str = "--data-map") -> DataMap:
    """``["/lab/data=/scratch/data", ...]`` -> ``[(old, new), ...]`` (both absolute,
    normalised).

    >>> parse_data_map(["/lab/data/=/scratch/d"])
    [('/lab/data', '/scratch/d')]

    Raises:
        DataMapError: a rule that is not ``/OLD=/NEW`` (named with ``where``).
    """
    out = []
    for rule in rules:
        old, sep, new = rule.partition("=")
        if not sep or not os.path.isabs(old) or not os.path.isabs(new):
            raise DataMapError(
                f"{where} {rule!r}: give OLD=NEW, two absolute paths (the prefix the driver "
                "sees and the one this worker has, e.g. /lab/data=/scratch/data)"
            )
        out.append((os.path.normpath(old), os.path.normpath(new)))
    return out


def map_path(path: str, rules: Sequence[tuple[str, str]]) -> str:
    """``path`` with the prefix of the first rule that holds it rewritten (whole path
    components only); unchanged where no rule applies.

    >>> map_path("/lab/data/a/x.npz", [("/lab/data", "/scratch")])
    '/scratch/a/x.npz'
    >>> map_path("/lab/database/x.npz", [("/lab/data", "/scratch")])
    '/lab/database/x.npz'
    """
    for old, new in rules:
        if path == old:
            return new
        if path.startswith(old.rstrip("/") + "/"):
            return new.rstrip("/") + "/" + path[len(old.rstrip("/")) + 1 :]
    return path


def worker_data_map(driver_rules: Sequence[tuple[str, str]] = ()) -> DataMap:
    """The rules a worker applies, first match wins: its own ``EADA_DATA_MAP``, then its Dask
    config's ``eada.data-map`` (a list of ``OLD=NEW``, e.g. in ``~/.config/dask/eada.yaml``;
    read only inside a Dask worker), then the driver's ``--data-map``."""
    own = [r for r in os.environ.get(DATA_MAP_ENV, "").split(os.pathsep) if r.strip()]
    rules = parse_data_map(own, DATA_MAP_ENV)
    import sys

    if "dask" in sys.modules:  # a Dask worker: its config may name rules too
        import dask

        configured = dask.config.get("eada.data-map", default=None) or []
        if isinstance(configured, str):
            configured = [configured]
        rules += parse_data_map(configured, "the Dask config's eada.data-map")
    return [*rules, *driver_rules]


def place_data(
    data: DataConfig, paths: dict[str, str], driver_rules: Sequence[tuple[str, str]] = ()
) -> tuple[DataConfig, dict[str, dict[str, str]]]:
    """On a worker: ``data`` with the driver's absolute input paths (``paths``, from
    :func:`input_paths`) rewritten by :func:`worker_data_map`, after checking every one is
    there; and ``{key: {"driver", "worker"}}`` for the run's record.

    Raises:
        DataNotOnWorkerError: naming each path missing here, the driver's path it came from
            and how to map it.
    """
    rules = worker_data_map(driver_rules)
    placed = {k: {"driver": p, "worker": map_path(p, rules)} for k, p in paths.items()}
    missing = [(k, v) for k, v in placed.items() if not os.path.exists(v["worker"])]
    if missing:
        what = "; ".join(
            f"data.{k}: {v['worker']}"
            + (f" (mapped from the driver's {v['driver']})" if v["worker"] != v["driver"] else "")
            for k, v in missing
        )
        raise DataNotOnWorkerError(
            f"data not on this worker: {what}; give the worker the data, or map the driver's "
            f"paths to where they are here (--data-map OLD=NEW, or {DATA_MAP_ENV} on the worker)"
        )
    update = {k: Path(v["worker"]) for k, v in placed.items()}
    return data.model_copy(update=update), placed


def clear_cache() -> None:
    """Forget the digests hashed so far (tests)."""
    _DIGESTS.clear()


__all__ = [
    "clear_cache",
    "data_inputs",
    "file_digest",
    "file_entry",
    "files_identity",
    "image_domain_digest",
    "input_paths",
    "map_path",
    "parse_data_map",
    "place_data",
    "worker_data_map",
]
