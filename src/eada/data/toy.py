"""The paper's toy example (Fig. 5): two Gaussian classes; the target is the source rotated.

Parameters the paper leaves open are fixed ONCE in :class:`eada.config.ToyData` (means at
``(+-separation/2, 0)``, isotropic ``std``, rotation about the origin) and are the same for
every strategy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from eada.data.base import TensorDomain


def rotate(points: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate ``(N, 2)`` points counter-clockwise about the origin by ``degrees``."""
    t = math.radians(degrees)
    rot = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    return points @ rot.T


def make_toy(
    n_per_class: int = 500,
    separation: float = 7.0,
    std: float = 1.0,
    rotation_deg: float = 90.0,
    seed: int = 0,
) -> tuple[TensorDomain, TensorDomain]:
    """Source and target domains of the toy example.

    Args:
        n_per_class: samples per class (two classes).
        separation: distance between the two class means.
        std: standard deviation of each isotropic Gaussian.
        rotation_deg: counter-clockwise rotation that turns source points into target points.
        seed: seed of the sampler.

    Returns:
        ``(source, target)``; the target holds the same points rotated, with the same labels.
    """
    rng = np.random.default_rng(seed)
    means = np.array([[-separation / 2, 0.0], [separation / 2, 0.0]])
    x = np.concatenate([rng.normal(means[k], std, size=(n_per_class, 2)) for k in range(2)])
    y = np.repeat(np.arange(2), n_per_class)
    classes = ["circle", "plus"]
    source = TensorDomain(
        "toy-source", torch.tensor(x, dtype=torch.float32), torch.tensor(y), classes
    )
    xt = rotate(x, rotation_deg)
    target = TensorDomain(
        "toy-target", torch.tensor(xt, dtype=torch.float32), torch.tensor(y), classes
    )
    return source, target
