"""One leaderboard: every in-repo task x every query strategy, 3 seeds, from run records.

Tasks: the toy preset, the three ``digits/*`` presets (fused forward, channels-last), Office-31
amazon(subset) <-> webcam on frozen EfficientNet-Lite0 (the two ``*_lite0_frozen.yaml`` configs)
and the 12 Office-Caltech10 SURF pairs (``configs/office_caltech10_surf.yaml`` with
``data.source`` / ``data.target`` / ``name`` set). Rows: Random, the ten baselines, EADA in its
default (``train.alignment=normalized``), EADA with the paper's ``L_fea``
(``train.alignment=paper``), EADA w/o ``L_fea``, and every further method of
``eada.hparams.METHODS`` named in :data:`EXTRA_ROWS` (DUC, LAS) that this checkout has.

A cell is filled from ANY committed run record (``runs.jsonl`` of ``eada bench`` or of
``eada run`` under ``benchmarks/results/``) whose resolved config is exactly the cell's
protocol: the config ``eada bench`` would build for that task, method, seed and overrides,
compared key by key after both are validated by the current
:class:`eada.config.ExperimentConfig` (a key added to the config after a record was written is
compared at the value the code had before the key existed: :data:`LEGACY_VALUES`, else its
default). One exception, stated in the table: a run with ``train.gamma = 0`` (every baseline,
Random, EADA w/o ``L_fea``) trains no ``L_fea``, so its ``train.alignment`` is not compared.
Nothing else is ignored: a record with another schedule, model, preprocessing or forward mode
is not used.

Outputs: ``benchmarks/results/leaderboard/summary.json`` (per cell: the per-seed accuracies,
mean, std, rank, and which file and commit each seed's value came from; per method: the average
rank) and the Markdown table on stdout (``--markdown FILE`` writes it to a file).

Usage (repository root)::

    python benchmarks/leaderboard.py                 # gather + table (trains nothing)
    python benchmarks/leaderboard.py --commands      # the eada bench commands of missing cells
    python benchmarks/leaderboard.py --run           # run them, one after another (resumable)
    python benchmarks/leaderboard.py --compare       # + significance tests and the CD diagram

``--run`` runs ``eada bench --jobs 1 --threads 1`` per task (under ``nice -n 10``), writing to
``benchmarks/results/leaderboard/<task folder>/``; a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eada.bench import make_config, task_id
from eada.config import ConfigError, parse_config
from eada.hparams import METHODS
from eada.reports.tables import render_table
from eada.runs import find_jsonl, read_jsonl, write_json

RESULTS = Path("benchmarks/results")
OUT = RESULTS / "leaderboard"
SEEDS = (0, 1, 2)
SURF_DIR = "../shared/data/office_caltech10_surf"
SURF_FILES = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
SURF_PAIRS = ["C-A", "C-W", "C-D", "A-C", "A-W", "A-D", "W-C", "W-A", "W-D", "D-C", "D-A", "D-W"]
DIGITS_SET = ("train.forward=fused", "train.channels_last=true")


@dataclass(frozen=True)
class Task:
    """One column of the leaderboard: what ``eada bench`` gets for it."""

    label: str
    spec: str  # a preset or a YAML config
    folder: str  # where its new runs go, under benchmarks/results/leaderboard
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """One method of the leaderboard: an ``eada bench`` method plus the overrides it needs."""

    label: str
    method: str
    overrides: tuple[str, ...] = ()
    before_change: bool = False  # only records from before CHANGED_SINCE[strategy]; not ranked
    ranked: bool = True  # False: shown beside the others, left out of ranks and wins


def surf_task(pair: str) -> Task:
    """The SURF pair ``S-T`` (C, A, W, D) as the SURF config with source, target and name set."""
    s, t = pair.split("-")
    return Task(
        f"SURF {s}->{t}",
        "configs/office_caltech10_surf.yaml",
        f"surf/{pair}",
        (
            f"data.source={SURF_DIR}/{SURF_FILES[s]}_SURF_L10.mat",
            f"data.target={SURF_DIR}/{SURF_FILES[t]}_SURF_L10.mat",
            f"name=surf/{s}->{t}",
        ),
    )


TASKS: list[Task] = [
    Task("toy", "toy", "toy"),
    Task("MNIST->USPS", "digits/mnist-usps", "digits/mnist-usps", DIGITS_SET),
    Task("USPS->MNIST", "digits/usps-mnist", "digits/usps-mnist", DIGITS_SET),
    Task("MNIST->MNIST-M", "digits/mnist-mnistm", "digits/mnist-mnistm", DIGITS_SET),
    Task(
        "Office-31 A(sub)->W",
        "configs/office31_amazon_subset_webcam_lite0_frozen.yaml",
        "office31/A-W",
    ),
    Task(
        "Office-31 W->A(sub)",
        "configs/office31_webcam_amazon_subset_lite0_frozen.yaml",
        "office31/W-A",
    ),
    *[surf_task(p) for p in SURF_PAIRS],
]

BASELINES = [
    ("Entropy", "entropy"),
    ("BvSB", "margin"),
    ("Least conf.", "least_confidence"),
    ("CoreSet", "coreset"),
    ("BADGE", "badge"),
    ("WAAL", "waal"),
    ("AADA", "aada"),
    ("DBAL", "dbal"),
    ("TQS", "tqs"),
    ("CLUE", "clue"),
]
EXTRA_ROWS = [Row("DUC", "duc"), Row("LAS", "las")]
"""Methods added after EADA; a row appears once ``eada.hparams.METHODS`` has the method."""

# EADA's columns first, so that they are in view beside the task on a narrow screen
ROWS: list[Row] = [
    # the default's alignment and gate, named: the toy preset pins the paper's (Fig. 5)
    Row("EADA (default)", "eada", ("train.alignment=normalized", "train.fea_gate=labels")),
    Row("EADA (paper L_fea)", "eada", ("train.alignment=paper", "train.fea_gate=none")),
    Row("EADA w/o L_fea", "eada_no_fea"),  # paired: L_fea weighted 0 on EADA's own batches
    Row("Random", "random"),
    *[Row(label, m) for label, m in BASELINES],
    *[r for r in EXTRA_ROWS if r.method in METHODS],
    Row("CLUE before the fix (1 k-means init)", "clue", before_change=True, ranked=False),
    Row("DUC before the fidelity fix", "duc", before_change=True, ranked=False),
    Row("LAS before the fidelity fix", "las", before_change=True, ranked=False),
    # DUC's scores in float64 (an option): where the float32 evidence overflows (MNIST->MNIST-M)
    Row("DUC, float64 scores", "duc", ("active.params.precision=float64",), ranked=False),
    # EADA w/o L_fea as it was before it was paired: gamma = 0 draws no unlabeled batch, so the
    # seed's source batches differ from EADA's (BENCHMARKS.md "A paired ablation of L_fea")
    Row("EADA w/o L_fea, unpaired (gamma 0)", "eada", ("train.gamma=0",), ranked=False),
    # L_fea weighted per sample by the model's confidence above chance (train.fea_gate)
    Row(
        "EADA, confidence gate",
        "eada",
        ("train.alignment=normalized", "train.fea_gate=confidence"),
        ranked=False,
    ),
    # the default before the labels gate became it: L_fea from the first step
    Row(
        "EADA, no gate (the default before)",
        "eada",
        ("train.alignment=normalized", "train.fea_gate=none"),
        ranked=False,
    ),
]


# -- matching records to cells ------------------------------------------------------------------
LEGACY_VALUES: dict[tuple[str, str], Any] = {
    ("train", "alignment"): "paper",
    ("train", "fea_gate"): "none",  # came in as "none" (no gate); the default became "labels"
}
"""Keys whose default changed after they were added: the value a record written before the key
existed ran with (``train.alignment`` came in as ``paper``, the only ``L_fea`` before; its default
became ``normalized`` later; ``train.fea_gate`` came in as ``none``, its default became
``labels``). Any other missing key takes its default, which every key added so far was given to
reproduce the code before it."""


def with_legacy_values(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a record's config) with :data:`LEGACY_VALUES` filled in where the key is absent.

    >>> with_legacy_values({"train": {"gamma": 0.01}})["train"]["alignment"]
    'paper'
    """
    out = json.loads(json.dumps(raw))
    for (section, key), value in LEGACY_VALUES.items():
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = value
    return out


