"""Confusion matrix, per-class IoU and mIoU (the Cityscapes benchmark's definitions).

``IoU_c = TP_c / (TP_c + FP_c + FN_c)`` from the confusion matrix ``M`` (rows = ground truth,
columns = prediction): ``TP_c = M[c, c]``, ``FP_c = sum_r M[r, c] - TP_c``,
``FN_c = sum_k M[c, k] - TP_c``. Pixels labeled ``ignore_index`` are not counted. A class that
appears neither in the ground truth nor in the predictions has no IoU (NaN) and is left out of the
mean, as AdaptSegNet's ``compute_mIoU`` (``nanmean``) does.

Example:
    >>> import torch
    >>> cm = ConfusionMatrix(2)
    >>> cm.update(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 255]))
    >>> cm.per_class_iou().tolist()  # class 0: 1/(1+0+1); class 1: 1/(1+1+0)
    [0.5, 0.5]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from eada.segmentation.data import IGNORE_INDEX


def confusion_matrix(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``(C, C)`` int64 counts, ``M[t, p]`` = pixels of true class ``t`` predicted ``p``.

    Raises:
        ValueError: shapes differ, or a label / prediction outside ``0..C-1`` (other than
            ``ignore_index`` in the labels).
    """
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and label {tuple(target.shape)} differ")
    p = pred.reshape(-1).long()
    t = target.reshape(-1).long()
    keep = t != ignore_index
    p, t = p[keep], t[keep]
    if len(t) and (t.min() < 0 or t.max() >= num_classes):
        raise ValueError(f"labels outside 0..{num_classes - 1} (and ignore {ignore_index})")
    if len(p) and (p.min() < 0 or p.max() >= num_classes):
        raise ValueError(f"predictions outside 0..{num_classes - 1}")
    return torch.bincount(t * num_classes + p, minlength=num_classes**2).reshape(
        num_classes, num_classes
    )


class ConfusionMatrix:
    """Accumulates a confusion matrix over batches; reports IoU, mIoU and pixel accuracy."""

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
        if num_classes < 2:
            raise ValueError(f"need at least 2 classes, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch of predicted and true class maps (any matching shapes)."""
        self.matrix += confusion_matrix(
            pred.cpu(), target.cpu(), self.num_classes, self.ignore_index
        )

    def per_class_iou(self) -> np.ndarray:
        """``(C,)`` IoU per class; NaN where the class is in neither labels nor predictions."""
        m = self.matrix.double()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
        return iou.numpy()

    def miou(self) -> float:
        """Mean IoU over the classes that have one (on the 0..1 scale)."""
        iou = self.per_class_iou()
        return float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan")

    def pixel_accuracy(self) -> float:
        """Share of counted pixels predicted correctly."""
        total = int(self.matrix.sum())
        return float(self.matrix.diag().sum()) / total if total else float("nan")

    def summary(self, class_names: Sequence[str] | None = None) -> dict[str, Any]:
        """``{"miou", "pixel_accuracy", "per_class_iou": {name: iou}}`` in PERCENT."""
        names = list(class_names) if class_names else [str(c) for c in range(self.num_classes)]
        if len(names) != self.num_classes:
            raise ValueError(f"{len(names)} class names for {self.num_classes} classes")
        iou = self.per_class_iou()
        return {
            "miou": 100 * self.miou(),
            "pixel_accuracy": 100 * self.pixel_accuracy(),
            "per_class_iou": {n: float(100 * v) for n, v in zip(names, iou, strict=True)},
            "pixels": int(self.matrix.sum()),
        }
