"""Read run folders into one structure the report and figures use.

Three layouts are understood (all written by ``eada`` itself):

* a run folder of ``eada run``: ``runs.jsonl`` (one record a seed), ``config.json``,
  ``results.json``;
* a ``eada demo`` folder: ``runs.jsonl`` whose records carry a ``method`` key, ``results.json``,
  ``toy_fig5.png``;
* a benchmark folder: ``<task>/<method>/runs.jsonl`` (e.g. ``benchmarks/results/digits``) or
  ``<method>/runs.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eada.runs import find_jsonl, jsonl_exists, read_jsonl, summarize


@dataclass
class RunGroup:
    """The seeds of one (task, method) pair.

    Attributes:
        task: task name (the config's ``name``, or the folder name in a benchmark).
        method: method name (benchmark folder / demo key), or the run's strategy.
        label: human-readable method name.
        runs: the run records (``{"seed", "config", "results"}``), sorted by seed.
        path: the folder the records came from.
    """

    task: str
    method: str
    label: str
    runs: list[dict[str, Any]]
    path: Path

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config of the first seed."""
        return dict(self.runs[0]["config"])

    @property
    def seeds(self) -> list[int]:
        """The seeds present."""
        return [int(r["seed"]) for r in self.runs]

    @property
    def n_target(self) -> int:
        """Size of the target set (the active pool at the start)."""
        res = self.runs[0]["results"]
        if res.get("plan"):
            return int(res["plan"][0]["pool_before"])
        return int(res["final"]["last_epoch"]["target"].get("n", 0))

    @property
    def has_rounds(self) -> bool:
        """Whether the runs made selection rounds."""
        return bool(self.runs[0]["results"].get("rounds"))


@dataclass
class ReportInput:
    """Everything found under a report's input folder."""

    path: Path
    kind: str  # "run", "demo" or "bench"
    groups: list[RunGroup]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        """Task names in order of appearance."""
        return list(dict.fromkeys(g.task for g in self.groups))

    def by_task(self, task: str) -> list[RunGroup]:
        """The groups of one task."""
        return [g for g in self.groups if g.task == task]


def _label(method: str) -> str:
    from eada.hparams import method_label

    return method_label(method)


def is_bench_line(rec: dict[str, Any]) -> bool:
    """Whether ``rec`` is a compact ``eada bench`` line (``task``, ``method``, ``final``,
    ``rounds``; no full ``results``)."""
    return "results" not in rec and {"task", "method", "seed", "final", "rounds"} <= set(rec)


def expand_bench_line(rec: dict[str, Any]) -> dict[str, Any]:
    """A compact ``eada bench`` line as a run record (``seed``, ``config``, ``results``) with
    the parts the report reads: per-round accuracy, timings, error on queried samples, the
    final (last and best epoch) accuracies and the domain statistics (no histories or
    selections)."""
    last: dict[str, Any] = {}
    for key, value in rec["final"].items():
        split, _, metric = key.partition("/")
        last.setdefault(split, {})[metric] = value
    rounds = []
    for r in rec["rounds"]:
        row = {k: v for k, v in r.items() if k != "target_accuracy"}
        if r.get("target_accuracy") is not None:
            row["after_training"] = {"target": {"accuracy": r["target_accuracy"]}}
        rounds.append(row)
    plan = [{"pool_before": r["pool_before"]} for r in rounds if "pool_before" in r][:1]
    final: dict[str, Any] = {"last_epoch": last}
    if rec.get("best_epoch"):
        final["best_epoch"] = rec["best_epoch"]
    results: dict[str, Any] = {
        "rounds": rounds,
        "final": final,
        "plan": plan,
        "history": [],
        "n_labeled": rec.get("n_labeled", 0),
    }
    if rec.get("domain_stats"):
        results["domain_stats"] = rec["domain_stats"]
    return {"seed": rec["seed"], "config": rec["config"], "results": results}


def _method_of(cfg: dict[str, Any]) -> str:
    strategy = cfg["active"]["strategy"]
    if strategy == "none":
        return "source_only"
    gamma = cfg["train"]["gamma"]
    return strategy if gamma > 0 or strategy == "random" else f"{strategy} (gamma=0)"


def _sorted(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    bad = [i for i, r in enumerate(runs) if not {"seed", "config", "results"} <= set(r)]
    if bad:
        raise ValueError(f"run record {bad[0] + 1} lacks seed/config/results: not an eada run")
    return sorted(runs, key=lambda r: int(r["seed"]))


def load_report_input(path: Path) -> ReportInput:
    """Find the runs under ``path`` (see the module docstring for the layouts).

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no ``runs.jsonl``.
        ValueError: a ``runs.jsonl`` holds something other than eada run records.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"report input {path} is not a folder")
    log = path / "runs.jsonl"
    if jsonl_exists(log):
        records = read_jsonl(log)
        if not records:
            raise ValueError(f"{log} holds no finished run")
        extra: dict[str, Any] = {}
        results = path / "results.json"
        if results.exists():
            extra["results"] = json.loads(results.read_text())
        if all(is_bench_line(r) for r in records):
            from eada.hparams import variant_label

            keyed: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
            for r in records:
                var = f" [{variant_label(r['variant'])}]" if r.get("variant") else ""
                key = (r["task"], r["method"] + var, _label(r["method"]) + var)
                keyed.setdefault(key, []).append(expand_bench_line(r))
            groups = [
                RunGroup(task, method, label, _sorted(runs), path)
                for (task, method, label), runs in keyed.items()
            ]
            return ReportInput(path, "bench", groups, extra)
        if any("method" in r for r in records):
            methods = list(dict.fromkeys(str(r.get("method", "?")) for r in records))
            groups = [
                RunGroup(
                    task=str(records[0]["config"].get("name", "toy")),
                    method=m,
                    label=_label(m),
                    runs=_sorted([r for r in records if r.get("method") == m]),
                    path=path,
                )
                for m in methods
            ]
            return ReportInput(path, "demo", groups, extra)
        runs = _sorted(records)
        cfg = runs[0]["config"]
        m = _method_of(cfg)
        group = RunGroup(str(cfg.get("name", path.name)), m, _label(m), runs, path)
        return ReportInput(path, "run", [group], extra)
    logs = find_jsonl(path, "*/runs.jsonl") + find_jsonl(path, "*/*/runs.jsonl")
    groups = []
    for lg in logs:
        records = read_jsonl(lg)
        if not records:
            continue
        method = lg.parent.name
        task = lg.parent.parent.name if lg.parent.parent != path else path.name
        groups.append(RunGroup(task, method, _label(method), _sorted(records), lg.parent))
    if not groups:
        raise FileNotFoundError(
            f"no runs under {path}: expected runs.jsonl, <method>/runs.jsonl or "
            "<task>/<method>/runs.jsonl"
        )
    extra = {}
    summary = path.with_suffix(".json")
    if summary.is_file():
        try:
            extra["summary"] = json.loads(summary.read_text())
        except json.JSONDecodeError:
            pass  # a benchmark is writing it right now; the runs are the source of truth
    return ReportInput(path, "bench", groups, extra)


def mean_std(values: list[float]) -> dict[str, float | None]:
    """Mean and sample std of ``values`` (``None`` for both when empty)."""
    return summarize([float(v) for v in values]) if values else {"mean": None, "std": None}


def round_rows(group: RunGroup, split: str = "target") -> list[dict[str, Any]]:
    """Per-round rows (mean/std over the seeds that reached the round): labeled count and %,
    accuracy after that round's training, error rate on the queried samples, timings."""
    rows = []
    n_rounds = min(len(r["results"]["rounds"]) for r in group.runs)
    for i in range(n_rounds):
        recs = [r["results"]["rounds"][i] for r in group.runs]
        n_lab = int(recs[0]["n_labeled"])
        row: dict[str, Any] = {
            "round": i,
            "n_labeled": n_lab,
            "labeled_pct": 100.0 * n_lab / max(group.n_target, 1),
        }
        for sp in (split, "heldout"):
            vals = [
                x["after_training"][sp]["accuracy"]
                for x in recs
                if sp in x.get("after_training", {})
            ]
            row[f"{sp}_accuracy"] = mean_std(vals)
            row[f"{sp}_epoch"] = recs[0].get("after_training", {}).get("epoch")
        for key in ("selected_error_rate", "selection_seconds", "scoring_seconds"):
            vals = [x[key] for x in recs if key in x]
            row[key] = mean_std(vals)
        rows.append(row)
    return rows


def final_stat(group: RunGroup, split: str = "target", which: str = "last_epoch") -> dict[str, Any]:
    """Mean/std over seeds of the final accuracy on ``split`` (``None`` when absent)."""
    vals = [
        r["results"]["final"][which][split]["accuracy"]
        for r in group.runs
        if split in r["results"]["final"].get(which, {})
    ]
    return mean_std(vals)


def accuracy_curve(
    group: RunGroup, split: str = "target"
) -> tuple[list[float], list[float], list[float]]:
    """``(labeled %, mean accuracy, std)`` after every round; a run without rounds gives its
    final accuracy at 0 %."""
    if not group.has_rounds:
        st = final_stat(group, split)
        if st["mean"] is None:
            return [], [], []
        return [0.0], [float(st["mean"])], [float(st["std"] or 0.0)]
    xs, ms, ss = [], [], []
    for row in round_rows(group, split):
        st = row[f"{split}_accuracy"]
        if st["mean"] is None:
            continue
        xs.append(row["labeled_pct"])
        ms.append(float(st["mean"]))
        ss.append(float(st["std"] or 0.0))
    return xs, ms, ss


def domain_stats(group: RunGroup) -> list[dict[str, Any]]:
    """The ``domain_stats`` of every seed that recorded them (older runs have none)."""
    return [r["results"]["domain_stats"] for r in group.runs if "domain_stats" in r["results"]]


def features_fixed(group: RunGroup) -> bool:
    """Whether the recorded features cannot change during training (a linear model)."""
    stats = domain_stats(group)
    return bool(stats and stats[0]["snapshots"] and stats[0]["snapshots"][0].get("features_fixed"))


def distance_series(
    group: RunGroup,
) -> tuple[list[str], list[float], list[float], list[float], list[float]] | None:
    """Per snapshot stage: A-distance and MMD^2 mean/std over seeds (``None`` without data)."""
    stats = [d for d in domain_stats(group) if d["snapshots"] and "a_distance" in d["snapshots"][0]]
    if not stats:
        return None
    n = min(len(d["snapshots"]) for d in stats)
    stages = [stats[0]["snapshots"][i]["stage"] for i in range(n)]
    a_m, a_s, m_m, m_s = [], [], [], []
    for i in range(n):
        a = mean_std([d["snapshots"][i]["a_distance"] for d in stats])
        m = mean_std([d["snapshots"][i]["mmd2"] for d in stats])
        a_m.append(float(a["mean"] or 0.0))
        a_s.append(float(a["std"] or 0.0))
        m_m.append(float(m["mean"] or 0.0))
        m_s.append(float(m["std"] or 0.0))
    return stages, a_m, a_s, m_m, m_s


def selected_error_series(group: RunGroup) -> tuple[list[int], list[float], list[float]] | None:
    """``(rounds, mean, std)`` of the error rate on queried samples (``None`` without rounds)."""
    rows = [
        r
        for r in round_rows(group)
        if r["round"] > 0 and r["selected_error_rate"]["mean"] is not None
    ]
    if not rows:
        return None
    return (
        [r["round"] for r in rows],
        [float(r["selected_error_rate"]["mean"]) for r in rows],
        [float(r["selected_error_rate"]["std"] or 0.0) for r in rows],
    )


def mean_free_energy_gap(snapshot: dict[str, Any]) -> float:
    """Mean target minus mean source free energy of one snapshot (the "free energy bias")."""
    fe = snapshot["free_energy"]
    return float(np.mean(fe["target"]) - np.mean(fe["source"]))


def data_changes(inp: ReportInput) -> list[str]:
    """What changed in the data of the report's runs since they ran: per run group, the input
    files whose digest differs from the one its run records hold
    (:func:`eada.runs.input_differences` against :func:`eada.data.identity.data_inputs` now),
    as ``"TASK METHOD: target /d/t.npz: sha256:.. -> sha256:.. (content changed)"`` lines;
    an input that cannot be read now is named as such. Runs recorded without their inputs
    (older runs, benchmark lines) are not checked."""
    from eada.config import parse_config
    from eada.data.identity import data_inputs
    from eada.runs import input_differences

    out: list[str] = []
    for g in inp.groups:
        stored = next((r.get("inputs") for r in g.runs if r.get("inputs") is not None), None)
        if stored is None:
            continue
        try:
            cfg = parse_config(g.config, f"{g.path}")
            now = data_inputs(cfg.data, cfg.model)
        except (OSError, ValueError) as err:
            out.append(f"{g.task} {g.method}: the data cannot be read now ({err})")
            continue
        out += [f"{g.task} {g.method}: {d}" for d in input_differences(stored, now)]
    return out
