"""Segmentation energy networks: DeepLab-v2 (the paper's) and DeepLab-v3+, from torchvision parts.

The per-pixel output IS the energy ``E(x, p, y)`` of class ``y`` at pixel ``p`` (lower = more
likely), the same convention as the classifiers (``eada.energy``); the prediction is the argmin.
Outputs come at the head's resolution (1/8 of the input for DeepLab-v2 at output stride 8, 1/4
for DeepLab-v3+); :func:`eada.segmentation.data.resize_energies` brings them to label size.

* **DeepLab-v2** (Chen et al. 2018, as in AdaptSegNet): a dilated ResNet (layer3 dilation 2,
  layer4 dilation 4, output stride 8) and an ASPP that SUMS four 3x3 convolutions with dilation
  rates 6, 12, 18 and 24, each mapping the 2048 features straight to the classes.
* **DeepLab-v3+** (Chen et al. 2018b): torchvision's ASPP (three atrous rates + 1x1 + image
  pooling, 256 channels) and a decoder that fuses the upsampled ASPP output with 48 channels of
  ``layer1`` features.

ResNet backbones and the v3+ ASPP come from :mod:`torchvision.models` (the ``segmentation``
extra) with ``weights=None`` (random init) unless the
config asks for ``"imagenet"`` (torchvision downloads the weights) or a local ``state_dict`` path.
``tiny`` is a four-layer dilated conv net for CPU tests and the synthetic pair.

Example:
    >>> import torch
    >>> from eada.segmentation.config import SegModelConfig
    >>> net = build_seg_model(SegModelConfig(backbone="tiny", aspp_rates=[1, 2]), num_classes=4)
    >>> net(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 4, 8, 8])
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from eada.segmentation.config import SegModelConfig


def _torchvision() -> ModuleType:
    """torchvision (the ``segmentation`` extra), or an error saying how to install it."""
    try:
        import torchvision
        import torchvision.models.segmentation.deeplabv3
    except ImportError as err:
        raise ImportError(
            "ResNet backbones and the DeepLab-v3+ head need torchvision: "
            "pip install 'eada[segmentation]'"
        ) from err
    return torchvision


class ResNetBackbone(nn.Module):
    """A torchvision ResNet without pooling/fc; ``forward`` returns ``(layer1, layer4)``.

    Args:
        depth: 50 or 101.
        output_stride: 8 (layer3, layer4 dilated) or 16 (layer4 dilated).
        weights: ``None``, ``"imagenet"`` (torchvision's ``IMAGENET1K_V1``) or a path to a
            ResNet ``state_dict`` (``fc.*`` keys may be absent).
    """

    low_channels = 256
    out_channels = 2048

    def __init__(self, depth: int = 101, output_stride: int = 8, weights: str | None = None):
        super().__init__()
        tv = _torchvision()
        dilate = [False, True, True] if output_stride == 8 else [False, False, True]
        builders = {50: tv.models.resnet50, 101: tv.models.resnet101}
        if depth not in builders:
            raise ValueError(f"ResNet depth must be 50 or 101, got {depth}")
        tv_weights = None
        if weights == "imagenet":
            enum = {50: tv.models.ResNet50_Weights, 101: tv.models.ResNet101_Weights}
            tv_weights = enum[depth].IMAGENET1K_V1
        net = builders[depth](weights=tv_weights, replace_stride_with_dilation=dilate)
        if weights not in (None, "imagenet"):
            _load_state(net, Path(weights))
        self.stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            net.layer1,
            net.layer2,
            net.layer3,
            net.layer4,
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low-level features at 1/4, high-level features at 1/output_stride)``."""
        low = self.layer1(self.stem(x))
        return low, self.layer4(self.layer3(self.layer2(low)))


def _load_state(net: nn.Module, path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"backbone weights file not found: {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("fc.")]
    unexpected = [k for k in unexpected if not k.startswith("fc.")]
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit the ResNet backbone: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )


class TinyBackbone(nn.Module):
    """Four 3x3 conv-BN-ReLU layers (two with stride 2, two dilated): output stride 4.

    ``forward`` returns ``(features at 1/2, features at 1/4)``; for CPU tests only.
    """

    def __init__(self, width: int = 32) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

        self.low_channels = width // 2
        self.out_channels = width * 2
        self.low = block(3, width // 2, stride=2)
        self.high = nn.Sequential(
            block(width // 2, width, stride=2),
            block(width, width, dilation=2),
            block(width, width * 2, dilation=4),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low-level, high-level)`` features."""
        low = self.low(x)
        return low, self.high(low)


class ASPPSum(nn.Module):
    """DeepLab-v2's ASPP classifier: ``sum_r conv3x3_{dilation=r}(x)``, each conv straight to the
    classes, weights ~ N(0, 0.01^2) (AdaptSegNet's ``Classifier_Module``)."""

    def __init__(self, in_channels: int, num_classes: int, rates: list[int]) -> None:
        super().__init__()
        self.rates = list(rates)
        convs = [
            nn.Conv2d(in_channels, num_classes, 3, padding=r, dilation=r, bias=True) for r in rates
        ]
        for conv in convs:
            nn.init.normal_(conv.weight, 0.0, 0.01)
            assert conv.bias is not None
            nn.init.zeros_(conv.bias)
        self.convs = nn.ModuleList(convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel class energies at the input's resolution."""
        out = self.convs[0](x)
        for conv in self.convs[1:]:
            out = out + conv(x)
        return out


class DeepLabV3PlusHead(nn.Module):
    """torchvision's ASPP (256 channels) + the v3+ decoder on low-level features."""

    def __init__(
        self, in_channels: int, low_channels: int, num_classes: int, rates: list[int]
    ) -> None:
        super().__init__()
        aspp = _torchvision().models.segmentation.deeplabv3.ASPP
        self.aspp = aspp(in_channels, rates, out_channels=256)
        self.reduce = nn.Sequential(
            nn.Conv2d(low_channels, 48, 1, bias=False), nn.BatchNorm2d(48), nn.ReLU(inplace=True)
        )
        self.fuse = nn.Sequential(
            nn.Conv2d(256 + 48, 256, 3, padding=1, bias=False),
            nn.BatchNorm2d(256),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1, bias=False),
            nn.BatchNorm2d(256),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Conv2d(256, num_classes, 1)

    def forward(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """Energies at the low-level features' resolution."""
        x = self.aspp(high)
        x = F.interpolate(x, size=low.shape[2:], mode="bilinear", align_corners=False)
        return self.classifier(self.fuse(torch.cat([x, self.reduce(low)], dim=1)))


class SegEnergyNet(nn.Module):
    """Backbone + head; ``forward(x)`` gives ``(N, C, h, w)`` per-pixel energies.

    ``freeze_bn=True`` keeps the backbone's batch norm in eval mode (running statistics used,
    affine parameters frozen) even in ``train()`` -- the DeepLab-v2 practice for batch size 1.
    Parameters are split into ``backbone`` and ``head`` for the optimiser's two learning rates.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module, freeze_bn: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.freeze_bn = freeze_bn
        if freeze_bn:
            for m in self.backbone.modules():
                if isinstance(m, nn.BatchNorm2d):
                    for p in m.parameters():
                        p.requires_grad_(False)

    def train(self, mode: bool = True) -> SegEnergyNet:
        """Like :meth:`nn.Module.train`, but frozen batch norm stays in eval mode."""
        super().train(mode)
        if self.freeze_bn:
            for m in self.backbone.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-pixel energies ``(N, C, h, w)`` at the head's output resolution."""
        low, high = self.backbone(x)
        if isinstance(self.head, DeepLabV3PlusHead):
            return self.head(low, high)
        return self.head(high)


def build_seg_model(cfg: SegModelConfig, num_classes: int) -> SegEnergyNet:
    """The network a :class:`SegModelConfig` describes.

    Raises:
        ValueError: fewer than 2 classes, or a weights file that does not fit.
        FileNotFoundError: a weights path that does not exist.
    """
    if num_classes < 2:
        raise ValueError(f"segmentation needs at least 2 classes, got {num_classes}")
    backbone: TinyBackbone | ResNetBackbone
    if cfg.backbone == "tiny":
        backbone = TinyBackbone(cfg.tiny_width)
    else:
        depth = 101 if cfg.backbone == "resnet101" else 50
        backbone = ResNetBackbone(depth, cfg.output_stride, cfg.weights)
    head: nn.Module
    if cfg.head == "deeplabv2":
        head = ASPPSum(backbone.out_channels, num_classes, cfg.aspp_rates)
    else:
        head = DeepLabV3PlusHead(
            backbone.out_channels, backbone.low_channels, num_classes, cfg.aspp_rates
        )
    return SegEnergyNet(backbone, head, freeze_bn=cfg.freeze_bn)
