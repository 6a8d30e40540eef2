"""The small LeNet used for the digit tasks in the domain-adaptation literature (ADDA, DANN).

``conv(in, 32, 5) -> ReLU -> maxpool 2 -> conv(32, 48, 5) -> ReLU -> maxpool 2 -> flatten
-> Linear(-> 100) -> ReLU -> Linear(100, 100) -> ReLU``: a 100-d feature, no dropout.
"""

from __future__ import annotations

from torch import nn

from eada.models.base import EnergyNet

__all__ = ["LENET_FEATURE_DIM", "lenet", "lenet_backbone"]

LENET_FEATURE_DIM: int = 100
"""Size of the LeNet backbone's output features."""

_MIN_IMAGE_SIZE = 20


def _spatial_after_convs(image_size: int) -> int:
    """Side length after the two ``conv5 -> maxpool2`` stages (no padding, floor pooling)."""
    s = (image_size - 4) // 2
    return (s - 4) // 2


def lenet_backbone(in_channels: int = 1, image_size: int = 28) -> tuple[nn.Module, int]:
    """The LeNet feature extractor.

    Args:
        in_channels: number of input channels (1 for grey, 3 for RGB).
        image_size: side length of the (square) inputs; at least 20.

    Returns:
        ``(backbone, feature_dim)``: a module mapping ``(B, in_channels, image_size,
        image_size)`` to ``(B, 100)``, and ``100``.

    Raises:
        ValueError: ``in_channels < 1`` or ``image_size < 20``.
    """
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if image_size < _MIN_IMAGE_SIZE:
        raise ValueError(
            f"LeNet needs image_size >= {_MIN_IMAGE_SIZE}, got {image_size} "
            "(two 5x5 convolutions each followed by 2x2 max pooling)"
        )
    side = _spatial_after_convs(image_size)
    backbone = nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 48, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(48 * side * side, LENET_FEATURE_DIM),
        nn.ReLU(),
        nn.Linear(LENET_FEATURE_DIM, LENET_FEATURE_DIM),
        nn.ReLU(),
    )
    return backbone, LENET_FEATURE_DIM


def lenet(num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> EnergyNet:
    """LeNet with a linear energy head: ``EnergyNet(lenet_backbone(...), 100, num_classes)``.

    Args:
        num_classes: number of classes (energies output per input).
        in_channels: number of input channels (1 or 3).
        image_size: side length of the square inputs; at least 20.

    Returns:
        An :class:`~eada.models.base.EnergyNet` without bottleneck; ``embed`` gives
        ``(B, 100)`` features, ``forward`` gives ``(B, num_classes)`` energies.
    """
    backbone, dim = lenet_backbone(in_channels=in_channels, image_size=image_size)
    return EnergyNet(backbone, dim, num_classes)
