"""Image transforms of the paper's protocol, with the normalisation of each backbone.

The authors' code (see ``docs/reference-protocol.md``) uses three views of an image:

* ``train`` (source and labeled target): resize to ``resize x resize`` (256), random crop
  ``crop`` (224), colour jitter ``(0.4, 0.4, 0.4, 0.1)``, no flip;
* ``test`` (evaluation): resize to ``resize x resize`` (256), then ``test_resize`` (288), centre
  crop ``crop`` (224);
* ``score`` (the selection pass over the unlabeled pool): resize the SHORTER side to ``resize``
  (256), random crop ``crop`` (224), no jitter. ``scoring_view: test`` scores on the test view
  instead (deterministic).

The authors' code feeds the unlabeled-target training stream that same shorter-side + random
crop view without jitter (``random_crop``; ``data.transforms.unlabeled_view: random_crop``, the
paper configs); ``unlabeled_view: train`` feeds it the train view; ``train_plain`` (also a
``scoring_view``) is the train view without colour jitter (DUC's target view: their unlabeled
and scoring loaders use it).

Each view ends with ``ToTensor`` and the backbone's normalisation: ImageNet mean/std for
torchvision/timm ResNets, ``(255 x - 127) / 128`` for EfficientNet-Lite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from eada.models.normalization import NORMALIZATIONS, Normalization, normalization_for

__all__ = [
    "NORMALIZATIONS",
    "Normalization",
    "TransformSpec",
    "View",
    "build_transform",
    "fixed_size_transform",
    "normalization_for",
    "transform_key",
]

View = Literal["train", "test", "score", "random_crop", "strong", "anchor", "train_plain"]


@dataclass(frozen=True)
class TransformSpec:
    """Sizes and switches of the three views (defaults: the paper's / reference code's)."""

    resize: int = 256
    crop: int = 224
    test_resize: int = 288
    jitter: tuple[float, float, float, float] | None = (0.4, 0.4, 0.4, 0.1)
    hflip: bool = False
    scoring_view: Literal["random_crop", "test", "train_plain"] = "random_crop"
    train_crop: Literal["random", "center", "random_resized"] = "random"

    def __post_init__(self) -> None:
        if self.crop > self.resize:
            raise ValueError(f"crop {self.crop} is larger than resize {self.resize}")
        if self.crop > self.test_resize:
            raise ValueError(f"crop {self.crop} is larger than test_resize {self.test_resize}")


def build_transform(
    view: View, spec: TransformSpec, norm: Normalization
) -> Callable[[Any], torch.Tensor]:
    """The torchvision transform of ``view`` (``train``/``test``/``score``, or ``random_crop``:
    shorter side to ``resize``, random crop, no jitter; ``strong``: resize to
    ``resize x resize``, random flip, random crop, torchvision's
    ``RandAugment(num_ops=2, magnitude=10)``: the views of LADA's CDAC solver, their
    ``RandAugmentMC(2, 10)``; ``anchor``: torchvision's ``RandAugment(num_ops=1,
    magnitude=2)``, shorter side to ``resize``, random flip, random crop: the view LADA's
    RAA/LAA mix their anchors with, their ``RandAugment(1, 2.0)`` on the same 0-30 scale);
    PIL image -> tensor.

    >>> from PIL import Image
    >>> t = build_transform("test", TransformSpec(), normalization_for("resnet50"))
    >>> tuple(t(Image.new("RGB", (300, 200))).shape)
    (3, 224, 224)
    """
    from torchvision import transforms as T

    tail = [T.ToTensor(), T.Normalize(norm.mean, norm.std)]
    if view == "strong":
        return T.Compose(
            [
                T.Resize((spec.resize, spec.resize)),
                T.RandomHorizontalFlip(),
                T.RandomCrop(spec.crop),
                T.RandAugment(num_ops=2, magnitude=10),
                *tail,
            ]
        )
    if view == "anchor":
        return T.Compose(
            [
                T.RandAugment(num_ops=1, magnitude=2),
                T.Resize(spec.resize),
                T.RandomHorizontalFlip(),
                T.RandomCrop(spec.crop),
                *tail,
            ]
        )
    if view in ("train", "train_plain") or (view == "score" and spec.scoring_view == "train_plain"):
        crop = {
            "random": T.RandomCrop,
            "center": T.CenterCrop,
            "random_resized": T.RandomResizedCrop,
        }[spec.train_crop](spec.crop)
        ops: list[Any] = [T.Resize((spec.resize, spec.resize)), crop]
        if spec.hflip:
            ops.append(T.RandomHorizontalFlip())
        if spec.jitter is not None and view == "train":
            ops.append(T.ColorJitter(*spec.jitter))
        return T.Compose(ops + tail)
    if view == "test" or (view == "score" and spec.scoring_view == "test"):
        return T.Compose(
            [
                T.Resize((spec.resize, spec.resize)),
                T.Resize((spec.test_resize, spec.test_resize)),
                T.CenterCrop(spec.crop),
                *tail,
            ]
        )
    if view in ("score", "random_crop"):
        return T.Compose([T.Resize(spec.resize), T.RandomCrop(spec.crop), *tail])
    raise ValueError(
        f"unknown view {view!r}; known: train, test, score, random_crop, strong, anchor, "
        "train_plain"
    )


def fixed_size_transform(image_size: int, channels: int) -> Callable[[Any], torch.Tensor]:
    """The view of images a small model trains on from scratch (the store's image-folder
    projects, the digits convention): resize to ``image_size x image_size`` (bilinear),
    ``ToTensor`` (``[0, 1]``), ``(x - 0.5) / 0.5`` per channel; a PIL image in mode ``L``
    (``channels`` 1) or ``RGB`` (3) -> ``(channels, S, S)``.

    >>> from PIL import Image
    >>> t = fixed_size_transform(32, 1)
    >>> x = t(Image.new("L", (50, 40), color=255))
    >>> tuple(x.shape), float(x.max())
    ((1, 32, 32), 1.0)
    """
    from torchvision import transforms as T

    half = (0.5,) * channels
    return T.Compose([T.Resize((image_size, image_size)), T.ToTensor(), T.Normalize(half, half)])


def transform_key(view: View, spec: TransformSpec, norm: Normalization) -> str:
    """A stable text naming a view exactly (part of the feature-cache key)."""
    return f"{view}|{spec}|{norm}"


@dataclass
class BatchParams:
    """The random part of a view for one batch, drawn on the host: per sample crop corners
    ``(top, left)``, horizontal flips, and colour jitter factors (brightness, contrast,
    saturation, hue; ``None`` where the view has no jitter) with the order the four are
    applied in (a permutation a sample, as ``ColorJitter`` draws it)."""

    top: torch.Tensor
    left: torch.Tensor
    flip: torch.Tensor | None
    factors: torch.Tensor | None  # (B, 4)
    order: torch.Tensor | None  # (B, 4)
    active: tuple[bool, bool, bool, bool] = (True, True, True, True)  # jitter value not 0


def draw_batch_params(
    kind: View,
    spec: TransformSpec,
    heights: torch.Tensor,
    widths: torch.Tensor,
    generator: torch.Generator,
) -> BatchParams:
    """The random part of view ``kind`` for images of the given base sizes (see
    :func:`eada.data.decoded.base_of`): a crop of ``crop x crop`` anywhere in each (the
    ``test`` view: the whole cached image), a flip where ``hflip`` (train view), jitter factors
    where ``jitter`` (train view) drawn as ``ColorJitter`` draws them: brightness, contrast and
    saturation uniform in ``[max(0, 1 - v), 1 + v]``, hue in ``[-v, v]``, in a random order.

    >>> g = torch.Generator().manual_seed(0)
    >>> p = draw_batch_params("train", TransformSpec(), torch.tensor([256]), torch.tensor([256]), g)
    >>> int(p.top) <= 32 and p.factors.shape == (1, 4)
    True
    """
    b = len(heights)
    if kind == "test" or (kind == "score" and spec.scoring_view == "test"):
        zero = torch.zeros(b, dtype=torch.long)
        return BatchParams(zero, zero, None, None, None)
    u = torch.rand(b, 2, generator=generator, dtype=torch.float64)
    top = (u[:, 0] * (heights - spec.crop + 1)).long()
    left = (u[:, 1] * (widths - spec.crop + 1)).long()
    flip = factors = order = None
    if kind == "train" and spec.hflip:
        flip = torch.rand(b, generator=generator) < 0.5
    if kind == "train" and spec.jitter is not None:
        lo = torch.tensor([max(0.0, 1 - v) for v in spec.jitter[:3]] + [-spec.jitter[3]])
        hi = torch.tensor([1 + v for v in spec.jitter[:3]] + [spec.jitter[3]])
        factors = lo + (hi - lo) * torch.rand(b, 4, generator=generator)
        order = torch.argsort(torch.rand(b, 4, generator=generator), dim=1)
        active = tuple(v != 0 for v in spec.jitter)
        return BatchParams(top, left, flip, factors, order, active)  # type: ignore[arg-type]
    return BatchParams(top, left, flip, factors, order)


def _gray(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(-3)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (f * x + (1.0 - f) * other).clamp_(0.0, 1.0)


def _jitter_op(op: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """One of ``ColorJitter``'s four adjustments (torchvision's tensor formulas) with a
    factor per sample ``f`` (``(B, 1, 1, 1)``) on float images in ``[0, 1]``."""
    if op == 0:  # brightness
        return _blend(x, torch.zeros_like(x), f)
    if op == 1:  # contrast: towards the mean grey level of each image
        return _blend(x, _gray(x).mean(dim=(-3, -2, -1), keepdim=True), f)
    if op == 2:  # saturation: towards the grey image
        return _blend(x, _gray(x), f)
    from torchvision.transforms._functional_tensor import _hsv2rgb, _rgb2hsv

    h, s, v = _rgb2hsv(x).unbind(dim=-3)
    h = torch.remainder(h + f.view(-1, 1, 1), 1.0)
    return _hsv2rgb(torch.stack((h, s, v), dim=-3))


def batch_view(
    crops: torch.Tensor, params: BatchParams, norm: Normalization, device: torch.device
) -> torch.Tensor:
    """A batch of uint8 crops ``(B, H, W, 3)`` (already cut by ``params``' corners) as the
    view's float input on ``device``: ``ToTensor`` (``/ 255``), flips, colour jitter (each
    sample's factors in its own order; groups of samples per position and adjustment, so no
    value is read back from the device), then the normalisation. ``(B, 3, H, W)``, contiguous.

    >>> p = BatchParams(torch.zeros(2), torch.zeros(2), None, None, None)
    >>> x = batch_view(torch.full((2, 4, 4, 3), 255, dtype=torch.uint8), p,
    ...                normalization_for("resnet50"), torch.device("cpu"))
    >>> tuple(x.shape), round(float(x[0, 0, 0, 0]), 4)
    ((2, 3, 4, 4), 2.2489)
    """
    x = crops.to(device, non_blocking=True).permute(0, 3, 1, 2).contiguous()
    x = x.to(torch.get_default_dtype()).div(255)
    if params.flip is not None and bool(params.flip.any()):
        idx = torch.nonzero(params.flip).squeeze(1).to(device)
        x.index_copy_(0, idx, x.index_select(0, idx).flip(-1))
    if params.factors is not None and params.order is not None:
        facs = params.factors.to(device, non_blocking=True)
        for pos in range(4):
            for op in range(4):
                if not params.active[op]:  # ColorJitter skips a zero range
                    continue
                rows = torch.nonzero(params.order[:, pos] == op).squeeze(1)
                if len(rows) == 0:
                    continue
                idx = rows.to(device, non_blocking=True)
                f = facs.index_select(0, idx)[:, op].view(-1, 1, 1, 1)
                x.index_copy_(0, idx, _jitter_op(op, x.index_select(0, idx), f))
    mean = torch.as_tensor(norm.mean, dtype=x.dtype, device=device).view(-1, 1, 1)
    std = torch.as_tensor(norm.std, dtype=x.dtype, device=device).view(-1, 1, 1)
    return x.sub_(mean).div_(std)
