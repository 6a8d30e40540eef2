"""Result tables as text, Markdown or LaTeX: ``eada bench`` and the scripts in ``benchmarks/``."""

from __future__ import annotations

from typing import Any


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
