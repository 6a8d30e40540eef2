"""Energy networks.

:class:`EnergyNet` and :func:`build_model` are imported from their modules when first used, so
that reading one light module of this package (:mod:`eada.models.engines`' check for ONNX
Runtime, by ``eada predict``) imports no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eada.models.base import EnergyNet
    from eada.models.factory import build_model


def __getattr__(name: str) -> Any:
    if name == "EnergyNet":
        from eada.models.base import EnergyNet

        return EnergyNet
    if name == "build_model":
        from eada.models.factory import build_model

        return build_model
    raise AttributeError(f"module 'eada.models' has no attribute {name!r}")


__all__ = ["EnergyNet", "build_model"]
