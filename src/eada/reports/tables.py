"""Result tables as text, Markdown or LaTeX: ``eada bench`` and the scripts in ``benchmarks/``.

The tables of a grid's records (the paper's Tables 1-4: :func:`accuracy_table`,
:func:`sweep_table`, :func:`query_table`, all of them: :func:`render_tables`) live here, beside
the renderer they share (:func:`render_table`); ``eada bench`` writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eada.hparams import method_label, variant_label


def mean_std(stat: dict[str, Any], digits: int = 1) -> str:
    """``{"mean": m, "std": s}`` as ``"m ± s"`` with ``digits`` decimals.

    >>> mean_std({"mean": 66.94, "std": 1.46})
    '66.9 ± 1.5'
    """
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table: the header, a ``|---|`` rule, one line a row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def render_table(head: list[str], body: list[list[str]], fmt: str = "md", caption: str = "") -> str:
    """A table as Markdown (``md``: header, ``|---|`` rule, one line a row) or as a LaTeX
    ``table`` (``latex``: ``caption`` above, ``_`` and ``->`` escaped).

    >>> print(render_table(["task", "EADA"], [["A->W", "90.1 ± 0.3"]]))
    | task | EADA |
    |---|---|
    | A->W | 90.1 ± 0.3 |
    """
    if fmt == "md":
        return markdown_table(head, body)
    if fmt == "latex":

        def esc(s: str) -> str:
            return s.replace("_", "\\_").replace("->", "$\\to$") if "$" not in s else s

        cols = "l|" + "c" * (len(head) - 1)
        lines = [
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{esc(caption)}}}",
            f"\\begin{{tabular}}{{{cols}}}",
            "\\hline",
            " & ".join(esc(h) for h in head) + " \\\\",
            "\\hline",
            *[" & ".join(esc(c) for c in r) + " \\\\" for r in body],
            "\\hline",
            "\\end{tabular}",
            "\\end{table}",
        ]
        return "\n".join(lines)
    raise ValueError(f"unknown table format {fmt!r}; use md or latex")


# -- the tables of a grid's records (eada bench) -----------------------------------------------
#: Query complexity: (as the paper's Table 4 states it, as implemented here). N pool size,
#: M source size, L labeled target, C classes, D feature size, B budget, T k-means iterations,
#: m/e DBAL's candidate/evaluation subsample sizes.
COMPLEXITY: dict[str, tuple[str, str]] = {
    "random": ("O(N)", "O(N)"),
    "entropy": ("O(NC)", "O(NC + B log B)"),
    "margin": ("O(NC)", "O(NC + B log B)"),
    "least_confidence": ("O(NC)", "O(NC + B log B)"),
    "coreset": ("O(DN^2)", "O(DN(L + B))"),
    "badge": ("O(CDN^2)", "O(N B (C + D))"),
    "dbal": ("O(DN(M+N))", "O(D N (M + L) + D m e + B m e)"),
    "clue": ("O(DN(N+TB))", "O(N B D T)"),
    "waal": ("-", "O(NC + B log B)"),
    "aada": ("O(N log N)", "O(NC + B log B)"),
    "tqs": ("O(N log N)", "O(NKC + B log B)"),
    "eada": ("O(N log N)", "O(N + B log B)"),
    "mvsm": ("O(N log N)", "O(N + B log B)"),
    "free_energy": ("O(N log N)", "O(N + B log B)"),
    # not in the EADA paper's table (later methods): K = LAS neighbours, k = kappa (DUC)
    "duc": ("-", "O(NC + kB log kB)"),
    "las": ("-", "O(D N^2 [exact, N < 50k] or D N log N [faiss] + NKC + B^2 M D T)"),
}


def _stats(values: list[float]) -> tuple[float, float]:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def task_label(task: str) -> str:
    """A task's column name: a preset as is, a YAML config by its file stem."""
    path = Path(task)
    return path.stem if path.suffix in (".yaml", ".yml") else task


