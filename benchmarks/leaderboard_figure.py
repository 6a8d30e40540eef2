"""The leaderboard as one figure and one paragraph, from its records (nothing is trained).

Reads ``benchmarks/results/leaderboard/summary.json`` (written by ``benchmarks/leaderboard.py``)
and writes:

* ``docs/figures/leaderboard-ranks.png``: the rank of every ranked method (columns, best
  average rank first) on every task (rows), 1 = best, as a heat map; a cell without three
  seeds shows a dash;
  the PNG's ``Source`` metadata holds the digest of the summary it was drawn from, so a stale
  figure can be told (``tests/test_docs_site.py``);
* the README's results summary, between ``<!-- results-summary:begin -->`` and
  ``<!-- results-summary:end -->``: the average ranks, the wins and where EADA stands, computed
  from the same file.

Run it after ``benchmarks/leaderboard.py --benchmarks BENCHMARKS.md``::

    python benchmarks/leaderboard_figure.py            # figure + README block
    python benchmarks/leaderboard_figure.py --check    # exit 1 if the README block is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

SUMMARY = Path("benchmarks/results/leaderboard/summary.json")
FIGURE = Path("docs/figures/leaderboard-ranks.png")
README = Path("README.md")
BEGIN, END = "<!-- results-summary:begin -->", "<!-- results-summary:end -->"


def ranked_methods(summary: dict[str, Any]) -> list[str]:
    """The ranked methods (those with an average rank), best average rank first."""
    methods = summary["methods"]
    ranked = [m for m, v in methods.items() if v["average_rank"] is not None]
    return sorted(ranked, key=lambda m: (methods[m]["average_rank"], m))


def rank_matrix(summary: dict[str, Any]) -> tuple[list[str], list[str], list[list[float | None]]]:
    """``(tasks, methods, ranks)``: ``ranks[i][j]``, method ``j`` on task ``i`` (None: unranked)."""
    methods = ranked_methods(summary)
    tasks = list(summary["tasks"])
    ranks = [[summary["tasks"][t]["cells"][m].get("rank") for m in methods] for t in tasks]
    return tasks, methods, ranks


def digest(path: Path) -> str:
    """SHA-256 of the summary file, kept in the PNG (``Source``) to tell a stale figure."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def figure(summary: dict[str, Any], out: Path, source: str = "") -> None:
    """Draw the rank heat map into ``out`` (PNG); ``source`` goes into its metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks, methods, ranks = rank_matrix(summary)
    avg = summary["methods"]
    grid = np.array([[np.nan if r is None else r for r in row] for row in ranks], dtype=float)
    fig, ax = plt.subplots(figsize=(11, 7.5), dpi=110)
    im = ax.imshow(grid, cmap="viridis_r", aspect="auto", vmin=1, vmax=len(methods))
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(
        [f"{m}\n({avg[m]['average_rank']:.2f})" for m in methods], rotation=60, ha="right",
        fontsize=8,
    )  # fmt: skip
    ax.set_yticks(range(len(tasks)))
    ax.set_yticklabels(tasks, fontsize=8)
    for i, row in enumerate(ranks):
        for j, r in enumerate(row):
            if r is None:  # fewer than three seeds: not ranked
                ax.text(j, i, "–", ha="center", va="center", fontsize=7, color="grey")
                continue
            text = f"{r:g}"
            colour = "white" if r > 0.6 * len(methods) else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
    ax.set_title(
        "Rank on each task (1 = best; 3 seeds; columns by average rank, in brackets)", fontsize=10
    )
    fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, label="rank")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None, "Source": source})
    plt.close(fig)


def _task_list(tasks: list[str]) -> str:
    return ", ".join(t.replace("->", "→") for t in tasks)


def summary_text(summary: dict[str, Any]) -> str:
    """The README's results paragraph, every number from ``summary``."""
    methods = summary["methods"]
    order = ranked_methods(summary)
    n_tasks = len(summary["tasks"])
    top = ", ".join(f"{m} {methods[m]['average_rank']:.2f}" for m in order[:5])
    complete = sorted(
        (m for m in order if methods[m]["average_rank_complete_tasks"] is not None),
        key=lambda m: (methods[m]["average_rank_complete_tasks"], m),
    )
    n_complete = methods[order[0]]["complete_tasks"]
    top_c = ", ".join(f"{m} {methods[m]['average_rank_complete_tasks']:.2f}" for m in complete[:3])
    wins: dict[str, list[str]] = {}
    below_random: dict[str, list[str]] = {}
    for task, entry in summary["tasks"].items():
        cells = entry["cells"]
        best = min(r for m in order if (r := cells[m].get("rank")) is not None)
        for m in order:
            if cells[m].get("rank") == best:
                wins.setdefault(m, []).append(task)
            rnd = cells.get("Random", {}).get("mean")
            mean = cells[m].get("mean")
            if (
                m != "Random"
                and rnd is not None
                and mean is not None
                and round(mean, 1) < round(rnd, 1)
            ):
                below_random.setdefault(m, []).append(task)
    most = sorted(wins, key=lambda m: (-len(wins[m]), order.index(m)))
    win_text = "; ".join(f"{m} {len(wins[m])} ({_task_list(wins[m])})" for m in most)
    eada = "EADA (default)"
    paper = "EADA (paper L_fea)"
    lines = [
        f"Final target accuracy on {n_tasks} in-repo tasks (the toy, three digits tasks, Office-31"
        " amazon(subset)↔webcam on frozen EfficientNet-Lite0, the 12 Office-Caltech10 SURF"
        f" pairs), {len(order)} ranked methods, seeds 0-2 each, one protocol per task:",
        "",
        f"- **Average rank** (1 = best) over the {n_tasks} tasks: {top}; on the {n_complete} tasks"
        f" where every method has three seeds: {top_c}.",
        f"- **Wins** (best rank, ties shared): {win_text}.",
    ]
    if eada in methods:
        ranks = [e["cells"][eada].get("rank") for e in summary["tasks"].values()]
        podium = sum(r is not None and r <= 3.5 for r in ranks)
        below = below_random.get(eada, [])
        lines.append(
            f"- **EADA as it ships** wins {len(wins.get(eada, []))}, is in the top three on "
            f"{podium} of {n_tasks} tasks and below Random on {len(below)} ({_task_list(below)});"
            f" with the paper's `L_fea` it wins {len(wins.get(paper, []))} and falls below "
            f"Random on {len(below_random.get(paper, []))}."
        )
    lines.append("- Gaps below a point are within one seed's spread on most tasks.")
    return "\n".join(lines)


def replace_block(path: Path, text: str, check: bool) -> bool:
    """Put ``text`` between the markers of ``path`` (``check``: only compare); True if unchanged."""
    doc = path.read_text()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"{path}: needs one {BEGIN} line before one {END} line")
    head, rest = doc.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    if old.strip() == text.strip():
        return True
    if not check:
        path.write_text(f"{head}{BEGIN}\n{text.strip()}\n{END}{tail}")
    return False


def main(argv: list[str] | None = None) -> int:
    """Write the figure and the README block (or, with ``--check``, compare the block)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", type=Path, default=SUMMARY)
    ap.add_argument("--figure", type=Path, default=FIGURE)
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--check", action="store_true", help="exit 1 if the README block is stale")
    args = ap.parse_args(argv)
    summary = json.loads(args.summary.read_text())
    text = summary_text(summary)
    same = replace_block(args.readme, text, args.check)
    if args.check:
        if not same:
            print(f"{args.readme}: the results summary is stale; run {sys.argv[0]}")
        return 0 if same else 1
    figure(summary, args.figure, f"{args.summary.as_posix()} sha256 {digest(args.summary)}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
