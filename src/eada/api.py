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

        >>> m = LoadedModel(nn.Identity(), ["a", "b"], {"train": {"tau": 2.0}})
        >>> m.logits(torch.tensor([[1.0, 3.0]])).tolist()
        [[-2.0, -6.0]]
        """
        return -self.tau * self.energies(x, normalized=normalized)

    def probabilities(self, x: Any, normalized: bool = False) -> torch.Tensor:
        """Class probabilities ``softmax(-tau E)`` ``(B, C)``, rows summing to 1 (what
        ``model.onnx`` outputs as ``probabilities``).

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
    meta = json.loads(meta_file.read_text())
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


__all__ = [
    "LoadedModel",
    "accuracy_estimate",
    "audit",
    "create_project",
    "import_labels",
    "load_model",
    "open_project",
    "query",
]
