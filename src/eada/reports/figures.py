"""Figures (matplotlib, no display needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


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


def _line(ax: plt.Axes, w: np.ndarray, b: float, lim: float, **kw: Any) -> None:
    t = np.linspace(-lim, lim, 200)
    if abs(w[1]) > abs(w[0]):
        ax.plot(t, -(w[0] * t + b) / w[1], **kw)
    elif abs(w[0]) > 0:
        ax.plot(-(w[1] * t + b) / w[0], t, **kw)


def plot_toy(panels: list[ToyPanel], path: Path) -> Path:
    """Draw the toy panels side by side (PNG or SVG by suffix) and return ``path``.

    Green = labeled source (circle / plus by class), red = unlabeled target, numbered black
    markers = samples selected in rounds 1, 2, 3; dashed lines = decision boundary before
    each round, solid = final boundary.
    """
    allx = np.concatenate([np.concatenate([p.source_x, p.target_x]) for p in panels])
    lim = float(np.abs(allx).max()) * 1.05
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    round_marks = ["o", "s", "^", "D", "v", "P"]
    round_cols = ["#1f77b4", "#9467bd", "#111111", "#ff7f0e", "#8c564b", "#17becf"]
    for ax, p in zip(axes[0], panels, strict=True):
        for cls, mark in ((0, "o"), (1, "+")):
            for pts, lab, col in (
                (p.source_x, p.source_y, "#2ca02c"),
                (p.target_x, p.target_y, "#d62728"),
            ):
                style = {"facecolors": "none", "edgecolors": col} if mark == "o" else {"c": col}
                ax.scatter(*pts[lab == cls].T, s=9, marker=mark, linewidths=0.7, alpha=0.6, **style)
        for r, idx in enumerate(p.selected):
            ax.scatter(
                *p.target_x[idx].T,
                s=42,
                marker=round_marks[r % 6],
                facecolors="none",
                edgecolors=round_cols[r % 6],
                linewidths=1.4,
                label=f"round {r + 1}",
            )
        for r, (w, b) in enumerate(p.boundaries):
            _line(ax, w, b, lim, ls="--", lw=1.0, c=round_cols[r % 6])
        if p.final is not None:
            _line(ax, p.final[0], p.final[1], lim, ls="-", lw=1.8, c="k")
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.set_title(p.title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        if p.selected:
            ax.legend(loc="lower right", fontsize=7, frameon=True)
    fig.suptitle(
        "Toy example (green: labeled source, red: unlabeled target; "
        "dashed: boundary before each round, solid: final)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
