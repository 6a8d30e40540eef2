"""The Python API for notebooks: load an exported model, open a project, query, import labels
from records or a DataFrame.

Example (one annotation round; ``proj`` made with ``eada init``)::

    import eada
    proj = eada.open_project("proj")
    proj.train()                                   # up to the first planned round
    batch = eada.query(proj)                       # dicts: sample_id, path, predicted, score
    check = eada.audit(proj, 20)                   # uniformly random: an accuracy estimate
    labels = [{"sample_id": b["sample_id"], "label": my_label(b["path"])} for b in batch]
    eada.import_labels(proj, labels, annotator="me")   # or a pandas DataFrame
    proj.train()
    proj.export("final")
    model = eada.load_model("final")
    model.predict_files(["photo.jpg"])             # [{"path", "predicted", "score"}]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass
class LoadedModel:
    """An exported model ready to predict.

    Warning:
        ``net`` returns ENERGIES ``E(x, y)``, not logits: lower = more likely, so the predicted
        class is ``argmin``, and ``argmax`` of ``net(x)`` picks the LEAST likely class. Use
        :meth:`predict`, :meth:`probabilities` (``softmax(-tau E)``) or :meth:`logits`
        (``-tau E``, where ``argmax`` and ``softmax`` mean what they usually do).

    Attributes:
        net: maps model-ready inputs to energies ``(B, C)`` (for image models: normalised
            image tensors; a frozen backbone is included in front of the head).
        classes: class names by output index.
        config: the project's resolved config (a dict).
        transform: for image models, the test view (PIL image -> tensor); else ``None``.
        feature_statistics: for feature models, the target domain's normalisation
            (``{"normalize", "mean", "std"}``, from ``model.json``): raw rows are normalised
            with it; ``None`` for exports that predate it.
    """

    net: nn.Module
    classes: list[str]
    config: dict[str, Any]
    transform: Callable[[Any], torch.Tensor] | None = None
    feature_statistics: dict[str, Any] | None = None

    @property
    def tau(self) -> float:
        """The temperature of ``softmax(-tau E)`` (``train.tau``)."""
        return float(self.config.get("train", {}).get("tau", 1.0))

    @torch.no_grad()
    def energies(self, x: Any, normalized: bool = False) -> torch.Tensor:
        """Energies ``E(x, y)`` of a batch (lower = more likely); a NumPy array is taken too.

        Feature models trained with ``data.normalize``: ``l2`` is a per-row operation and is
        applied here to raw rows; ``zscore`` / ``l1_zscore`` use a whole domain's statistics:
        the target domain's, which ``model.json`` records (:attr:`feature_statistics`), are
        applied to raw rows. Rows already normalised: ``normalized=True``. An export without
        the statistics refuses raw rows rather than silently mispredicting them.
        """
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
        how = self.config.get("data", {}).get("normalize", "none")
        if self.transform is None and not normalized and how != "none":
            stats = self.feature_statistics
            if how == "l2":
                x = torch.nn.functional.normalize(x.float(), dim=1)
            elif stats is not None and "mean" in stats:
                from eada.models.deploy import FeatureInput

                x = FeatureInput(how, stats)(x.float())
            else:
                raise ValueError(
                    f"this model was trained on features normalised with data.normalize={how!r} "
                    "over each whole domain and its export has no statistics: normalise the "
                    "rows the same way (eada.data.features.normalize_features over their "
                    "domain) and pass normalized=True, or export the model again"
                )
        self.net.eval()
        out: torch.Tensor = self.net(x)
        return out

    def logits(self, x: Any, normalized: bool = False) -> torch.Tensor:
        """Logits ``-tau E(x, y)`` (higher = more likely): ``argmax`` is the prediction and
        ``softmax`` the probabilities, as for an ordinary classifier.

        ``normalized``: as in :meth:`energies`.

        Example:
            >>> m = LoadedModel(nn.Identity(), ["a", "b"], {"train": {"tau": 2.0}})
            >>> m.logits(torch.tensor([[1.0, 3.0]])).tolist()
            [[-2.0, -6.0]]
        """
        return -self.tau * self.energies(x, normalized=normalized)

    def probabilities(self, x: Any, normalized: bool = False) -> torch.Tensor:
        """Class probabilities ``softmax(-tau E)`` ``(B, C)``, rows summing to 1 (what
        ``model.onnx`` outputs as ``probabilities``).

        Example:
            >>> m = LoadedModel(nn.Identity(), ["a", "b"], {"train": {"tau": 1.0}})
            >>> m.probabilities(torch.tensor([[0.0, 0.0]])).tolist()
            [[0.5, 0.5]]
        """
        return torch.softmax(self.logits(x, normalized=normalized), dim=1)

    def predict(self, x: Any, normalized: bool = False) -> tuple[list[str], torch.Tensor]:
        """Predicted class names and their probabilities ``softmax(-tau E)``.

        ``normalized``: as in :meth:`energies` (feature rows already normalised as in training).
        """
        score, idx = self.probabilities(x, normalized=normalized).max(dim=1)
        return [self.classes[int(i)] for i in idx], score

    def predict_files(self, paths: Sequence[str | Path]) -> list[dict[str, Any]]:
        """Predict image files: ``[{"path", "predicted", "score"}]`` (image models only)."""
        from PIL import Image

        if self.transform is None:
            raise ValueError("this model takes feature rows, not image files: use predict(x)")
        tensors = []
        for p in paths:
            with Image.open(p) as im:
                tensors.append(self.transform(im.convert("RGB")))
        names, score = self.predict(torch.stack(tensors))
        return [
            {"path": str(p), "predicted": n, "score": float(s)}
            for p, n, s in zip(paths, names, score, strict=True)
        ]


def load_model(path: str | Path) -> LoadedModel:
    """Load what ``eada export`` wrote (``model.pt`` + ``model.json``) in one call.

    Args:
        path: the export folder, or its ``model.json``.

    Raises:
        FileNotFoundError: no ``model.json``/``model.pt`` there.
        ValueError: ``model.pt`` does not match the SHA-256 in ``model.json``.
    """
    from eada.store.config import build_config
    from eada.store.exports import inference_path

    folder = Path(path)
    if folder.name == "model.json":
        folder = folder.parent
    meta_file, weights = folder / "model.json", folder / "model.pt"
    for f in (meta_file, weights):
        if not f.is_file():
            raise FileNotFoundError(f"no exported model at {folder}: {f.name} missing")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{meta_file}: not valid JSON ({err}); export the model again") from None
    missing = [
        k for k in ("sha256", "classes", "config") if not isinstance(meta, dict) or k not in meta
    ]
    if missing:
        raise ValueError(f"{meta_file}: no {', '.join(missing)}; export the model again")
    if hashlib.sha256(weights.read_bytes()).hexdigest() != meta["sha256"]:
        raise ValueError(f"{weights} does not match the SHA-256 recorded in {meta_file}")
    if "input_shape" not in meta:
        raise ValueError(f"{meta_file} predates eada.load_model (no input_shape); export again")
    cfg = build_config(meta["config"], str(meta_file))
    classes = list(meta["classes"])
    state = torch.load(weights, map_location="cpu", weights_only=True)
    stats = meta.get("feature_statistics")
    path_ = inference_path(cfg, len(classes), tuple(meta["input_shape"]), state, stats)
    return LoadedModel(path_.net.eval(), classes, meta["config"], path_.transform, stats)


def create_project(
    folder: str | Path,
    config: str | Path,
    overrides: Sequence[str] = (),
    progress: bool = True,
    allow_roots: Sequence[str | Path] = (),
) -> Any:
    """``eada init --store FOLDER --config CONFIG [--set k=v ...] [--allow-root DIR ...]``:
    register the data of a project config (with its optional ``store:`` section) and return
    the project. ``progress`` prints the feature-extraction lines; ``allow_roots`` are folders
    outside the config's data folders that its files may resolve into."""
    from eada.store import init_project
    from eada.store.config import load_project_config

    cfg, options = load_project_config(config, list(overrides))
    roots = [Path(r) for r in allow_roots]
    return init_project(folder, cfg, roots, options, progress=print if progress else None)


