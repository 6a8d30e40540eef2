"""Build the energy network a :class:`~eada.config.ModelConfig` names."""

from __future__ import annotations

import itertools
import math

from torch import nn

from eada.config import ModelConfig
from eada.models.base import EnergyNet

BYTES_PER_PARAMETER = 16
"""float32 weights, their gradients and up to two optimiser moments (Adam's)."""
ACTIVATION_ROWS = 512
"""Rows a forward pass holds at once (``train.eval_batch_size``'s default), for activations."""


class ModelSizeError(ValueError):
    """A model whose parameters and activations cannot fit in the memory this process may use."""


def head_widths(
    cfg: ModelConfig, flat: int, num_classes: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """The fully-connected layers ``(in, out)`` of a ``linear``/``mlp``/frozen-backbone model
    on ``flat`` input features, and the widths of its activations."""
    dims = [flat, *(cfg.hidden if cfg.name == "mlp" else [])]
    if cfg.bottleneck_dim:
        dims.append(cfg.bottleneck_dim)
    dims.append(num_classes)
    return list(itertools.pairwise(dims)), dims


def model_memory(layers: list[tuple[int, int]], widths: list[int]) -> int:
    """Bytes the layers need: their parameters (:data:`BYTES_PER_PARAMETER` each) and the
    activations of :data:`ACTIVATION_ROWS` rows (float32, kept for the backward pass)."""
    params = sum(a * b + b for a, b in layers)
    return params * BYTES_PER_PARAMETER + ACTIVATION_ROWS * sum(widths) * 4 * 2


def check_model_memory(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Refuse, before anything is allocated, a ``linear``/``mlp``/frozen-backbone model whose
    parameters and activations (:func:`model_memory`) exceed what this process may use
    (:func:`eada.threads.memory_limit`), naming the largest hidden width that fits.

    Raises:
        ModelSizeError: naming the sizes, the memory needed, the limit and what fits.
    """
    if cfg.name not in ("linear", "mlp") and not (cfg.name == "backbone" and cfg.freeze_backbone):
        return
    from eada.threads import memory_limit

    flat = math.prod(input_shape)
    layers, widths = head_widths(cfg, flat, num_classes)
    need = model_memory(layers, widths)
    avail, why = memory_limit()
    if need <= avail:
        return
    what = f"model.hidden {cfg.hidden}" if cfg.name == "mlp" and cfg.hidden else "the model"
    hint = f"use fewer input features than {flat:,}"
    if cfg.name == "mlp" and cfg.hidden:
        k = max(range(len(cfg.hidden)), key=lambda i: cfg.hidden[i])
        lo, hi = 0, cfg.hidden[k]
        while lo < hi:  # the largest width of that layer that fits
            mid = (lo + hi + 1) // 2
            trial = cfg.model_copy(update={"hidden": [*cfg.hidden[:k], mid, *cfg.hidden[k + 1 :]]})
            if model_memory(*head_widths(trial, flat, num_classes)) <= avail:
                lo = mid
            else:
                hi = mid - 1
        hint = (
            f"the largest model.hidden[{k}] that fits is {lo:,}"
            if lo >= 1
            else "no width of that layer fits; use fewer or narrower layers"
        )
    raise ModelSizeError(
        f"{what} is too large for {flat:,} input features and {num_classes} classes: "
        f"{sum(a * b + b for a, b in layers):,} parameters and their activations need about "
        f"{need / 2**30:,.1f} GiB, more than the {avail / 2**30:,.1f} GiB this process may use "
        f"(limit: {why}); {hint}"
    )


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
    A fully-connected model too large for this process's memory is refused before anything is
    allocated (:func:`check_model_memory`).
    """
    if num_classes < 2:
        raise ValueError(f"an energy classifier needs at least 2 classes, got {num_classes}")
    check_model_memory(cfg, input_shape, num_classes)
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
