"""How a training step runs the model over its batches: ``separate`` or ``fused`` passes.

A step of EADA sees up to three batches: source, unlabeled target and labeled target.

* ``separate`` (the reference code): one forward pass per batch, so every batch-norm layer
  normalises each stream with that stream's own batch statistics.
* ``fused``: ONE forward pass over the concatenated batches. Convolutions and matrix products
  then run once over a batch three times larger (fewer kernel launches, better arithmetic
  intensity). To keep the maths of ``separate``, every batch-norm layer becomes
  *domain-specific within the pass*: it normalises the rows of each stream with that stream's
  batch statistics and updates its running statistics once per stream, in the same order as
  the separate passes (:func:`segment_batchnorm`). Layers that mix samples in other ways
  (none in the shipped models) would see the concatenated batch.

:class:`StepForward` is the module the trainer calls (and wraps in DDP when distributed): it
takes the list of batches and returns the list of energies, so a step is one DDP forward call
whichever mode runs inside.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    >>> step = StepForward(net, "fused")
    >>> outs = step([torch.randn(5, 4), torch.randn(6, 4)])
    >>> [tuple(o.shape) for o in outs]
    [(5, 3), (6, 3)]
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

ForwardMode = Literal["separate", "fused"]


class _SegmentedBatchNorm:
    """Mixin over a batch-norm class: with ``segments`` set (training mode), normalise each
    consecutive block of rows on its own and concatenate, else behave as the base class."""

    segments: list[int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batch norm per segment of rows (training with ``segments``), plain otherwise."""
        base_forward = super().forward  # type: ignore[misc]
        segs = self.segments
        if segs is None or len(segs) == 1 or not self.training:  # type: ignore[attr-defined]
            return base_forward(x)
        return torch.cat([base_forward(part) for part in x.split(segs)])


_SEGMENTED_CLASSES: dict[type, type] = {}


def segment_batchnorm(model: nn.Module) -> list[nn.Module]:
    """Make every batch-norm layer of ``model`` able to normalise row segments separately.

    The layers are changed in place (their class becomes a subclass of the original with a
    ``segments`` attribute), so parameters, buffers, state-dict keys and the optimiser's
    references stay the same. Idempotent. Returns the converted layers.
    """
    layers: list[nn.Module] = []
    for m in model.modules():
        if not isinstance(m, _BatchNorm):
            continue
        if not isinstance(m, _SegmentedBatchNorm):
            cls = type(m)
            seg_cls = _SEGMENTED_CLASSES.get(cls)
            if seg_cls is None:
                seg_cls = type(f"Segmented{cls.__name__}", (_SegmentedBatchNorm, cls), {})
                _SEGMENTED_CLASSES[cls] = seg_cls
            m.__class__ = seg_cls
        layers.append(m)
    return layers


class StepForward(nn.Module):
    """The model applied to a training step's batches.

    Args:
        model: the energy network (``(B, ...) -> (B, C)`` energies).
        mode: ``separate`` (one pass per batch) or ``fused`` (one pass, per-stream batch norm).
        autocast_dtype: run the passes under ``torch.autocast`` with this dtype (e.g.
            ``torch.bfloat16`` on CUDA); ``None`` for full precision.
        channels_last: convert 4-d inputs to the channels-last memory format (use with a model
            converted the same way; faster convolutions on recent GPUs).

    ``forward(xs)`` takes the list of input batches (already on the model's device) and returns
    their float32 energies in the same order.
    """

    def __init__(
        self,
        model: nn.Module,
        mode: ForwardMode = "separate",
        autocast_dtype: torch.dtype | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        if mode not in ("separate", "fused"):
            raise ValueError(f"forward mode must be 'separate' or 'fused', got {mode!r}")
        self.model = model
        self.mode = mode
        self.autocast_dtype = autocast_dtype
        self.channels_last = channels_last
        self._bn = segment_batchnorm(model) if mode == "fused" else []

    def _prep(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Energies (float32) of every batch in ``xs``."""
        if not xs:
            return []
        dev_type = xs[0].device.type
        amp = self.autocast_dtype is not None
        with torch.autocast(dev_type, dtype=self.autocast_dtype or torch.float32, enabled=amp):
            if self.mode == "separate" or len(xs) == 1:
                return [self.model(self._prep(x)).float() for x in xs]
            sizes = [len(x) for x in xs]
            for layer in self._bn:
                layer.segments = sizes  # type: ignore[assignment]
            try:
                out = self.model(self._prep(torch.cat(xs))).float()
            finally:
                for layer in self._bn:
                    layer.segments = None  # type: ignore[assignment]
            return list(out.split(sizes))

    def extra_repr(self) -> str:
        """``mode=..., autocast=..., channels_last=...``."""
        return (
            f"mode={self.mode}, autocast={self.autocast_dtype}, channels_last={self.channels_last}"
        )
