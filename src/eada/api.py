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

import torch
from torch import nn


@dataclass
class LoadedModel:
    """An exported model ready to predict.

    Attributes:
        net: maps model-ready inputs to energies ``(B, C)`` (for image models: normalised
            image tensors; a frozen backbone is included in front of the head).
        classes: class names by output index.
        config: the project's resolved config (a dict).
        transform: for image models, the test view (PIL image -> tensor); else ``None``.
    """

    net: nn.Module
    classes: list[str]
    config: dict[str, Any]
    transform: Callable[[Any], torch.Tensor] | None = None

    @torch.no_grad()
    def energies(self, x: torch.Tensor, normalized: bool = False) -> torch.Tensor:
        """Energies ``E(x, y)`` of a batch (lower = more likely); a NumPy array is taken too.

        Feature models trained with ``data.normalize``: ``l2`` is a per-row operation and is
        applied here to raw rows. ``zscore`` / ``l1_zscore`` use a whole domain's statistics,
        which one batch does not have: pass rows normalised that way over their whole domain
        (:func:`eada.data.features.normalize_features`) and ``normalized=True``; raw rows are
        refused rather than silently mispredicted.
        """
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(x, dtype=torch.float32)
        how = self.config.get("data", {}).get("normalize", "none")
        if self.transform is None and not normalized and how != "none":
            if how == "l2":
                x = torch.nn.functional.normalize(x.float(), dim=1)
            else:
                raise ValueError(
                    f"this model was trained on features normalised with data.normalize={how!r} "
                    "over each whole domain: normalise the rows the same way "
                    "(eada.data.features.normalize_features over their domain) and pass "
                    "normalized=True"
                )
        self.net.eval()
        out: torch.Tensor = self.net(x)
        return out

    def predict(self, x: torch.Tensor, normalized: bool = False) -> tuple[list[str], torch.Tensor]:
        """Predicted class names and their probabilities ``softmax(-tau E)``.

        ``normalized``: as in :meth:`energies` (feature rows already normalised as in training).
        """
        tau = float(self.config.get("train", {}).get("tau", 1.0))
        p = torch.softmax(-tau * self.energies(x, normalized=normalized), dim=1)
        score, idx = p.max(dim=1)
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
    from eada.models.factory import build_model
    from eada.store.config import build_config

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
    images = cfg.data.kind == "images"
    model_cfg = cfg.model
    if images and not model_cfg.freeze_backbone:  # every weight comes from model.pt
        model_cfg = model_cfg.model_copy(update={"weights": None})
    net: nn.Module = build_model(model_cfg, tuple(meta["input_shape"]), len(classes))
    net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    transform = None
    if images:
        from eada.data.image_tasks import backbone_normalization, transform_spec
        from eada.data.transforms import build_transform

        data: Any = cfg.data
        norm = backbone_normalization(cfg.model, data.transforms.normalization)
        if cfg.model.freeze_backbone:
            from eada.models.backbones import build_backbone

            bb = build_backbone(
                cfg.model.backbone,
                cfg.model.weights,
                cfg.model.factory,
                data.transforms.normalization,
            )
            norm = bb.normalization
            net = nn.Sequential(bb.module, net)
        transform = build_transform("test", transform_spec(data), norm)
    net.eval()
    return LoadedModel(net, classes, meta["config"], transform)


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
