"""Build the energy network a :class:`~eada.config.ModelConfig` names."""

from __future__ import annotations

import math

from torch import nn

from eada.config import ModelConfig
from eada.models.base import EnergyNet


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> EnergyNet:
    """An :class:`EnergyNet` for inputs of ``input_shape`` (see :func:`_build`); with
    ``cfg.freeze_bottleneck_bn_affine`` the bottleneck batch norm's scale and shift stay at
    their initial values (:meth:`EnergyNet.freeze_bottleneck_affine`, the authors' code)."""
    net = _build(cfg, input_shape, num_classes)
    if cfg.freeze_bottleneck_bn_affine:
        net.freeze_bottleneck_affine()
    net.cosine_temperature = cfg.cosine_temperature
    return net


def _build(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> EnergyNet:
    """An :class:`EnergyNet` for inputs of ``input_shape`` (without the batch dimension).

    * ``linear``: a single fully-connected layer ``E = W x + b`` (the paper's toy model).
    * ``mlp``: ``Linear -> ReLU`` blocks of sizes ``cfg.hidden``, then the energy head.
    * ``lenet``: the digits CNN of :mod:`eada.models.lenet` (inputs ``(C, S, S)``).
    * ``backbone``: an image backbone (:mod:`eada.models.backbones`) on ``(3, S, S)`` images,
      or, with ``freeze_backbone``, nothing: the inputs are its precomputed features.

    ``bottleneck_dim`` adds ``Linear -> BatchNorm1d`` before the energy head (all models).
    """
    if num_classes < 2:
        raise ValueError(f"an energy classifier needs at least 2 classes, got {num_classes}")
    flat = math.prod(input_shape)
    if cfg.name == "linear":
        return EnergyNet(nn.Flatten(), flat, num_classes, cfg.bottleneck_dim, cfg.bottleneck_relu)
    if cfg.name == "backbone":
        if cfg.freeze_backbone:
            return EnergyNet(
                nn.Flatten(), flat, num_classes, cfg.bottleneck_dim, cfg.bottleneck_relu
            )
        from eada.models.backbones import build_backbone

        bb = build_backbone(cfg.backbone, cfg.weights, cfg.factory)
        return EnergyNet(
            bb.module, bb.feature_dim, num_classes, cfg.bottleneck_dim, cfg.bottleneck_relu
        )
    if cfg.name == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        width = flat
        for h in cfg.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        return EnergyNet(
            nn.Sequential(*layers), width, num_classes, cfg.bottleneck_dim, cfg.bottleneck_relu
        )
    if cfg.name == "lenet":
        from eada.models.lenet import lenet_backbone

        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ValueError(f"lenet needs square image inputs (C, S, S), got {input_shape}")
        backbone, dim = lenet_backbone(in_channels=input_shape[0], image_size=input_shape[1])
        return EnergyNet(backbone, dim, num_classes)
    raise ValueError(f"unknown model {cfg.name!r}")
