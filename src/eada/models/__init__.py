"""Energy networks."""

from eada.models.base import EnergyNet
from eada.models.factory import build_model

__all__ = ["EnergyNet", "build_model"]