def comparable(cfg: dict[str, Any]) -> dict[str, Any]:
    """A resolved config as compared here: ``train.alignment`` and ``train.fea_gate`` dropped
    when ``train.gamma`` is 0 (no ``L_fea`` is trained, so neither has an effect)."""
    out = json.loads(json.dumps(cfg))
    if float(out["train"]["gamma"]) == 0.0:
        out["train"].pop("alignment", None)
        out["train"].pop("fea_gate", None)
    return out


def config_key(cfg: dict[str, Any]) -> str:
    """Hash of :func:`comparable` ``(cfg)`` (its seed included)."""
    blob = json.dumps(comparable(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


CHANGED_SINCE: dict[str, str] = {"clue": "2faafcc", "duc": "a6ef7ac", "las": "a6ef7ac"}
"""Strategies whose picks or training changed after records of them were committed, and the
commit of the change: a record of one counts only if its commit contains that change (CLUE:
k-means best of 10 initialisations, as the authors' code, instead of 1; DUC and LAS, the
fidelity fix: the authors' picks by default (DUC's stage 1 ``ceil(N_T r kappa)`` on float32
scores, LAS's ``torch.sort`` ranking and k-means on float64 with 10 initialisations) and DUC's
training as theirs (log-space evidential loss, one forward pass per domain, batches without
replacement))."""

_ANCESTRY: dict[tuple[str, str], bool] = {}


def contains(commit: str, change: str) -> bool:
    """Whether ``commit`` has ``change`` in its history (``git merge-base --is-ancestor``)."""
    if (change, commit) not in _ANCESTRY:
        res = subprocess.run(
            ["git", "merge-base", "--is-ancestor", change, commit], capture_output=True
        )
        _ANCESTRY[(change, commit)] = res.returncode == 0
    return _ANCESTRY[(change, commit)]


def _commit(rec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The commit that wrote a record: the line's own ``code`` (bench lines since issue 15), else
    the folder's ``meta.json``."""
    git = (rec.get("code") or {}).get("git")
    if not git:
        meta = folder / "meta.json"
        git = json.loads(meta.read_text()).get("git") if meta.is_file() else None
    git = git or {}
    return {"commit": str(git.get("commit") or "unknown"), "dirty": bool(git.get("dirty"))}


def _accuracy(rec: dict[str, Any]) -> float | None:
    """Final (last-epoch) whole-target accuracy of a bench line or an ``eada run`` line."""
    if "final" in rec and "target/accuracy" in rec["final"]:
        return float(rec["final"]["target/accuracy"])
    try:
        return float(rec["results"]["final"]["last_epoch"]["target"]["accuracy"])
    except (KeyError, TypeError):
        return None


def load_records(root: Path = RESULTS) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Every usable record under ``root`` by :func:`config_key`; and how many were skipped
    (no config or accuracy, or a config the current schema rejects). A record of a strategy in
    :data:`CHANGED_SINCE` says whether its commit has the change (``after_change``)."""
    index: dict[str, list[dict[str, Any]]] = {}
    skipped = 0
    for path in find_jsonl(root):
        for rec in read_jsonl(path):
            acc = _accuracy(rec)
            if "config" not in rec or acc is None:
                skipped += 1
                continue
            try:
                cfg = parse_config(with_legacy_values(rec["config"]), str(path)).resolved()
            except ConfigError:
                skipped += 1
                continue
            entry = {
                "accuracy": acc,
                "file": path.as_posix(),
                **_commit(rec, path.parent),
            }
            change = CHANGED_SINCE.get(cfg["active"]["strategy"])
            entry["after_change"] = bool(change) and contains(entry["commit"], change)
            entry["commit"] = entry["commit"][:7]
            index.setdefault(config_key(cfg), []).append(entry)
    return index, skipped


def expected_key(task: Task, row: Row, seed: int) -> str:
    """:func:`config_key` of the config ``eada bench`` builds for this cell."""
    cfg = make_config(task_id(task.spec), row.method, seed, [*task.overrides, *row.overrides])
    return config_key(cfg.resolved())


def pick(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The record a cell uses when several match: this leaderboard's own runs first, then the
    first by file name; every other match is kept in ``also`` (with its accuracy)."""
    ordered = sorted(entries, key=lambda e: (not e["file"].startswith(OUT.as_posix()), e["file"]))
    chosen = dict(ordered[0])
    others = [
        {"file": e["file"], "accuracy": e["accuracy"], "commit": e["commit"]} for e in ordered[1:]
    ]
    if others:
        chosen["also"] = others
    return chosen


def ranks(means: dict[str, float]) -> dict[str, float]:
    """Rank 1 = highest mean; ties share the average of their ranks.

    >>> ranks({"a": 90.0, "b": 95.0, "c": 90.0})
    {'a': 2.5, 'b': 1.0, 'c': 2.5}
    """
    values = sorted(means.values(), reverse=True)
    out = {}
    for name, m in means.items():
        first = values.index(m) + 1
        out[name] = first + (values.count(m) - 1) / 2
    return out


def gather(index: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The leaderboard as JSON: tasks -> rows -> per-seed values, mean, std, rank."""
    tasks: dict[str, Any] = {}
    for task in TASKS:
        cells: dict[str, Any] = {}
        for row in ROWS:
            seeds = {}
            for seed in SEEDS:
                entries = index.get(expected_key(task, row, seed)) or []
                if row.method in CHANGED_SINCE:  # the code before or after the change, not both
                    entries = [e for e in entries if e["after_change"] != row.before_change]
                if entries:
                    seeds[str(seed)] = pick(entries)
            cell: dict[str, Any] = {"seeds": seeds}
            if len(seeds) == len(SEEDS):
                acc = np.array([s["accuracy"] for s in seeds.values()])
                cell["mean"] = float(acc.mean())
                cell["std"] = float(acc.std(ddof=1))
            cells[row.label] = cell
        ranked = {r.label for r in ROWS if r.ranked}
        complete = {k: c["mean"] for k, c in cells.items() if "mean" in c and k in ranked}
        rk = ranks({k: round(m, 1) for k, m in complete.items()})
        for k, r in rk.items():
            cells[k]["rank"] = r
        stds = [c["std"] for k, c in cells.items() if "std" in c and k in ranked]
        tasks[task.label] = {
            "spec": task.spec,
            "overrides": list(task.overrides),
            "cells": cells,
            "median_std": float(np.median(stds)) if stds else None,
            "winner": [k for k, r in rk.items() if r == min(rk.values())] if rk else [],
        }
    avg: dict[str, Any] = {}
    ranked_rows = [r.label for r in ROWS if r.ranked]
    complete_tasks = [
        t for t in tasks.values() if all("rank" in t["cells"][k] for k in ranked_rows)
    ]
    for row in ROWS:
        rs = [
            t["cells"][row.label]["rank"] for t in tasks.values() if "rank" in t["cells"][row.label]
        ]
        rc = [t["cells"][row.label]["rank"] for t in complete_tasks if row.ranked]
        avg[row.label] = {
            "average_rank": float(np.mean(rs)) if rs else None,
            "tasks": len(rs),
            "average_rank_complete_tasks": float(np.mean(rc)) if rc else None,
            "complete_tasks": len(rc),
            "wins": sum(row.label in t["winner"] for t in tasks.values()),
        }
    return {
        "seeds": list(SEEDS),
        "metric": "final (last-epoch) whole-target accuracy, %",
        "rows": [
            {"label": r.label, "method": r.method, "overrides": list(r.overrides)} for r in ROWS
        ],
        "tasks": tasks,
        "methods": avg,
    }


# -- tables -------------------------------------------------------------------------------------
def spread_flags(summary: dict[str, Any], factor: float = 3.0, floor: float = 2.0) -> list[str]:
    """Cells whose std is more than ``factor`` x the task's median std and above ``floor``."""
    out = []
    for label, t in summary["tasks"].items():
        med = t["median_std"]
        for row, c in t["cells"].items():
            if med is not None and "std" in c and c["std"] > max(factor * med, floor):
                vals = " / ".join(f"{s['accuracy']:.1f}" for s in c["seeds"].values())
                out.append(f"{label}: {row} {vals} (std {c['std']:.1f}, task median {med:.1f})")
    return out


def markdown(summary: dict[str, Any]) -> str:
    """The leaderboard as Markdown: one row per task, one column per method; the winner bold;
    ``(r)`` the rank; last row the average rank."""
    head = ["task", *[r["label"] for r in summary["rows"]]]
    body = []
    for label, t in summary["tasks"].items():
        line = [label]
        for r in summary["rows"]:
            c = t["cells"][r["label"]]
            if "mean" not in c:
                n = len(c["seeds"])
                line.append("–" if not n else f"({n} seed{'s' if n > 1 else ''})")
                continue
            rank = f" ({c['rank']:g})" if "rank" in c else ""
            text = f"{c['mean']:.1f} ± {c['std']:.1f}{rank}"
            line.append(f"**{text}**" if r["label"] in t["winner"] else text)
        body.append(line)
    avg = ["average rank (tasks)"]
    for r in summary["rows"]:
        m = summary["methods"][r["label"]]
        avg.append(f"{m['average_rank']:.1f} ({m['tasks']})" if m["tasks"] else "–")
    body.append(avg)
    full = ["average rank, tasks with every method"]
    for r in summary["rows"]:
        m = summary["methods"][r["label"]]
        full.append(
            f"{m['average_rank_complete_tasks']:.1f} ({m['complete_tasks']})"
            if m["complete_tasks"]
            else "–"
        )
    body.append(full)
    wins = ["wins"] + [str(summary["methods"][r["label"]]["wins"]) for r in summary["rows"]]
    body.append(wins)
    return render_table(head, body)


def verdict(summary: dict[str, Any], row: str = "EADA (default)") -> str:
    """Where ``row`` wins and where it loses, task by task, from the table's own numbers."""
    wins, close, behind, below_random = [], [], [], []
    for label, t in summary["tasks"].items():
        c = t["cells"][row]
        if "rank" not in c:
            continue
        best = max(
            (k for k in t["cells"] if "rank" in t["cells"][k] and k != row),
            key=lambda k: t["cells"][k]["mean"],
        )
        gap = c["mean"] - t["cells"][best]["mean"]
        item = f"{label} ({c['mean']:.1f}; {best} {t['cells'][best]['mean']:.1f}, {gap:+.1f})"
        if row in t["winner"]:
            wins.append(item)
        elif c["rank"] < 4:  # 2nd or 3rd, or tied with the 4th (an average rank of 3.5)
            close.append(item + f", rank {c['rank']:g}")
        else:
            behind.append(item + f", rank {c['rank']:g}")
        rnd = t["cells"].get("Random", {})
        if "mean" in rnd and c["mean"] < rnd["mean"]:
            below_random.append(f"{label} ({c['mean']:.1f} vs {rnd['mean']:.1f})")
    parts = [
        f"- **{row} wins {len(wins)}**: " + ("; ".join(wins) or "none"),
        f"- **ranks 2-3 (ties to 3.5) on {len(close)}**: " + ("; ".join(close) or "none"),
        f"- **loses (rank 4 or worse) on {len(behind)}**: " + ("; ".join(behind) or "none"),
        f"- below Random on {len(below_random)}: " + ("; ".join(below_random) or "none"),
    ]
    return "\n".join(parts)


def provenance(summary: dict[str, Any]) -> str:
    """Which files and commits the cells came from (Markdown list, one item a folder)."""
    by_file: dict[str, set[str]] = {}
    for t in summary["tasks"].values():
        for c in t["cells"].values():
            for s in c["seeds"].values():
                folder = str(Path(s["file"]).parent)
                by_file.setdefault(folder, set()).add(
                    s["commit"] + (" (dirty)" if s["dirty"] else "")
                )
    return "\n".join(f"- `{f}`: {', '.join(sorted(c))}" for f, c in sorted(by_file.items()))


# -- running the missing cells ------------------------------------------------------------------
def missing_commands(summary: dict[str, Any]) -> list[list[str]]:
    """One ``eada bench`` command per task and override set with missing cells."""
    cmds = []
    for task in TASKS:
        cells = summary["tasks"][task.label]["cells"]
        groups: dict[tuple[str, ...], list[str]] = {}
        for row in ROWS:
            if len(cells[row.label]["seeds"]) < len(SEEDS):
                groups.setdefault(row.overrides, []).append(row.method)
        for overrides, methods in groups.items():
            cmd = [
                "eada", "bench", task.spec,
                "--methods", ",".join(dict.fromkeys(methods)),
                "--seeds", f"{SEEDS[0]}-{SEEDS[-1]}",
                *[a for o in task.overrides for a in ("--set", o)],
                *[a for o in overrides for a in ("--sweep", o)],
                "--jobs", "1", "--threads", "1",
                "--out", (OUT / task.folder).as_posix(),
            ]  # fmt: skip
            cmds.append(cmd)
    return cmds


# -- significance -------------------------------------------------------------------------------
COMPARISON = OUT / "comparison"
CD_FIGURE = Path("docs/figures/leaderboard-cd.svg")


def comparison_scores(summary: dict[str, Any]) -> Any:
    """The ranked rows' per-seed accuracies of every task, as :class:`eada.reports.compare.Scores`
    (the cells exactly as the table has them; a cell with fewer seeds keeps the ones it has)."""
    from eada.reports.compare import Row as CompareRow
    from eada.reports.compare import Scores

    rows = [CompareRow(r.label, r.method, (), r.overrides) for r in ROWS if r.ranked]
    values: dict[str, dict[str, dict[int, float]]] = {}
    files: set[str] = set()
    for label, t in summary["tasks"].items():
        for row in rows:
            seeds = t["cells"][row.label]["seeds"]
            if seeds:
                values.setdefault(label, {})[row.label] = {
                    int(s): float(e["accuracy"]) for s, e in seeds.items()
                }
                files |= {e["file"] for e in seeds.values()}
    return Scores("target/accuracy", rows, list(summary["tasks"]), values, sorted(files))


def write_comparison(summary: dict[str, Any], out: Path = COMPARISON) -> dict[str, Any]:
    """``eada report --compare`` on the leaderboard's cells, against EADA (default): writes
    ``out/comparison.json`` and ``comparison.md``, and the diagram to :data:`CD_FIGURE`."""
    from eada.reports import compare

    result = compare.compare(comparison_scores(summary), "EADA (default)")
    result["diagram"] = CD_FIGURE.as_posix()
    compare.write_comparison(result, out, formats=())
    compare.save_figure(compare.cd_diagram(result), CD_FIGURE)
    return result


BEGIN, END = "<!-- leaderboard:begin -->", "<!-- leaderboard:end -->"


def replace_block(path: Path, text: str) -> None:
    """Put ``text`` between the :data:`BEGIN` and :data:`END` lines of ``path`` (kept); the rest of
    the file is not touched. Raises ``ValueError`` naming the file when a marker is missing."""
    doc = path.read_text()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"{path}: needs one {BEGIN} line before one {END} line")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text.strip()}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """Gather the records, write ``summary.json``, print the table (or the commands, or run)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commands", action="store_true", help="print the missing cells' commands")
    ap.add_argument("--run", action="store_true", help="run the missing cells (resumable)")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    ap.add_argument(
        "--benchmarks",
        type=Path,
        help=f"replace the text between {BEGIN} and {END} in this file (BENCHMARKS.md)",
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help=f"also write the significance tests ({COMPARISON}/comparison.json, .md) and the "
        f"critical-difference diagram ({CD_FIGURE}); needs eada[stats]",
    )
    args = ap.parse_args(argv)
    index, skipped = load_records()
    summary = gather(index)
    if args.commands or args.run:
        cmds = missing_commands(summary)
        for cmd in cmds:
            print(shlex.join(cmd), flush=True)
            if args.run:
                exe = str(Path(sys.executable).with_name("eada"))
                subprocess.run(["nice", "-n", "10", exe, *cmd[1:]], check=True)
        if not args.run:
            return 0
        index, skipped = load_records()
        summary = gather(index)
    summary["skipped_records"] = skipped
    summary["spread_flags"] = spread_flags(summary)
    write_json(OUT / "summary.json", summary)
    text = markdown(summary)
    text += "\n\nLarge seed spread (std > 3x the task's median std and > 2 points):\n\n"
    text += "\n".join(f"- {f}" for f in summary["spread_flags"]) or "- none"
    for row in ("EADA (default)", "EADA (paper L_fea)"):
        text += "\n\n" + verdict(summary, row)
    text += "\n\nRecords used (folder: commits):\n\n" + provenance(summary) + "\n"
    if args.compare:
        result = write_comparison(summary)
        fr = result["across_tasks"].get("friedman", {})
        print(f"comparison: {COMPARISON}, Friedman p = {fr.get('p_value')}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(text)
    if args.benchmarks:
        replace_block(args.benchmarks, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
