"""Figures (matplotlib, no display needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

if TYPE_CHECKING:
    from eada.data.tasks import Task


@dataclass
class ToyPanel:
    """What one panel of the toy figure (paper Fig. 5) shows.

    Attributes:
        title: panel title (method and its target error).
        source_x, source_y: source points ``(N, 2)`` and labels.
        target_x, target_y: target points and labels.
        selected: target indices selected in each round.
        boundaries: ``(w, b)`` of the two-class linear energy model before each round; the
            boundary is ``{x : w . x + b = 0}`` with ``w = w_0 - w_1``, ``b = b_0 - b_1``.
        final: ``(w, b)`` after training.
    """

    title: str
    source_x: np.ndarray
    source_y: np.ndarray
    target_x: np.ndarray
    target_y: np.ndarray
    selected: list[np.ndarray] = field(default_factory=list)
    boundaries: list[tuple[np.ndarray, float]] = field(default_factory=list)
    final: tuple[np.ndarray, float] | None = None

    @classmethod
    def from_run(
        cls,
        title: str,
        task: Task,
        run: dict[str, Any],
        boundaries: list[tuple[np.ndarray, float]],
        final: tuple[np.ndarray, float] | None,
    ) -> ToyPanel:
        """The panel of one toy run: the task's points and the run's per-round selections.

        Raises:
            TypeError: the task's domains are not in-memory 2-D points (``TensorDomain``).
        """
        from eada.data.base import TensorDomain

        src, tgt = task.source, task.target
        if not isinstance(src, TensorDomain) or not isinstance(tgt, TensorDomain):
            raise TypeError("the toy figure needs in-memory 2-D domains (TensorDomain)")
        return cls(
            title=title,
            source_x=src.x.numpy(),
            source_y=src.y.numpy(),
            target_x=tgt.x.numpy(),
            target_y=tgt.y.numpy(),
            selected=[np.asarray(r["selected"]) for r in run["results"]["rounds"][1:]],
            boundaries=boundaries,
            final=final,
        )


def _line(ax: plt.Axes, w: np.ndarray, b: float, lim: float, **kw: Any) -> None:
    t = np.linspace(-lim, lim, 200)
    if abs(w[1]) > abs(w[0]):
        ax.plot(t, -(w[0] * t + b) / w[1], **kw)
    elif abs(w[0]) > 0:
        ax.plot(-(w[1] * t + b) / w[0], t, **kw)


def plot_toy(panels: list[ToyPanel], path: Path) -> Path:
    """Draw the toy panels side by side (PNG or SVG by suffix) and return ``path``.

    Green = labeled source (circle / plus by class), red = unlabeled target, markers = samples
    selected in rounds 1, 2, 3; dashed lines = decision boundary before each round, solid =
    final boundary. The drawing is :func:`eada.reports.figures_runs.plot_toy_rounds`, shared
    with the HTML report.
    """
    from eada.reports.figures_runs import plot_toy_rounds  # it imports this module

    fig = plot_toy_rounds(panels)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
