"""Turn a data config into domains: source, target (the active pool) and an optional held-out
target split for evaluation."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from eada.config import DataConfig, DigitsData, FeatureData, ImageListData, ModelConfig, ToyData
from eada.data.base import TensorDomain
from eada.data.images import ImageDomain

Domain = TensorDomain | ImageDomain


@dataclass
class Task:
    """The domains of one run."""

    source: Domain
    target: Domain
    heldout: Domain | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. skipped images, feature cache

    def check(self) -> None:
        """Errors that must stop a run before any training: empty or mismatched domains."""
        if len(self.source) == 0:
            raise ValueError(f"source domain {self.source.name!r} is empty")
        if len(self.target) == 0:
            raise ValueError(f"target domain {self.target.name!r} is empty")
        if self.source.num_classes != self.target.num_classes:
            raise ValueError(
                f"source has {self.source.num_classes} classes but target has "
                f"{self.target.num_classes}: the label spaces must match"
            )
        if self.source.classes != self.target.classes:
            raise ValueError(
                "source and target class names differ (same count, different names/order)"
            )
        if self.source.input_shape != self.target.input_shape:
            raise ValueError(
                f"source inputs {self.source.input_shape} and target inputs "
                f"{self.target.input_shape} differ in shape"
            )
        if self.heldout is not None and self.heldout.classes != self.target.classes:
            raise ValueError("held-out target classes differ from the target's")
        self._note_missing_classes()

    def _note_missing_classes(self) -> None:
        """A target without samples of some classes is allowed (common in practice): warn
        once and record the class names in ``notes["target_missing_classes"]`` (results)."""
        if "target_missing_classes" in self.notes:
            return
        y = getattr(self.target, "y", None)
        if y is None:
            return
        y = torch.as_tensor(y).long()
        if len(y) == 0 or bool((y < 0).any()):  # unknown labels: nothing to say
            return
        counts = torch.bincount(y, minlength=self.target.num_classes)
        missing = [self.target.classes[i] for i in range(len(counts)) if int(counts[i]) == 0]
        self.notes["target_missing_classes"] = missing
        if missing:
            warnings.warn(
                f"target {self.target.name!r} has no samples of {len(missing)} of the "
                f"{self.target.num_classes} classes ({', '.join(missing[:10])}"
                f"{' ...' if len(missing) > 10 else ''}): allowed; accuracy counts the classes "
                "it has, and the run records them under data.target_missing_classes",
                UserWarning,
                stacklevel=2,
            )


def load_task(
    cfg: DataConfig, seed: int = 0, model: ModelConfig | None = None, device: str = "cpu"
) -> Task:
    """Build the domains a data config names (the toy data depend on ``seed``).

    Image data with ``model.freeze_backbone`` become in-memory feature domains (extracted once
    on ``device``, cached); without, :class:`~eada.data.images.ImageDomain` datasets."""
    if isinstance(cfg, ToyData):
        from eada.data.toy import make_toy

        src, tgt = make_toy(cfg.n_per_class, cfg.separation, cfg.std, cfg.rotation_deg, seed)
        return Task(src, tgt)
    if isinstance(cfg, DigitsData):
        from eada.data.digits import load_digits

        kw = {"image_size": cfg.image_size, "channels": cfg.channels}
        source = load_digits(cfg.source, cfg.root, split=cfg.source_split, **kw)
        target = load_digits(cfg.target, cfg.root, split=cfg.target_split, **kw)
        heldout = (
            load_digits(cfg.target, cfg.root, split=cfg.heldout_split, **kw)
            if cfg.heldout_split
            else None
        )
        return Task(source, target, heldout)
    if isinstance(cfg, ImageListData):
        from eada.data.image_tasks import load_image_task

        return load_image_task(cfg, model, device)
    if isinstance(cfg, FeatureData):
        from eada.data.image_tasks import load_feature_task

        return load_feature_task(cfg)
    raise TypeError(f"unsupported data config {type(cfg).__name__}")
