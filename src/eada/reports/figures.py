"""The toy figure as a file (``eada demo``; matplotlib, no display needed). The drawing and
:class:`ToyPanel` live in :mod:`eada.reports.figures_runs`, shared with the HTML report."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from eada.reports.figures_runs import ToyPanel, plot_toy_rounds

__all__ = ["ToyPanel", "plot_toy"]


def plot_toy(panels: list[ToyPanel], path: Path) -> Path:
    """Draw the toy panels side by side (PNG or SVG by suffix) and return ``path``.

    Green = labeled source (circle / plus by class), red = unlabeled target, markers = samples
    selected in rounds 1, 2, 3; dashed lines = decision boundary before each round, solid =
    final boundary. The drawing is :func:`eada.reports.figures_runs.plot_toy_rounds`, shared
    with the HTML report. The grid fits the panels: one row up to five (the demo's five
    methods), then rows of at most five, as even as they come (six: 3 + 3).
    """
    rows = max(1, -(-len(panels) // 5))
    fig = plot_toy_rounds(panels, max_cols=max(1, -(-len(panels) // rows)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
