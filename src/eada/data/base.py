"""In-memory domains: the common currency of the data layer.

A :class:`TensorDomain` holds model-ready inputs and integer labels of one domain (source or
target). Small data sets (the toy example, digits, feature matrices) live entirely in memory
as tensors, which keeps the training loop free of per-sample Python overhead on a CPU.
A :data:`Domain` is one of them or an :class:`~eada.data.datasets.ImageDomain` (decoded per
sample); a :class:`Task` holds the domains of one run (:func:`eada.data.tasks.load_task` builds
it from a data config).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from eada.data.datasets import ImageDomain


@dataclass
class TensorDomain(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One domain as tensors.

    Attributes:
        name: a human-readable name, e.g. ``"mnist"``.
        x: model-ready inputs, ``float32`` of shape ``(N, ...)``.
        y: integer class ids of shape ``(N,)`` (``int64``), in ``[0, len(classes))``.
        classes: class names; their order defines the class ids.
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    classes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"domain {self.name!r}: {self.x.shape[0]} inputs but {self.y.shape[0]} labels"
            )
        if self.y.dtype != torch.int64:
            self.y = self.y.long()
        if not self.classes:
            n = int(self.y.max().item()) + 1 if len(self.y) else 0
            self.classes = [str(i) for i in range(n)]
        if len(self.y) and (int(self.y.min()) < 0 or int(self.y.max()) >= len(self.classes)):
            raise ValueError(
                f"domain {self.name!r}: label ids must lie in [0, {len(self.classes)}), "
                f"found [{int(self.y.min())}, {int(self.y.max())}]"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    @property
    def num_classes(self) -> int:
        """Number of classes of the domain's label space."""
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input (without the batch dimension)."""
        return tuple(self.x.shape[1:])

    def view(self, kind: str) -> TensorDomain:
        """The domain as seen by a pass of ``kind`` (``train``/``test``/``score``): in-memory
        inputs have no views, so itself (image domains apply another transform)."""
        return self

    def subset(self, indices: torch.Tensor, name: str | None = None) -> TensorDomain:
        """A new domain holding only ``indices`` (same class map)."""
        return TensorDomain(name or self.name, self.x[indices], self.y[indices], list(self.classes))


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