def task_labels(tasks: list[str]) -> dict[str, str]:
    """Column names of ``tasks``: :func:`task_label`, or the whole task where two different
    tasks would share a name (``a/x.yaml`` and ``b/x.yaml``), so a column never mixes tasks."""
    short = [task_label(t) for t in tasks]
    return {t: s if short.count(s) == 1 else t for t, s in zip(tasks, short, strict=True)}


def _row_name(rec: dict[str, Any]) -> str:
    var = variant_label(rec["variant"])
    return method_label(rec["method"]) + (f" ({var})" if var else "")


TABLE_ORDER = (
    "source_only",
    "target_supervised",
    "random",
    "entropy",
    "margin",
    "least_confidence",
    "coreset",
    "waal",
    "badge",
    "aada",
    "dbal",
    "tqs",
    "clue",
    "eada",
    "eada_no_f",
    "eada_no_u",
    "eada_no_fea",
    "random_fea",
)
"""Row order of the tables (the paper's: references, baselines, EADA, its ablations); methods
not listed follow in the order of their records."""


def in_table_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` sorted by method (:data:`TABLE_ORDER`), stable otherwise, so a table does
    not depend on the order the runs were written (a resumed or partly re-run grid)."""
    rank = {m: i for i, m in enumerate(TABLE_ORDER)}
    return sorted(records, key=lambda r: rank.get(r["method"], len(rank)))


def _ordered(records: list[dict[str, Any]], field_name: str) -> list[Any]:
    seen: dict[Any, None] = {}
    for r in records:
        seen.setdefault(r[field_name] if field_name != "row" else _row_name(r), None)
    return list(seen)


def accuracy_table(
    records: list[dict[str, Any]], metric: str = "target/accuracy", fmt: str = "md"
) -> str:
    """Paper Tables 1-2: rows = methods (and sweep variants), columns = tasks + mean over tasks;
    cells = mean +- std over seeds of the final (last-epoch) ``metric``, ``n=`` seeds when
    fewer than the most any cell has. The best mean of each column is bold."""
    import numpy as np

    records = in_table_order(records)
    tasks = _ordered(records, "task")
    rows = _ordered(records, "row")
    cell: dict[tuple[str, str], list[float]] = {}
    for r in records:
        if metric in r["final"]:
            cell.setdefault((_row_name(r), r["task"]), []).append(r["final"][metric])
    max_n = max((len(v) for v in cell.values()), default=0)
    means = {k: _stats(v)[0] for k, v in cell.items()}
    best = {t: max((means[(m, t)] for m in rows if (m, t) in means), default=None) for t in tasks}
    row_means = {
        m: float(np.mean([means[(m, t)] for t in tasks]))
        for m in rows
        if all((m, t) in means for t in tasks)
    }
    best_mean = max(row_means.values(), default=None)

    def fmt_cell(m: str, t: str) -> str:
        if (m, t) not in cell:
            return "-"
        mean, std = _stats(cell[(m, t)])
        n = len(cell[(m, t)])
        text = f"{mean:.1f} ± {std:.1f}" if fmt == "md" else f"{mean:.1f} $\\pm$ {std:.1f}"
        if n < max_n:
            text += f" (n={n})"
        if best[t] is not None and mean == best[t]:
            text = f"**{text}**" if fmt == "md" else f"\\textbf{{{text}}}"
        return text

    labels = task_labels(tasks)
    head = ["Method", *(labels[t] for t in tasks), "Mean"]
    body = []
    for m in rows:
        mean_cell = "-"
        if m in row_means:
            mean_cell = f"{row_means[m]:.1f}"
            if row_means[m] == best_mean:
                mean_cell = f"**{mean_cell}**" if fmt == "md" else f"\\textbf{{{mean_cell}}}"
        body.append([m, *[fmt_cell(m, t) for t in tasks], mean_cell])
    return render_table(head, body, fmt, f"{metric} (%), final epoch, mean ± std over seeds")


def sweep_table(records: list[dict[str, Any]], method: str, fmt: str = "md") -> str:
    """Paper Table 3: rows = tasks, columns = sweep variants of ``method``; mean over seeds."""
    recs = [r for r in records if r["method"] == method and r["variant"]]
    variants = list(dict.fromkeys(variant_label(r["variant"]) for r in recs))
    tasks = _ordered(recs, "task")
    head = ["Task", *variants]
    pm = "±" if fmt == "md" else "$\\pm$"
    body = []
    for t in tasks:
        row = [task_labels(tasks)[t]]
        for v in variants:
            vals = [
                r["final"]["target/accuracy"]
                for r in recs
                if r["task"] == t and variant_label(r["variant"]) == v
            ]
            mean, std = _stats(vals) if vals else (0.0, 0.0)
            row.append(f"{mean:.1f} {pm} {std:.1f}" if vals else "-")
        body.append(row)
    return render_table(
        head, body, fmt, f"{method_label(method)}: target accuracy (%) per setting, mean ± std"
    )


def query_table(records: list[dict[str, Any]], fmt: str = "md") -> str:
    """Paper Table 4: strategy, query complexity (paper / here), and the measured query time
    per round for each task: ``select`` (the strategy call) and ``total`` (scoring pass +
    strategy), mean over rounds and seeds of the same runs as the accuracy table."""
    import numpy as np

    records = in_table_order(records)
    tasks = _ordered(records, "task")
    strategies = list(
        dict.fromkeys(r["strategy"] for r in records if r["strategy"] and not r["variant"])
    )
    head = ["Strategy", "Complexity (paper)", "Complexity (here)"]
    labels = task_labels(tasks)
    head += [f"{labels[t]} select / total (s)" for t in tasks]
    body = []
    for s in strategies:
        paper, here = COMPLEXITY.get(s, ("-", "-"))
        row = [s, paper, here]
        for t in tasks:
            sel, tot = [], []
            for r in records:
                if r["strategy"] == s and r["task"] == t and not r["variant"]:
                    for rd in r["rounds"]:
                        if "selection_seconds" in rd:
                            sel.append(rd["selection_seconds"])
                            tot.append(rd["selection_seconds"] + rd.get("scoring_seconds", 0.0))
            row.append(f"{np.mean(sel):.4f} / {np.mean(tot):.3f}" if sel else "-")
        body.append(row)
    return render_table(head, body, fmt, "query complexity and measured query time per round")


def render_tables(records: list[dict[str, Any]], fmt: str = "md") -> str:
    """All tables the records support: accuracy, held-out accuracy if any, sweeps, query."""
    parts = []

    def add(title: str, table: str) -> None:
        parts.append(f"**{title}**\n\n{table}" if fmt == "md" else table)

    plain = [r for r in records if not r["variant"]]
    seeds = sorted({r["seed"] for r in records})
    if plain:
        add(
            f"Target accuracy (%), whole target set, final epoch, mean ± std over seeds {seeds}",
            accuracy_table(plain, "target/accuracy", fmt),
        )
        if any("target_unlabeled/accuracy" in r["final"] for r in plain):
            add(
                "Target accuracy (%) on the target samples never labeled, final epoch",
                accuracy_table(plain, "target_unlabeled/accuracy", fmt),
            )
        if any("heldout/accuracy" in r["final"] for r in plain):
            add(
                "Held-out target accuracy (%), final epoch",
                accuracy_table(plain, "heldout/accuracy", fmt),
            )
    for m in dict.fromkeys(r["method"] for r in records if r["variant"]):
        add(f"Sweep of {method_label(m)}: target accuracy (%)", sweep_table(records, m, fmt))
    if any(r["strategy"] for r in plain):
        add(
            "Query complexity and query time per round (same runs; select = strategy call, "
            "total = scoring pass + strategy)",
            query_table(records, fmt),
        )
    return "\n\n".join(parts)
