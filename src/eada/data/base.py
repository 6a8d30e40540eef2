"""In-memory domains: the common currency of the data layer.

A :class:`TensorDomain` holds model-ready inputs and integer labels of one domain (source or
target). Small data sets (the toy example, digits, feature matrices) live entirely in memory
as tensors, which keeps the training loop free of per-sample Python overhead on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset


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
