"""Who labels the selected target samples.

The training loop only asks an :class:`Oracle` for labels of target indices, so a simulated run
(ground truth revealed) and a real annotation round share one code path.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class Oracle(Protocol):
    """Anything that returns class ids for target-set indices."""

    def label(self, indices: np.ndarray) -> np.ndarray:
        """Class ids (``int64``) of the target samples at ``indices``."""
        ...


class SimulatedOracle:
    """Reveals ground-truth labels (the simulation every Active DA paper uses).

    Args:
        labels: the target set's true class ids.
    """

    def __init__(self, labels: torch.Tensor | np.ndarray) -> None:
        self._labels = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
        self.queries = 0

    def label(self, indices: np.ndarray) -> np.ndarray:
        """Ground truth at ``indices``; counts the queried samples in :attr:`queries`."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self._labels)):
            raise IndexError(f"oracle asked for indices outside [0, {len(self._labels)})")
        self.queries += len(indices)
        return self._labels[indices].astype(np.int64)