def open_project(folder: str | Path) -> Any:
    """An existing project store (:class:`eada.store.Project`): ``train()``, ``query()``,
    ``status()``, ``export(out)``."""
    from eada.store import Project

    return Project(folder)


def query(project: Any, budget: int | None = None) -> list[dict[str, Any]]:
    """Select the next round (or return the batch still awaiting labels): one dict a sample
    with ``sample_id``, ``path``, ``external_id``, ``predicted``, ``score`` and the
    strategy's scores, best first (also written to ``exports/`` as for ``eada query``)."""
    out = project.query(budget=budget)
    doc = json.loads(Path(out["files"]["json"]).read_text())
    answer = ("label", "annotator", "skip")
    return [{k: v for k, v in s.items() if k not in answer} for s in doc["samples"]]


def audit(project: Any, n: int) -> list[dict[str, Any]]:
    """``eada query --audit N``: draw ``n`` samples uniformly at random from the unlabeled
    pool (an audit round, outside the schedule; its labels are never trained on) and return
    them as :func:`query` does. Once labeled (:func:`import_labels`),
    :func:`accuracy_estimate` gives the unbiased accuracy estimate of the model that
    predicted them."""
    out = project.audit(n)
    doc = json.loads(Path(out["files"]["json"]).read_text())
    return [{k: v for k, v in s.items() if k not in ("label", "annotator")} for s in doc["samples"]]


