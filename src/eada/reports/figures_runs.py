"""Figures drawn from stored run records (nothing is re-trained).

Every ``plot_*`` function returns a matplotlib :class:`~matplotlib.figure.Figure` (built without
pyplot, so no global state); :func:`save_figure` writes it as PNG and/or SVG by suffix and
:func:`figure_bytes` renders it in memory (for the HTML report).

* :func:`plot_free_energy` - free-energy distributions of source vs target (paper Fig. 1), one
  panel per snapshot (before each round / final) or per method.
* :func:`plot_accuracy_curves` - accuracy vs labeled-target percentage per strategy with std
  bands (paper Fig. 3).
* :func:`plot_selected_error` - error rate of the model on the queried samples per round
  (paper appendix table).
* :func:`plot_domain_distances` - proxy A-distance and MMD^2 between source and target
  features before/after each round (paper appendix).
* :func:`plot_image_grid` - queried target images, one row per round (paper appendix).
* toy decision boundaries: :func:`eada.reports.figures.plot_toy` (paper Fig. 5).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from eada.runs import write_bytes_atomic

if TYPE_CHECKING:
    from eada.data.base import Task

SOURCE_COLOR = "#2ca02c"
TARGET_COLOR = "#d62728"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


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


def _line(ax: Axes, w: np.ndarray, b: float, lim: float, **kw: Any) -> None:
    t = np.linspace(-lim, lim, 200)
    if abs(w[1]) > abs(w[0]):
        ax.plot(t, -(w[0] * t + b) / w[1], **kw)
    elif abs(w[0]) > 0:
        ax.plot(-(w[1] * t + b) / w[0], t, **kw)


def save_figure(fig: Figure, *paths: Path) -> list[Path]:
    """Save ``fig`` to every path (format from the suffix: ``.png``, ``.svg``, ``.pdf``)."""
    out = []
    for p in paths:
        p = Path(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()  # rendered first, then written whole (a full disk: no partial file)
        fig.savefig(buf, format=p.suffix.lstrip(".").lower() or "png", dpi=110, bbox_inches="tight")
        out.append(write_bytes_atomic(p, buf.getvalue()))
    return out


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 100) -> bytes:
    """``fig`` rendered in memory as ``png`` or ``svg`` bytes."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"format must be png or svg, got {fmt!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


@dataclass
class FreeEnergyPanel:
    """One panel of the free-energy figure: a title and the two domains' free energies."""

    title: str
    source: Sequence[float]
    target: Sequence[float]


def plot_free_energy(
    panels: list[FreeEnergyPanel], title: str = "", bins: int = 40, max_cols: int = 4
) -> Figure:
    """Histograms (densities) of source and target free energies, one panel each, on shared
    bins; dashed lines mark the means. Lower free energy = more "source-like" (paper Fig. 1).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> fig = plot_free_energy([FreeEnergyPanel("a", rng.normal(-8, 1, 500),
        ...                                         rng.normal(-5, 1, 500))])
        >>> len(fig.axes)
        1
    """
    if not panels:
        raise ValueError("plot_free_energy needs at least one panel")
    allv = np.concatenate(
        [np.asarray(v, float) for p in panels for v in (p.source, p.target) if len(v)]
    )
    lo, hi = np.percentile(allv, [0.5, 99.5]) if len(allv) else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    cols = min(max_cols, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig = Figure(figsize=(3.3 * cols, 2.6 * rows + 0.5))
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, p in zip(axes.flat, panels, strict=False):
        for vals, col, name in (
            (p.source, SOURCE_COLOR, "source"),
            (p.target, TARGET_COLOR, "target"),
        ):
            v = np.clip(np.asarray(vals, float), edges[0], edges[-1])
            if not len(v):
                continue
            ax.hist(v, bins=edges, density=True, alpha=0.45, color=col, label=f"{name}")
            ax.axvline(float(np.mean(vals)), color=col, ls="--", lw=1.2)
        ax.set_title(p.title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_yticks([])
    axes.flat[0].legend(fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("free energy F(x)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


@dataclass
class Curve:
    """One strategy's accuracy curve: x = labeled target %, mean and std over seeds.

    A curve with a single point and ``flat=True`` is drawn as a horizontal line (e.g.
    source-only, which never labels anything).
    """

    label: str
    x: Sequence[float]
    mean: Sequence[float]
    std: Sequence[float]
    flat: bool = False


def plot_accuracy_curves(
    curves: list[Curve], title: str = "", ylabel: str = "target accuracy (%)"
) -> Figure:
    """Accuracy vs labeled-target percentage per strategy, std bands shaded (paper Fig. 3).

    Example:
        >>> fig = plot_accuracy_curves([Curve("EADA", [0, 1, 2], [80, 85, 88], [1, 1, 0.5])])
        >>> fig.axes[0].get_xlabel()
        'labeled target (%)'
    """
    if not curves:
        raise ValueError("plot_accuracy_curves needs at least one curve")
    fig = Figure(figsize=(5.6, 3.9))
    ax = fig.add_subplot()
    xs = [v for c in curves if not c.flat for v in c.x] or [0.0, 1.0]
    x_lo, x_hi = min(xs), max(xs)
    for i, c in enumerate(curves):
        col = PALETTE[i % len(PALETTE)]
        m, s = np.asarray(c.mean, float), np.asarray(c.std, float)
        if c.flat:
            ax.axhline(m[-1], color=col, ls="--", lw=1.4, label=f"{c.label} ({m[-1]:.1f})")
            lo, hi = np.clip([m[-1] - s[-1], m[-1] + s[-1]], 0.0, 100.0)
            ax.axhspan(lo, hi, color=col, alpha=0.12)
            continue
        x = np.asarray(c.x, float)
        ax.plot(x, m, marker="o", ms=4, color=col, lw=1.6, label=c.label)
        # mean +- std of a percentage, clipped to [0, 100] (a band is no claim past 100 %)
        ax.fill_between(x, np.clip(m - s, 0, 100), np.clip(m + s, 0, 100), color=col, alpha=0.18)
    ax.set_xlim(x_lo - 0.05 * (x_hi - x_lo + 1e-9), x_hi + 0.05 * (x_hi - x_lo + 1e-9))
    y_lo, y_hi = ax.get_ylim()
    ax.set_ylim(max(y_lo, 0.0), min(y_hi, 100.5))  # accuracies: bands never leave [0, 100]
    ax.set_xlabel("labeled target (%)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_selected_error(series: dict[str, tuple[list[int], list[float], list[float]]]) -> Figure:
    """Grouped bars: error rate (%) of the model on the samples it queried, per round, per
    strategy (``label -> (rounds, mean, std)``). High = the strategy asks about samples the
    model gets wrong (informative queries)."""
    if not series:
        raise ValueError("plot_selected_error needs at least one series")
    fig = Figure(figsize=(5.6, 3.4))
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (label, (rounds, mean, std)) in enumerate(series.items()):
        x = np.asarray(rounds, float) + (i - (len(series) - 1) / 2) * width
        m, sd = np.asarray(mean, float), np.asarray(std, float)
        yerr = [m - np.clip(m - sd, 0, 100), np.clip(m + sd, 0, 100) - m]  # kept in [0, 100]
        ax.bar(x, m, width, yerr=yerr, capsize=2, color=PALETTE[i % len(PALETTE)], label=label)
    all_rounds = sorted({r for rounds, _, _ in series.values() for r in rounds})
    ax.set_xticks(all_rounds)
    ax.set_xlabel("round")
    ax.set_ylabel("error on queried samples (%)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_domain_distances(
    series: dict[str, tuple[list[str], list[float], list[float], list[float], list[float]]],
) -> Figure:
    """Proxy A-distance and MMD^2 between source and target features per snapshot
    (``label -> (stage names, A mean, A std, MMD^2 mean, MMD^2 std)``); lower = domains closer.
    """
    if not series:
        raise ValueError("plot_domain_distances needs at least one series")
    fig = Figure(figsize=(9.6, 3.4))
    ax_a, ax_m = fig.subplots(1, 2)
    for i, (label, (stages, a_m, a_s, m_m, m_s)) in enumerate(series.items()):
        col = PALETTE[i % len(PALETTE)]
        x = np.arange(len(stages))
        for ax, mean, std in ((ax_a, a_m, a_s), (ax_m, m_m, m_s)):
            mean_a, std_a = np.asarray(mean, float), np.asarray(std, float)
            ax.errorbar(x, mean_a, yerr=std_a, marker="o", ms=4, capsize=2, color=col, label=label)
    longest = max((s[0] for s in series.values()), key=len)
    for ax, name in ((ax_a, "proxy A-distance"), (ax_m, "MMD² (RBF, median heuristic)")):
        ax.set_xticks(np.arange(len(longest)))
        ax.set_xticklabels([_short_stage(s) for s in longest], fontsize=7, rotation=30)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
    ax_a.legend(fontsize=7)
    fig.suptitle("Source-target discrepancy of penultimate features", fontsize=10)
    fig.tight_layout()
    return fig


def _short_stage(stage: str) -> str:
    return stage.replace("before round ", "before r")


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "\u2026"


def plot_image_grid(
    rows: list[tuple[Any, ...]],
    max_cols: int = 8,
    thumb_px: int = 144,
    dpi: int = 100,
) -> Figure:
    """Images in rows: ``(row title, images (N, C, H, W) / (N, H, W) / (N, H, W, 3), captions[,
    wrong])``; at most ``max_cols`` images a row (the first ones, i.e. the strategy's
    best-ranked).

    Every thumbnail is ``thumb_px`` pixels wide at ``dpi`` (the resolution
    :func:`figure_bytes` renders at; :func:`save_figure` renders larger). A caption is written
    under its image, one line per word (``y=... p=...`` gives two lines), each cut to the
    thumbnail's width, so captions never overlap. ``wrong[i]`` true draws image ``i`` with a
    red frame and a red caption (a misprediction)."""
    if not rows:
        raise ValueError("plot_image_grid needs at least one row")
    cols = min(max_cols, max(len(r[1]) for r in rows))
    cell = thumb_px / dpi  # inches
    lines = max([1, *(len(c.split()) for r in rows for c in r[2][:cols])])
    cap_h = 0.16 * lines + 0.06
    left, gap = 1.1, 0.08
    width = left + cols * (cell + gap)
    row_h = cell + cap_h + 0.1
    height = row_h * len(rows) + 0.1
    fig = Figure(figsize=(width, height), dpi=dpi)
    chars = max(4, int(cell * 72 / (7 * 0.62)))  # 7 pt characters across one thumbnail
    for r, row in enumerate(rows):
        title, imgs, caps = row[0], row[1], row[2]
        wrong = list(row[3]) if len(row) > 3 else []
        top = height - 0.1 - r * row_h
        fig.text(0.1 / width, (top - cell / 2) / height, title, fontsize=8, va="center")
        for c in range(min(cols, len(imgs))):
            x0 = left + c * (cell + gap)
            ax = fig.add_axes((x0 / width, (top - cell) / height, cell / width, cell / height))
            ax.set_xticks([])
            ax.set_yticks([])
            bad = c < len(wrong) and bool(wrong[c])
            for side in ax.spines.values():
                side.set_visible(bad)
                side.set_color("#d62728")
                side.set_linewidth(3)
            img = np.asarray(imgs[c], float)
            if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[-1] not in (1, 3):
                img = np.moveaxis(img, 0, -1)
            if img.ndim == 3 and img.shape[-1] == 1:
                img = img[..., 0]
            lo, hi = float(img.min()), float(img.max())
            img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="antialiased")
            ax.set_aspect("auto")
            if c < len(caps):
                text = "\n".join(_fit(w, chars) for w in caps[c].split())
                fig.text(
                    (x0 + cell / 2) / width,
                    (top - cell - 0.04) / height,
                    text,
                    fontsize=7,
                    ha="center",
                    va="top",
                    color="#d62728" if bad else "#222222",
                    fontweight="bold" if bad else "normal",
                )
    return fig


def plot_toy_rounds(panels: list[ToyPanel], max_cols: int = 4) -> Figure:
    """The toy figure (paper Fig. 5) as a :class:`Figure`, drawn from stored records: source
    (green) and target (red) points, circle / plus by class; samples queried in each round
    marked; decision boundary before each round dashed, after training solid. Same look as
    :func:`eada.reports.figures.plot_toy` (which ``eada demo`` uses), with a legend that fits a
    single panel."""
    if not panels:
        raise ValueError("plot_toy_rounds needs at least one panel")
    allx = np.concatenate([np.concatenate([p.source_x, p.target_x]) for p in panels])
    lim = float(np.abs(allx).max()) * 1.05
    cols = min(max_cols, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig = Figure(figsize=(4.2 * cols, 4.4 * rows + 0.4))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    marks = ["o", "s", "^", "D", "v", "P"]
    cols_r = ["#1f77b4", "#9467bd", "#111111", "#ff7f0e", "#8c564b", "#17becf"]
    for ax, p in zip(axes.flat, panels, strict=False):
        for pts, lab, col in (
            (p.source_x, p.source_y, SOURCE_COLOR),
            (p.target_x, p.target_y, TARGET_COLOR),
        ):
            ax.scatter(
                *pts[lab == 0].T,
                s=9,
                marker="o",
                facecolors="none",
                edgecolors=col,
                linewidths=0.7,
                alpha=0.6,
            )
            ax.scatter(*pts[lab == 1].T, s=9, marker="+", c=col, linewidths=0.7, alpha=0.6)
        for r, idx in enumerate(p.selected):
            ax.scatter(
                *p.target_x[idx].T,
                s=42,
                marker=marks[r % 6],
                facecolors="none",
                edgecolors=cols_r[r % 6],
                linewidths=1.4,
                label=f"round {r + 1}",
            )
        for r, (w, b) in enumerate(p.boundaries):
            _line(ax, w, b, lim, ls="--", lw=1.0, c=cols_r[r % 6])
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
        "green: labeled source, red: unlabeled target (circle/plus = class)\n"
        "dashed: boundary before each round, solid: after training",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
