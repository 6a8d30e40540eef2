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