def accuracy_estimate(project: Any) -> dict[str, Any] | None:
    """The latest audit round's estimate (``None`` while no audit sample is labeled): the
    model it is for (``model``: epoch, target labels it trained on, checkpoint file), the
    ``pool`` it was drawn from, ``labeled``/``predicted_right``, ``accuracy`` in % and its
    95 % Wilson interval ``ci95`` (``eada status --json``, key ``audit``)."""
    latest: dict[str, Any] | None = project.status()["audit"]["latest"]
    return latest


def import_labels(
    project: Any,
    labels: Any,
    annotator: str = "notebook",
    allow_unqueried: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """Import labels from records (dicts with ``label`` and ``sample_id`` and/or ``path``,
    optional ``annotator``) or a pandas DataFrame with those columns. A record with ``skip``
    (a reason) instead of ``label`` marks the sample unusable: it leaves the pool and counts
    as answered; a later label undoes it. Validated like a file import: all problems listed,
    nothing written unless all rows are valid. An answer contradicting another annotator's
    label in force opens a dispute under ``store.conflicts: refuse`` (listed by
    ``project.status()``; the label in force stays) unless ``force=True`` (the newest wins)."""
    records: Iterable[Any]
    if hasattr(labels, "to_dict") and hasattr(labels, "columns"):  # a DataFrame
        records = labels.to_dict("records")
    else:
        records = labels
    return project.import_records(list(records), annotator, allow_unqueried, force)


# -- experiments: what `eada run` and `eada bench` do, from Python ------------------------------
def seed_list(seeds: int | str | Sequence[int]) -> list[int]:
    """Seeds as ``eada run --seeds`` takes them: ``3`` is seed 3, ``"0-2"`` or ``"0,1,2"`` or
    ``[0, 1, 2]`` are three.

    >>> seed_list("0-2"), seed_list(4), seed_list([1, 3])
    ([0, 1, 2], [4], [1, 3])
    """
    from eada.runs import parse_seeds

    if isinstance(seeds, bool):
        raise TypeError(f"seeds must be an int, a '0-2' string or a list of ints, got {seeds!r}")
    if isinstance(seeds, int):
        return [seeds]
    if isinstance(seeds, str):
        return parse_seeds(seeds)
    out = [int(s) for s in seeds]
    if not out:
        raise ValueError("seeds is empty")
    return out


def run(
    config_or_preset: str | Path,
    method: str | None = None,
    seeds: int | str | Sequence[int] = 0,
    overrides: Sequence[str] | dict[str, Any] | None = None,
    out: str | Path | None = None,
    plugins: Sequence[str | Path] = (),
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """``eada run`` from Python: train a preset or a YAML config over seeds; returns the
    runs' records (one a seed, as ``OUT/runs.jsonl`` holds them; ``OUT/results.json`` holds
    the summary). Resumes like the command: seeds already in ``out`` are not run again.

    Args:
        config_or_preset: a preset name (``eada presets``) or a YAML config file.
        method: a method (``eada run --method``), a plugin's included.
        seeds: ``0``, ``"0-2"``, ``[0, 1, 2]``.
        overrides: ``["train.epochs=3", ...]`` or ``{"train.epochs": 3, ...}`` (``--set``).
        out: output folder (default ``runs/<name>[_<method>]``, as the command).
        plugins: plugin files or modules to import first (``--plugin``).
        progress: receives the progress lines (default: none).

    Example::

        import eada
        records = eada.run("toy", method="random", seeds="0-1", out="runs/toy_random",
                           overrides={"train.epochs": 3, "active.rounds_at": [1, 2]})
        eada.results("runs/toy_random")          # a DataFrame, one row a seed
    """
    from eada.experiment import resolve_config, run_seeds
    from eada.plugins import load_plugins
    from eada.runs import check_not_store, read_jsonl

    load_plugins(plugins)
    sets = _override_list(overrides)
    wanted = seed_list(seeds)
    configs = {s: resolve_config(config_or_preset, method, s, sets) for s in wanted}
    first = configs[wanted[0]]
    default = first.name.replace("/", "_") + (f"_{method}" if method else "")
    folder = Path(out) if out is not None else Path("runs") / default
    check_not_store(folder)
    run_seeds(lambda s: configs[s], wanted, folder, progress=progress)
    return [r for r in read_jsonl(folder / "runs.jsonl") if r.get("seed") in wanted]


def _override_list(overrides: Sequence[str] | dict[str, Any] | None) -> list[str]:
    """``--set`` items from a list of ``key=value`` strings or a ``{key: value}`` dict (values
    written as YAML, so lists and numbers keep their type)."""
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: give a list of 'key=value' strings or a dict, not a string")
    return [str(o) for o in overrides]


RESULT_COLUMNS = (
    "task",
    "method",
    "variant",
    "seed",
    "strategy",
    "status",
    "target/accuracy",
    "target_unlabeled/accuracy",
    "heldout/accuracy",
    "n_labeled",
    "seconds",
    "plugins",
)
"""The first columns of :func:`results` (then every other final metric, then ``time_utc``,
``config_sha`` and the worker's address)."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed (the message says which extra brings it)."""


def results(path: str | Path, unfinished: bool = False) -> Any:
    """The runs of a ``runs.jsonl`` (of ``eada bench``, ``eada run`` or :func:`run`; a folder
    holding one, or the file itself, ``.xz`` too) as a pandas DataFrame, one row a run:
    task, method, sweep variant, seed, strategy, the final accuracies (last epoch, %),
    labeled count, seconds, the plugins it used (``module package version`` or
    ``file sha256:...``, ``;``-separated), time, config hash and worker.

    Args:
        path: a folder with ``runs.jsonl`` or the file.
        unfinished: also the failed and lost runs' lines (``status`` says which).

    Raises:
        MissingExtraError: pandas is not installed (``pip install 'eada[dataframe]'``).
        FileNotFoundError: no ``runs.jsonl`` there.

    Example::

        df = eada.results("runs/bench")
        df.groupby(["task", "method"])["target/accuracy"].agg(["mean", "std"])
    """
    try:
        import pandas as pd
    except ImportError as err:
        raise MissingExtraError(
            "eada.results needs pandas, which is not installed: pip install 'eada[dataframe]'"
        ) from err
    from eada.runs import read_jsonl

    p = Path(path)
    log = p
    if p.is_dir():
        log = p / "runs.jsonl"
        if not log.exists() and (p / "runs.jsonl.xz").exists():
            log = p / "runs.jsonl.xz"
    if not log.exists():
        raise FileNotFoundError(f"no runs.jsonl at {path}")
    rows = [_result_row(r) for r in read_jsonl(log, unfinished=unfinished)]
    columns = list(RESULT_COLUMNS)
    extra = sorted({k for r in rows for k in r} - set(columns))
    return pd.DataFrame(rows, columns=[*columns, *extra])


def _result_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One row of :func:`results` from a record of ``eada bench`` or of ``eada run``."""
    plugins = "; ".join(
        " ".join(x for x in (p.get("module"), p.get("package"), p.get("version")) if x)
        if p.get("package")
        else f"{p.get('module')} sha256:{str(p.get('sha256'))[:12]}"
        for p in rec.get("plugins") or []
    )
    if "key" in rec:  # eada bench
        final = rec.get("final") or {}
        row = {
            "task": rec["task"],
            "method": rec["method"],
            "variant": ", ".join(rec.get("variant") or []),
            "seed": rec["seed"],
            "strategy": rec.get("strategy"),
            "status": rec.get("status", "ok"),
            **final,
            "n_labeled": rec.get("n_labeled"),
            "seconds": rec.get("seconds"),
            "worker": (rec.get("worker") or {}).get("address"),
        }
    else:  # eada run: the seed's whole results
        cfg = rec.get("config", {})
        res = rec.get("results", {})
        last = res.get("final", {}).get("last_epoch", {})
        row = {
            "task": cfg.get("name"),
            "method": None,
            "variant": "",
            "seed": rec.get("seed"),
            "strategy": cfg.get("active", {}).get("strategy"),
            "status": "ok",
            **{
                f"{split}/{k}": last[split][k]
                for split in ("target", "target_unlabeled", "heldout")
                if split in last
                for k in ("accuracy", "mean_class_accuracy")
                if k in last[split]
            },
            "n_labeled": len(res.get("labeled_indices", [])),
            "seconds": res.get("seconds"),
        }
    row["plugins"] = plugins
    row["time_utc"] = rec.get("time_utc") or (rec.get("meta") or {}).get("time_utc")
    row["config_sha"] = rec.get("config_sha")
    return row


__all__ = [
    "LoadedModel",
    "MissingExtraError",
    "accuracy_estimate",
    "audit",
    "create_project",
    "import_labels",
    "load_model",
    "open_project",
    "query",
    "results",
    "run",
]
