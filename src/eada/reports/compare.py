r"""Comparisons with significance (``eada report --compare``): which differences between methods
a grid's records support, per task and across tasks.

Input: the finished lines of ``runs.jsonl`` logs (``eada bench``), or any table of per-seed
scores (:class:`Scores`; ``benchmarks/leaderboard.py`` builds one from its cells). A *row* is a
method, its sweep variant and any setting that tells two of its configs apart on one task (two
folders of one method with another ``--set``); a *task* is the record's task and its config's
``name`` (the 12 SURF pairs share one YAML file).

What is tested (:func:`compare`):

* **per task**, each row against the reference row (default: the method ``eada``), seeds
  paired: the two-sided **paired t-test** (``scipy.stats.ttest_rel``) on the seeds both have,
  Holm-corrected over the rows of that task (:func:`holm`). The t-test and not the Wilcoxon
  signed-rank test because with 3 seeds the smallest two-sided Wilcoxon p-value is 0.25: it
  can never reject. Fewer than 2 paired seeds: no test (``p`` is ``null``, ``note`` says why);
  the same score on every seed: no test either (``identical``); a difference that is the same
  on every seed leaves the t statistic undefined: no test (``note``).
* **across tasks**, on each row's mean over seeds per task: the **Friedman** test
  (``scipy.stats.friedmanchisquare``; 3 rows or more; every row tied on every task, where
  scipy divides 0 by 0: statistic 0, p = 1), the mean ranks (1 = best, ties
  averaged), the **Nemenyi** post-hoc test with its critical difference (Demšar 2006;
  ``scikit_posthocs.posthoc_nemenyi_friedman``) and the **Wilcoxon signed-rank** test of every
  pair, **Holm-corrected** (``scikit_posthocs.posthoc_wilcoxon``; what Benavoli et al. 2016
  advise over mean-rank tests, whose verdict on two methods depends on the others compared).
  The critical-difference diagram (``scikit_posthocs.critical_difference_diagram``) joins the
  rows that the chosen post-hoc test (default Holm-Wilcoxon) does not tell apart at ``alpha``.
* the **Bayesian signed-rank test** (``baycomp``, Benavoli et al. 2017) of each row against
  the reference across tasks, with a region of practical equivalence (ROPE, default 1 point of
  accuracy): the probabilities that the row is better by more than the ROPE, within it, or
  worse; a verdict where one is above 0.95. Its Monte Carlo samples use a fixed seed, so the
  same input gives the same numbers.

The across-task tests need every row on every task: rows and tasks with missing cells are
dropped (greedily, whichever misses the larger share; the reference row is never dropped) and
``comparison.json`` lists each with the reason.

Why these libraries: scipy has the Friedman, t and Wilcoxon tests; scikit-posthocs the
post-hoc tests and a critical-difference diagram drawn from any post-hoc p-value matrix;
baycomp is the reference implementation of the Bayesian signed-rank test. autorank (which wraps
the same tests) is not used: it refuses fewer than 5 tasks, chooses the omnibus test itself
from normality checks (so the test a table names could change with the data), and draws no
diagram when its omnibus test is not significant. They are the optional extra ``stats``
(``pip install 'eada[stats]'``), imported only here.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eada.hparams import method_label, variant_label
from eada.reports.tables import TABLE_ORDER, render_table, task_label
from eada.runs import find_jsonl, jsonl_exists, read_jsonl, write_bytes_atomic

POSTHOCS = ("wilcoxon-holm", "nemenyi")
"""The post-hoc tests whose verdicts the critical-difference diagram can draw."""


DECIMALS = 9
"""Scores and their differences are rounded to this many decimals before a test, so that the
order of a float sum (the same seeds' mean taken in another order) is no difference."""


class ComparisonError(ValueError):
    """A comparison that cannot be made: no records, an unknown reference, too few methods or
    tasks, or the ``stats`` extra missing."""


@dataclass(frozen=True)
class Row:
    """One compared row: a method, its sweep variant and the settings that set it apart."""

    label: str
    method: str
    variant: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()


@dataclass
class Scores:
    """Per-seed scores: ``values[task][row label][seed]``, with the rows and tasks in order."""

    metric: str
    rows: list[Row]
    tasks: list[str]
    values: dict[str, dict[str, dict[int, float]]]
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _stats_modules() -> tuple[Any, Any, Any]:
    """scipy.stats, scikit_posthocs and baycomp, or a clear error naming the extra."""
    try:
        import baycomp
        import scikit_posthocs
        from scipy import stats
    except ImportError as err:
        raise ComparisonError(
            f"--compare needs the stats extra ({err.name} is missing): pip install 'eada[stats]'"
        ) from None
    return stats, scikit_posthocs, baycomp


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` (the same numbers as statsmodels'
    ``multipletests(method="holm")``, which scikit-posthocs uses, without its ``gc.collect()``
    of nearly a second a call).

    >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
    [0.03, 0.06, 0.06]
    """
    m = len(pvalues)
    order = np.argsort(pvalues, kind="stable")
    adjusted = np.minimum(
        1.0, np.maximum.accumulate([(m - i) * pvalues[j] for i, j in enumerate(order)])
    )
    out = np.empty(m)
    out[order] = adjusted
    return [float(p) for p in out]


# -- reading records ----------------------------------------------------------------------------
def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"a.b.c": json value}``."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(value, sort_keys=True)}


def log_paths(paths: list[Path]) -> list[Path]:
    """The ``runs.jsonl`` logs ``paths`` name: a log itself (plain or ``.xz``), or every log
    under a folder. Raises ``FileNotFoundError`` naming a path that holds none."""
    logs: list[Path] = []
    for p in paths:
        p = Path(p)
        plain = p.with_suffix("") if p.suffix == ".xz" else p
        if p.is_dir():
            found = find_jsonl(p)
            if not found:
                raise FileNotFoundError(f"{p}: no runs.jsonl (or runs.jsonl.xz) under it")
            logs += found
        elif jsonl_exists(plain):
            logs.append(plain)
        else:
            raise FileNotFoundError(f"{p}: no such runs.jsonl or folder")
    return list(dict.fromkeys(logs))


def scores_from_records(
    records: list[dict[str, Any]], metric: str = "target/accuracy", sources: list[str] | None = None
) -> Scores:
    """The :class:`Scores` of ``eada bench`` lines (finished runs).

    A row is the method and its sweep variant; where one task holds two configs of the same
    row (two folders run with another ``--set``), the keys both configs have and that differ
    name the rows apart on every task alike (``EADA [train.fea_gate=none]``; a key that one
    config lacks, a record older than the key, is no difference). Two lines of one cell and
    seed (a re-run, or an older record of the same settings): the newest (``time_utc``)
    counts, the others are noted.
    Lines without ``metric`` are skipped and counted in ``notes``; a value that is not a finite
    number (a diverged run's NaN) is skipped and named there.
    """
    usable, skipped, not_finite = [], 0, []
    for r in records:
        if not all(k in r for k in ("task", "method", "seed", "final")) or metric not in (
            r.get("final") or {}
        ):
            skipped += 1
            continue
        value = r["final"][metric]
        if not isinstance(value, int | float) or not math.isfinite(value):
            not_finite.append(f"{r['task']} / {r['method']} / seed {r['seed']}: {value!r}")
            continue
        usable.append(r)
    notes = [f"{skipped} line(s) without {metric} skipped"] if skipped else []
    if not_finite:
        notes.append(f"{metric} not a finite number, skipped: " + "; ".join(not_finite))
    if not usable:
        raise ComparisonError(f"no finished run records with {metric} to compare")

    def task_of(r: dict[str, Any]) -> tuple[str, str]:
        return (r["task"], str((r.get("config") or {}).get("name") or r["task"]))

    def settings(r: dict[str, Any]) -> dict[str, str]:
        flat = _flat(r.get("config") or {})
        flat.pop("seed", None)
        return flat

    group = lambda r: (r["method"], tuple(r.get("variant") or ()))  # noqa: E731
    # keys that differ between configs of one (method, variant) within one task
    distinguishing: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    by_cell: dict[tuple[Any, ...], list[dict[str, str]]] = {}
    for r in usable:
        by_cell.setdefault((group(r), task_of(r)), []).append(settings(r))
    for (g, _), configs in by_cell.items():
        keys = distinguishing.setdefault(g, set())
        for i, a in enumerate(configs):  # a key only some configs have is no difference
            for b in configs[i + 1 :]:
                keys |= {k for k in a.keys() & b.keys() if a[k] != b[k]}
    names_per_task: dict[str, set[str]] = {}
    for r in usable:
        names_per_task.setdefault(r["task"], set()).add(task_of(r)[1])

    def task_name(r: dict[str, Any]) -> str:
        task, name = task_of(r)
        return task_label(task) if len(names_per_task[task]) == 1 else name

    rows: dict[str, Row] = {}
    chosen: dict[tuple[str, str, int], dict[str, Any]] = {}
    duplicates = 0
    for r in usable:
        method, variant = group(r)
        flat = settings(r)
        shown = sorted(distinguishing.get((method, variant), set()))
        setting = tuple(f"{k}={json.loads(flat[k])}" for k in shown if k in flat)
        var = variant_label(list(variant))
        label = method_label(method) + (f" ({var})" if var else "")
        label += f" [{', '.join(setting)}]" if setting else ""
        rows.setdefault(label, Row(label, method, variant, setting))
        cell = (task_name(r), label, int(r["seed"]))
        if cell in chosen:
            duplicates += 1
            if str(r.get("time_utc", "")) < str(chosen[cell].get("time_utc", "")):
                continue
        chosen[cell] = r
    if duplicates:
        notes.append(f"{duplicates} line(s) of a run already read (a re-run): the newest counts")
    values: dict[str, dict[str, dict[int, float]]] = {}
    for (task, label, seed), r in chosen.items():
        values.setdefault(task, {}).setdefault(label, {})[seed] = float(r["final"][metric])
    rank = {m: i for i, m in enumerate(TABLE_ORDER)}
    ordered = sorted(rows.values(), key=lambda w: (rank.get(w.method, len(rank)), w.label))
    return Scores(metric, ordered, sorted(values), values, sources or [], notes)


def load_scores(paths: list[Path], metric: str = "target/accuracy") -> Scores:
    """:func:`scores_from_records` of the logs ``paths`` name (folders or ``runs.jsonl``)."""
    logs = log_paths(paths)
    records = [r for log in logs for r in read_jsonl(log)]
    return scores_from_records(records, metric, [p.as_posix() for p in logs])


# -- the tests ----------------------------------------------------------------------------------
def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else 0.0)


def _select_rows(scores: Scores, methods: list[str] | None) -> list[Row]:
    if not methods:
        return list(scores.rows)
    rows = [r for r in scores.rows if r.method in methods or r.label in methods]
    unknown = [m for m in methods if not any(m in (r.method, r.label) for r in scores.rows)]
    if unknown:
        known = ", ".join(r.label for r in scores.rows)
        raise ComparisonError(f"--methods: no rows of {', '.join(unknown)} (rows: {known})")
    return rows


def reference_row(scores: Scores, rows: list[Row], reference: str) -> Row:
    """The row ``reference`` names: its label; else the row of that method, or of its rows the
    one with scores on the most tasks (a tie between two is an error naming them)."""
    exact = [r for r in rows if r.label == reference]
    if exact:
        return exact[0]
    of_method = [r for r in rows if r.method == reference]
    if not of_method:
        labels = ", ".join(repr(r.label) for r in rows)
        raise ComparisonError(f"reference {reference!r} is not among the rows ({labels})")

    def n_tasks(row: Row) -> int:
        return sum(bool(scores.values.get(t, {}).get(row.label)) for t in scores.tasks)

    most = max(n_tasks(r) for r in of_method)
    best = [r for r in of_method if n_tasks(r) == most]
    if len(best) > 1:
        labels = ", ".join(repr(r.label) for r in best)
        raise ComparisonError(
            f"reference {reference!r} names {len(best)} rows on {most} tasks each ({labels}); "
            "give one label"
        )
    return best[0]


def _paired_test(
    stats: Any, ref: dict[int, float], other: dict[int, float], min_pairs: int = 2
) -> dict[str, Any]:
    """The paired t-test of ``other`` against ``ref`` on their common seeds."""
    seeds = sorted(set(ref) & set(other))
    out: dict[str, Any] = {"n_pairs": len(seeds), "seeds": seeds, "p": None}
    if not seeds:
        out["note"] = "no seed in common with the reference"
        return out
    diff = np.round([other[s] - ref[s] for s in seeds], DECIMALS)
    out["mean_difference"] = float(diff.mean())
    if len(seeds) < min_pairs:
        out["note"] = f"fewer than {min_pairs} paired seeds: no test"
    elif np.all(diff == 0):
        out["note"] = "identical on every paired seed"
    elif np.ptp(diff) == 0:
        out["note"] = "the same difference on every seed: the t statistic is undefined"
    else:
        res = stats.ttest_rel([other[s] for s in seeds], [ref[s] for s in seeds])
        out["t"] = float(res.statistic)
        out["p"] = float(res.pvalue)
    return out


def _complete_block(
    scores: Scores, rows: list[str], reference: str
) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    """Rows and tasks with a value on every pair; what was dropped, with the reason."""
    tasks = list(scores.tasks)
    keep = list(rows)
    dropped_rows: dict[str, str] = {}
    dropped_tasks: dict[str, str] = {}

    def has(t: str, r: str) -> bool:
        return bool(scores.values.get(t, {}).get(r))

    for t in list(tasks):
        if not has(t, reference):
            tasks.remove(t)
            dropped_tasks[t] = "the reference has no value on it"
    while tasks and keep:
        row_miss = {r: [t for t in tasks if not has(t, r)] for r in keep}
        task_miss = {t: [r for r in keep if not has(t, r)] for t in tasks}
        worst_row = max(keep, key=lambda r: len(row_miss[r]) / len(tasks))
        worst_task = max(tasks, key=lambda t: len(task_miss[t]) / len(keep))
        r_share = len(row_miss[worst_row]) / len(tasks)
        t_share = len(task_miss[worst_task]) / len(keep)
        if r_share == 0 and t_share == 0:
            break
        if r_share >= t_share and worst_row != reference:
            keep.remove(worst_row)
            dropped_rows[worst_row] = "no value on " + ", ".join(row_miss[worst_row])
        else:
            tasks.remove(worst_task)
            dropped_tasks[worst_task] = "no value of " + ", ".join(task_miss[worst_task])
    return keep, tasks, dropped_rows, dropped_tasks


def nemenyi_cd(stats: Any, k: int, n: int, alpha: float) -> float:
    """The critical difference of mean ranks for ``k`` methods on ``n`` tasks (Demšar 2006):
    ``q_alpha sqrt(k (k + 1) / (6 n))``, ``q_alpha`` the studentized range quantile / sqrt 2."""
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return float(q * math.sqrt(k * (k + 1) / (6 * n)))


def compare(
    scores: Scores,
    reference: str = "eada",
    *,
    alpha: float = 0.05,
    rope: float = 1.0,
    posthoc: str = "wilcoxon-holm",
    methods: list[str] | None = None,
    seed: int = 0,
    bayes_samples: int = 10000,
) -> dict[str, Any]:
    """Every test of the module's docstring on ``scores``: the content of ``comparison.json``.

    Args:
        scores: per-seed scores (:func:`load_scores`, :func:`scores_from_records`).
        reference: the row the others are tested against (a label, or a method: its row on
            the most tasks).
        alpha: the significance level of every test (after Holm's correction where named).
        rope: half-width of the Bayesian test's region of practical equivalence, in the
            metric's unit (accuracy points).
        posthoc: which post-hoc test the diagram draws (:data:`POSTHOCS`).
        methods: compare only these rows (methods or labels); default all.
        seed: the seed of the Bayesian test's Monte Carlo samples.
        bayes_samples: how many posterior samples the Bayesian test draws.

    Raises:
        ComparisonError: an unknown reference, posthoc, method or alpha, or the stats extra
            missing.
    """
    if posthoc not in POSTHOCS:
        raise ComparisonError(f"unknown post-hoc test {posthoc!r}; use {' or '.join(POSTHOCS)}")
    if not 0 < alpha < 1:
        raise ComparisonError(f"alpha must be between 0 and 1, got {alpha}")
    if rope < 0:
        raise ComparisonError(f"rope must be >= 0, got {rope}")
    stats, sp, baycomp = _stats_modules()
    rows = _select_rows(scores, methods)
    ref = reference_row(scores, rows, reference)
    labels = [r.label for r in rows]

    per_task: dict[str, Any] = {}
    for t in scores.tasks:
        cells = scores.values.get(t, {})
        out_cells: dict[str, Any] = {}
        for r in labels:
            if cells.get(r):
                mean, std = _mean_std(list(cells[r].values()))
                seeds = {str(s): v for s, v in sorted(cells[r].items())}
                out_cells[r] = {"seeds": seeds, "mean": mean, "std": std, "n": len(seeds)}
        tests: dict[str, Any] = {}
        if ref.label in out_cells:
            for r in labels:
                if r != ref.label and r in out_cells:
                    tests[r] = _paired_test(stats, cells[ref.label], cells[r])
            tested = [r for r in tests if tests[r]["p"] is not None]
            if tested:
                adj = holm([tests[r]["p"] for r in tested])
                for r, p in zip(tested, adj, strict=True):
                    tests[r]["p_holm"] = float(p)
            for test in tests.values():
                sig = test.get("p_holm") is not None and test["p_holm"] < alpha
                test["significant"] = bool(sig)
                if sig:
                    test["verdict"] = "better" if test["mean_difference"] > 0 else "worse"
                else:
                    test["verdict"] = "no significant difference" if test["p"] is not None else None
        per_task[t] = {"cells": out_cells, "vs_reference": tests}

    keep, tasks, dropped_rows, dropped_tasks = _complete_block(scores, labels, ref.label)
    across: dict[str, Any] = {
        "rows": keep,
        "tasks": tasks,
        "dropped_rows": dropped_rows,
        "dropped_tasks": dropped_tasks,
        "value": "each row's mean over its seeds on each task",
    }
    if len(keep) >= 2 and len(tasks) >= 2:
        across.update(
            _across_tasks(
                stats,
                sp,
                baycomp,
                scores,
                keep,
                tasks,
                ref.label,
                alpha=alpha,
                rope=rope,
                posthoc=posthoc,
                seed=seed,
                bayes_samples=bayes_samples,
            )
        )
    else:
        across["note"] = (
            f"{len(keep)} row(s) on {len(tasks)} task(s) with every value: the across-task "
            "tests need 2 rows or more on 2 tasks or more"
        )
    summary = _counts(per_task, ref.label, labels)
    return {
        "metric": scores.metric,
        "sources": scores.sources,
        "notes": scores.notes,
        "reference": ref.label,
        "alpha": alpha,
        "rope": rope,
        "posthoc": posthoc,
        "seed": seed,
        "bayes_samples": bayes_samples,
        "tests": {
            "per_task": "paired t-test (scipy.stats.ttest_rel, two-sided) of each row against "
            "the reference on the seeds both have, Holm-corrected over the rows of the task; "
            "no test with fewer than 2 paired seeds",
            "friedman": "scipy.stats.friedmanchisquare on the rows' per-task means",
            "nemenyi": "scikit_posthocs.posthoc_nemenyi_friedman; critical difference of mean "
            "ranks (Demsar 2006)",
            "wilcoxon_holm": "scikit_posthocs.posthoc_wilcoxon (zero_method wilcox), "
            "Holm-corrected over every pair",
            "wilcoxon_vs_reference": "scipy.stats.wilcoxon of each row against the reference "
            "alone (one pair: no correction)",
            "bayesian_signed_rank": f"baycomp.SignedRankTest, ROPE {rope:g}, prior 0.5, "
            f"{bayes_samples} samples, random_state {seed}; a verdict where one probability "
            "exceeds 0.95",
        },
        "rows": [
            {
                "label": r.label,
                "method": r.method,
                "variant": list(r.variant),
                "settings": list(r.settings),
            }
            for r in rows
        ],
        "tasks": per_task,
        "against_reference": summary,
        "across_tasks": across,
    }


def _counts(per_task: dict[str, Any], ref: str, labels: list[str]) -> dict[str, Any]:
    """Per row: on how many tasks it is significantly better / worse than the reference."""
    out = {}
    for r in labels:
        if r == ref:
            continue
        tests = {
            t: info["vs_reference"][r] for t, info in per_task.items() if r in info["vs_reference"]
        }
        out[r] = {
            "tasks": len(tests),
            "better": [t for t, v in tests.items() if v.get("verdict") == "better"],
            "worse": [t for t, v in tests.items() if v.get("verdict") == "worse"],
            "untested": sum(v["p"] is None for v in tests.values()),
        }
    return out


def _across_tasks(
    stats: Any,
    sp: Any,
    baycomp: Any,
    scores: Scores,
    rows: list[str],
    tasks: list[str],
    ref: str,
    *,
    alpha: float,
    rope: float,
    posthoc: str,
    seed: int,
    bayes_samples: int,
) -> dict[str, Any]:
    import warnings

    matrix = np.round(
        [[float(np.mean(list(scores.values[t][r].values()))) for r in rows] for t in tasks],
        DECIMALS,
    )  # tasks x rows
    ranks = np.array([stats.rankdata(-line) for line in matrix])
    mean_ranks = {r: float(v) for r, v in zip(rows, ranks.mean(axis=0), strict=True)}
    out: dict[str, Any] = {
        "means": {r: float(v) for r, v in zip(rows, matrix.mean(axis=0), strict=True)},
        "mean_ranks": mean_ranks,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all tied: nan, handled below
        if len(rows) >= 3:
            tied = bool(np.all(matrix == matrix[:, :1]))
            fr = stats.friedmanchisquare(*matrix.T)
            out["friedman"] = {  # every row tied on every task: scipy's 0/0, no difference
                "statistic": 0.0 if tied else float(fr.statistic),
                "p_value": 1.0 if tied else float(fr.pvalue),
                "n_tasks": len(tasks),
                "n_methods": len(rows),
                "significant": not tied and float(fr.pvalue) < alpha,
            }
            if tied:
                out["friedman"]["note"] = "every row tied on every task: statistic 0, p = 1"
        else:
            out["friedman"] = {
                "statistic": None,
                "p_value": None,
                "n_tasks": len(tasks),
                "n_methods": len(rows),
                "significant": False,
                "note": "the Friedman test needs 3 rows or more; see the Wilcoxon test",
            }
        nem = sp.posthoc_nemenyi_friedman(matrix)
        wil = sp.posthoc_wilcoxon(list(matrix.T), zero_method="wilcox", p_adjust="holm")
    nem_p = np.nan_to_num(nem.to_numpy(dtype=float), nan=1.0)
    wil_p = np.nan_to_num(wil.to_numpy(dtype=float), nan=1.0)
    np.fill_diagonal(nem_p, 1.0)
    np.fill_diagonal(wil_p, 1.0)

    def as_dict(m: np.ndarray) -> dict[str, dict[str, float]]:
        return {a: {b: float(m[i, j]) for j, b in enumerate(rows)} for i, a in enumerate(rows)}

    out["nemenyi"] = {"cd": nemenyi_cd(stats, len(rows), len(tasks), alpha), "p": as_dict(nem_p)}
    out["wilcoxon_holm"] = {"p": as_dict(wil_p)}
    chosen = wil_p if posthoc == "wilcoxon-holm" else nem_p
    pairs = []
    for i, a in enumerate(rows):
        for j in range(i + 1, len(rows)):
            if chosen[i, j] < alpha:
                b = rows[j]
                better, worse = (a, b) if mean_ranks[a] < mean_ranks[b] else (b, a)
                pairs.append({"better": better, "worse": worse, "p": float(chosen[i, j])})
    out["significant_pairs"] = sorted(pairs, key=lambda d: d["p"])
    col = {r: matrix[:, i] for i, r in enumerate(rows)}
    direct: dict[str, Any] = {}  # each row against the reference alone, no correction
    for r in rows:
        if r == ref:
            continue
        diff = col[r] - col[ref]
        entry: dict[str, Any] = {
            "mean_difference": float(diff.mean()),
            "tasks_ahead": int((diff > 0).sum()),
            "tasks_behind": int((diff < 0).sum()),
            "p": 1.0,
        }
        if np.any(diff != 0):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                entry["p"] = float(stats.wilcoxon(col[r], col[ref], zero_method="wilcox").pvalue)
        direct[r] = entry
    out["wilcoxon_vs_reference"] = direct
    bayes: dict[str, Any] = {}
    for r in rows:
        if r == ref:
            continue
        # baycomp: probabilities of (x better, within the ROPE, y better); x = the row
        p_better, p_rope, p_worse = baycomp.SignedRankTest.probs(
            col[r], col[ref], rope=rope, nsamples=bayes_samples, random_state=seed
        )
        verdict = "undecided"
        for name, p in (("better", p_better), ("equivalent", p_rope), ("worse", p_worse)):
            if p > 0.95:
                verdict = name
        bayes[r] = {
            "p_better": float(p_better),
            "p_rope": float(p_rope),
            "p_worse": float(p_worse),
            "verdict": verdict,
        }
    out["bayesian_signed_rank"] = bayes
    return out


# -- outputs ------------------------------------------------------------------------------------
def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"


def comparison_markdown(result: dict[str, Any]) -> str:
    """The comparison as Markdown: per task mean ± std with the marks of the paired tests, then
    the across-task tests in words and numbers."""
    ref = result["reference"]
    alpha = result["alpha"]
    labels = [r["label"] for r in result["rows"]]
    head = ["Task", *labels]
    body = []
    for t, info in result["tasks"].items():
        line = [t]
        for r in labels:
            c = info["cells"].get(r)
            if c is None:
                line.append("-")
                continue
            text = f"{c['mean']:.1f} ± {c['std']:.1f}"
            test = info["vs_reference"].get(r)
            if test and test.get("verdict") == "better":
                text += " ▲"
            elif test and test.get("verdict") == "worse":
                text += " ▼"
            elif test and test["p"] is None and r != ref:
                text += " ·"
            line.append(text)
        body.append(line)
    parts = [
        f"**{result['metric']}, mean ± std over seeds; against {ref}: ▲ significantly better, "
        f"▼ significantly worse (paired t-test over seeds, Holm-corrected within the task, "
        f"alpha {alpha:g}), · not tested (fewer than 2 paired seeds or no variation)**",
        render_table(head, body),
    ]
    across = result["across_tasks"]
    if "mean_ranks" not in across:
        parts.append(across.get("note", ""))
    else:
        fr = across["friedman"]
        ranks = across["mean_ranks"]
        order = sorted(ranks, key=lambda r: ranks[r])
        head = [
            "Method",
            "Mean rank",
            "Mean",
            f"Wilcoxon p vs {ref}: alone / Holm over all pairs",
            f"Nemenyi p vs {ref}",
            f"P(better) / P(ROPE) / P(worse) vs {ref}",
            "tasks better / worse (per task)",
        ]
        body = []
        for r in order:
            bay = across["bayesian_signed_rank"].get(r)
            cnt = result["against_reference"].get(r)
            body.append(
                [
                    r,
                    f"{ranks[r]:.2f}",
                    f"{across['means'][r]:.1f}",
                    "-"
                    if r == ref
                    else f"{_fmt_p(across['wilcoxon_vs_reference'][r]['p'])} / "
                    f"{_fmt_p(across['wilcoxon_holm']['p'][r][ref])}",
                    "-" if r == ref else _fmt_p(across["nemenyi"]["p"][r][ref]),
                    "-"
                    if bay is None
                    else f"{bay['p_better']:.2f} / {bay['p_rope']:.2f} / {bay['p_worse']:.2f}"
                    f" ({bay['verdict']})",
                    "-" if cnt is None else f"{len(cnt['better'])} / {len(cnt['worse'])}",
                ]
            )
        fr_text = (
            f"Friedman chi² = {fr['statistic']:.2f}, p = {_fmt_p(fr['p_value'])}"
            if fr["p_value"] is not None
            else f"Friedman: {fr.get('note', 'no test')}"
        )
        parts.append(
            f"**Across {len(across['tasks'])} tasks, {len(across['rows'])} methods: {fr_text}; "
            f"Nemenyi critical difference {across['nemenyi']['cd']:.2f} ranks; Bayesian "
            f"signed-rank ROPE ± {result['rope']:g}**"
        )
        parts.append(render_table(head, body))
        pairs = across["significant_pairs"]
        name = "Holm-corrected Wilcoxon" if result["posthoc"] == "wilcoxon-holm" else "Nemenyi"
        parts.append(
            f"Significant pairs ({name}, alpha {alpha:g}): "
            + (
                "; ".join(f"{d['better']} > {d['worse']} (p {_fmt_p(d['p'])})" for d in pairs)
                or "none"
            )
        )
        dropped = [f"{r} ({why})" for r, why in across["dropped_rows"].items()]
        dropped += [f"task {t} ({why})" for t, why in across["dropped_tasks"].items()]
        if dropped:
            parts.append("Left out of the across-task tests: " + "; ".join(dropped))
    if result["notes"]:
        parts.append("Notes: " + "; ".join(result["notes"]))
    return "\n\n".join(parts) + "\n"


def cd_diagram(result: dict[str, Any]) -> Any:
    """The critical-difference diagram (a matplotlib Figure): mean ranks on an axis, a bar
    joining the rows the chosen post-hoc test does not tell apart at ``alpha``, and for Nemenyi
    the critical difference. Raises :class:`ComparisonError` when there is nothing to draw."""
    _stats_modules()
    import pandas as pd
    import scikit_posthocs as sp
    from matplotlib.figure import Figure

    across = result["across_tasks"]
    if "mean_ranks" not in across:
        raise ComparisonError(across.get("note", "no across-task comparison to draw"))
    rows = across["rows"]
    key = "wilcoxon_holm" if result["posthoc"] == "wilcoxon-holm" else "nemenyi"
    sig = pd.DataFrame(
        [[across[key]["p"][a][b] for b in rows] for a in rows], index=rows, columns=rows
    )
    ranks = pd.Series(across["mean_ranks"])
    fig = Figure(figsize=(8, 0.5 + 0.28 * len(rows)))
    ax = fig.add_subplot()
    sp.critical_difference_diagram(
        ranks,
        sig,
        alpha=result["alpha"],
        ax=ax,
        cd=across["nemenyi"]["cd"] if key == "nemenyi" else None,
        label_fmt_left="{label} ({rank:.2f})",
        label_fmt_right="({rank:.2f}) {label}",
    )
    name = "Holm-corrected Wilcoxon" if key == "wilcoxon_holm" else "Nemenyi"
    fr = across["friedman"]["p_value"]
    ax.set_title(
        f"Mean rank on {len(across['tasks'])} tasks (1 = best); bars: no significant "
        f"difference ({name}, alpha {result['alpha']:g}); Friedman p = {_fmt_p(fr)}",
        fontsize=8,
    )
    return fig


def save_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` as SVG or PNG (by ``path``'s suffix) atomically, the same bytes for the same
    figure (no date in the file, fixed SVG ids, text kept as text)."""
    import matplotlib

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png"):
        raise ComparisonError(f"{path}: the diagram is written as .svg or .png")
    meta = {"Date": None} if fmt == "svg" else {"Software": None}
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "eada", "svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, dpi=150, metadata=meta, bbox_inches="tight")
    return write_bytes_atomic(path, buf.getvalue())


def write_comparison(
    result: dict[str, Any], out: Path, formats: tuple[str, ...] = ("svg", "png")
) -> list[Path]:
    """Write ``comparison.json``, ``comparison.md`` and, where the across-task tests ran, the
    diagram as ``cd_diagram.svg`` / ``.png`` (``formats``) into ``out``, each file atomically;
    the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        write_bytes_atomic(out / "comparison.json", (json.dumps(result, indent=1) + "\n").encode()),
        write_bytes_atomic(out / "comparison.md", comparison_markdown(result).encode()),
    ]
    if "mean_ranks" in result["across_tasks"] and formats:
        fig = cd_diagram(result)
        written += [save_figure(fig, out / f"cd_diagram.{ext}") for ext in formats]
    return written
