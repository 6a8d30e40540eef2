"""The input normalisation of each backbone (what its pretrained weights expect).

ImageNet mean/std for torchvision/timm ResNets, ``(255 x - 127) / 128`` for EfficientNet-Lite,
``(x - 0.5) / 0.5`` for timm's "inception" style models. The image transforms
(:mod:`eada.data.transforms`) end with the normalisation of the backbone they feed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Normalization:
    """Per-channel ``(x - mean) / std`` on ``[0, 1]`` pixels (what ``ToTensor`` gives)."""

    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


NORMALIZATIONS: dict[str, Normalization] = {
    "imagenet": Normalization("imagenet", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    # EfficientNet-Lite: (p - 127) / 128 on 0-255 pixels == (x - 127/255) / (128/255) on [0, 1]
    "efficientnet_lite": Normalization("efficientnet_lite", (127 / 255,) * 3, (128 / 255,) * 3),
    # timm "inception" style models: (x - 0.5) / 0.5
    "inception": Normalization("inception", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "none": Normalization("none", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
}


def normalization_for(backbone: str | None, name: str = "auto") -> Normalization:
    """The normalisation ``name`` names, or (``auto``) the one ``backbone`` was trained with.

    >>> normalization_for("efficientnet_lite0").name
    'efficientnet_lite'
    >>> normalization_for("resnet50").name
    'imagenet'
    """
    if name != "auto":
        if name not in NORMALIZATIONS:
            raise ValueError(
                f"unknown normalization {name!r}; known: auto, {', '.join(NORMALIZATIONS)}"
            )
        return NORMALIZATIONS[name]
    if backbone and "efficientnet_lite" in backbone.replace("-", "_"):
        return NORMALIZATIONS["efficientnet_lite"]
    return NORMALIZATIONS["imagenet"]
