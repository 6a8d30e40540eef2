"""``eada bench``: one fair grid of tasks x methods x (sweep values) x seeds, resumable, with the
paper's tables.

Every run of the grid uses the SAME preset (data, model, optimiser, epochs, round schedule and
budget); a method only changes what :data:`eada.hparams.METHODS` says (its query strategy, its
own training components, whether ``L_fea`` is on), and ``--set`` overrides apply to every run.
Two reference methods exist only here:

* ``source_only`` (from METHODS): no target labels;
* ``target_supervised``: ALL target labels from the first step (the fully supervised target
  upper bound), no selection.

Sweeps (``--sweep active.alpha1=0.1,0.25,0.5``, repeatable: Cartesian product) add a variant
per value, e.g. the alpha1/alpha2 grid of the paper's Table 3, gamma or delta_s.

Each finished run appends ONE JSON line to ``OUT/runs.jsonl`` (fsynced; it names the code that
ran it: git commit, eada/torch/numpy versions); a re-run skips the runs
already there, so a grid killed half-way picks up where it stopped and, training being
deterministic on a fixed seed, ends with the same accuracy table. A run is known by its task's
identity (a preset's name, a YAML file's resolved path: ``configs/x.yaml``, ``./configs/x.yaml``
and its absolute path are one task), method, sweep variant and seed; a line whose config differs
from the current grid's config for the same run is an error naming the keys (stale results; use
another ``--out``). A run that raises gets a line too (``"status": "failed"``, its error and
where it ran), the grid goes on, and the command exits with status 1 after listing the failed
runs; the same command again tries them again. The runs execute in this process, in ``--jobs``
local workers (one GPU each where there are GPUs: ``--devices``, ``--runs-per-device``) or on a
Dask cluster (``--dask ADDRESS``), see :mod:`eada.executors`; this process alone appends the
lines. Tables (Markdown, LaTeX; :mod:`eada.reports.tables`) are built from the finished lines
only:

* accuracy (paper Tables 1-2): methods x tasks, final target accuracy mean +- std over seeds,
  plus the mean over tasks;
* sweep (paper Table 3): tasks x sweep values for one method;
* query (paper Table 4): query complexity and the query time measured in the same runs
  (strategy only, and scoring pass + strategy), mean over rounds and seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eada.executors import (
    DaskExecutor,
    Executor,
    InProcessExecutor,
    Job,
    LocalProcessExecutor,
    Outcome,
    RunCancelled,
    assign_devices,
    code_differences,
    task_cancelled,
    worker_device,
)
from eada.executors import worker_start_method as worker_start_method  # re-exported
from eada.hparams import REFERENCE_METHODS, variant_label
from eada.reports.tables import accuracy_table as accuracy_table  # re-exported (moved)
from eada.reports.tables import query_table as query_table  # re-exported (moved)
from eada.reports.tables import render_tables as render_tables  # re-exported (moved)
from eada.reports.tables import sweep_table as sweep_table  # re-exported (moved)
from eada.reports.tables import task_label as task_label  # re-exported (moved)
from eada.reports.tables import task_labels as task_labels  # re-exported (moved)
from eada.runs import (
    OtherConfigError,
    append_jsonl,
    check_not_store,
    check_same_data,
    code_identity,
    config_differences,
    describe_reused,
    environment_info,
    folder_lock,
    parse_seeds,
    read_jsonl,
    write_bytes_atomic,
    write_json,
)

if TYPE_CHECKING:
    from eada.config import ExperimentConfig


def parse_sweeps(specs: list[str]) -> list[list[str]]:
    """``["active.alpha1=0.1,0.5", "train.gamma=0,0.01"]`` -> the Cartesian product as lists of
    overrides (``[[]]`` for no sweep). Values are split on commas."""
    from eada.config import ConfigError

    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"sweep {spec!r} must look like section.key=v1,v2,...")
        axes.append([f"{key}={v.strip()}" for v in values.split(",") if v.strip()])
    return [list(combo) for combo in itertools.product(*axes)] if axes else [[]]


def task_id(task: str) -> str:
    """A task's identity in the grid: a preset by its name, a YAML file by its resolved path
    (relative to the current folder when inside it), so ``configs/x.yaml``,
    ``./configs/x.yaml`` and ``/abs/.../configs/x.yaml`` are one task."""
    from eada.hparams import PRESETS

    if task in PRESETS:
        return task
    path = Path(task).resolve()
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


@dataclass(frozen=True)
class GridRun:
    """One cell of the grid, with its validated config."""

    task: str
    method: str
    variant: tuple[str, ...]
    seed: int
    config: ExperimentConfig = field(compare=False, hash=False)

    @property
    def key(self) -> str:
        """The run's identity in ``runs.jsonl``."""
        return json.dumps([self.task, self.method, list(self.variant), self.seed])

    def identity(self) -> dict[str, Any]:
        """The fields every line of the run in ``runs.jsonl`` starts with (finished or not)."""
        return {
            "key": self.key,
            "task": self.task,
            "method": self.method,
            "variant": list(self.variant),
            "seed": self.seed,
        }

    @property
    def config_sha(self) -> str:
        """Hash of the resolved config (detects stale results on resume)."""
        blob = json.dumps(self.config.resolved(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def make_config(
    task: str, method: str, seed: int, overrides: list[str], data_root: str | None = None
) -> ExperimentConfig:
    """The config of one run: preset (or YAML file) ``task`` + ``method`` + overrides."""
    from eada.config import ConfigError, apply_overrides, load_config, parse_config
    from eada.hparams import PRESETS, deep_merge, get_method

    base_method = "source_only" if method in REFERENCE_METHODS else method
    try:
        changes = get_method(base_method)  # a plugin's method too
    except ValueError as err:
        raise ConfigError(str(err)) from None
    extra = [f"data.root={data_root}"] if data_root else []
    if task in PRESETS:
        from eada.hparams import preset_dict

        raw = preset_dict(task, base_method)
    else:
        path = Path(task)
        if not path.is_file():
            raise ConfigError(f"{task!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
        raw = deep_merge(load_config(path).model_dump(mode="json"), changes)
    raw["seed"] = seed
    apply_overrides(raw, [*extra, *overrides])
    cfg = parse_config(raw, f"{task} / {method} / seed {seed}")
    return cfg


def build_grid(
    tasks: list[str],
    methods: list[str],
    seeds: list[int],
    overrides: list[str] | None = None,
    sweeps: list[str] | None = None,
    data_root: str | None = None,
) -> list[GridRun]:
    """Every run of the grid, configs validated BEFORE any training. Order: task, seed, method,
    variant (a partial grid then has every method on the first seeds)."""
    variants = parse_sweeps(sweeps or [])
    canonical = list(dict.fromkeys(task_id(t) for t in tasks))  # two spellings: one task
    runs = []
    for task, seed, method, var in itertools.product(canonical, seeds, methods, variants):
        cfg = make_config(task, method, seed, [*(overrides or []), *var], data_root)
        runs.append(GridRun(task, method, tuple(var), seed, cfg))
    return runs


class _LabelAllTarget:
    """Callback giving the trainer every target label before training (``target_supervised``)."""

    def attach(self, trainer: Any) -> None:
        import torch

        target = trainer.task.target
        trainer.set_labels(torch.arange(len(target)), target.y)

    def __call__(self, event: str, trainer: Any, info: dict[str, Any]) -> None:
        return None


class _TaskCache:
    """Keeps the last loaded task (the grid loops over methods within one task and seed; a
    worker of ``--jobs`` keeps it over seeds too: only the toy data depend on the seed)."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.task: Any = None

    def get(self, cfg: ExperimentConfig) -> Any:
        from eada.data.tasks import load_task
        from eada.train.loop import resolve_device

        seed = cfg.seed if cfg.data.kind == "toy" else None  # load_task's seed: the toy's only
        key = json.dumps(
            [cfg.data.model_dump(mode="json"), cfg.model.model_dump(mode="json"), seed],
            sort_keys=True,
        )
        if key != self.key:
            self.task = None  # free the previous one first
            self.task = load_task(cfg.data, cfg.seed, cfg.model, resolve_device(cfg.device).type)
            self.key = key
        return self.task


def run_record(
    run: GridRun, result: dict[str, Any], code: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The compact JSON line of a finished run (what the tables need, plus provenance).

    ``code``: the code that ran it (git commit, package versions), stored in the line itself
    because a grid resumed over several invocations may span several commits (``meta.json``
    holds the first invocation's environment only)."""
    import torch

    res = result["results"]
    last = res["final"]["last_epoch"]
    final = {
        f"{split}/{k}": last[split][k]
        for split in ("target", "target_unlabeled", "heldout")
        if split in last
        for k in ("accuracy", "mean_class_accuracy")
    }
    rounds = []
    for r in res["rounds"]:
        after = r.get("after_training", {})
        rounds.append(
            {
                "round": r["round"],
                "n_labeled": r["n_labeled"],
                "target_accuracy": after.get("target", {}).get("accuracy"),
                **{
                    k: r[k]
                    for k in (
                        "pool_before",
                        "selection_seconds",
                        "scoring_seconds",
                        "selected_error_rate",
                        "selected",  # the queried target positions (report: toy, images)
                        "selected_labels",
                    )
                    if k in r
                },
            }
        )
    epochs = [  # per-epoch training means (losses, Delta) and target accuracy where evaluated
        {
            **{k: v for k, v in h.items() if k != "metrics"},
            **(
                {"target_accuracy": h["metrics"]["target"]["accuracy"]}
                if "target" in h.get("metrics", {})
                else {}
            ),
        }
        for h in res["history"]
    ]
    return {
        **run.identity(),
        "strategy": run.config.active.strategy if run.config.active.enabled else None,
        "config_sha": run.config_sha,
        "config": run.config.resolved(),
        "final": final,
        "rounds": rounds,
        "epochs": epochs,
        "n_labeled": len(res["labeled_indices"]),
        "seconds": res["seconds"],
        "loadavg": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code or {},
        "warnings": [w["message"] for w in res.get("warnings", [])],
        "best_epoch": _best_epoch(res["final"].get("best_epoch")),
        "domain_stats": res.get("domain_stats"),
    }


def _best_epoch(best: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best-epoch entry of a run's results without its per-class lists (compact)."""
    if not best:
        return None
    return {
        k: (
            {m: v for m, v in val.items() if m != "per_class_accuracy"}
            if isinstance(val, dict)
            else val
        )
        for k, val in best.items()
    }


def finished_runs(log: Path) -> dict[str, dict[str, Any]]:
    """The lines of ``runs.jsonl`` by run key, a task written under another spelling (an older
    line: ``./configs/x.yaml``) under its :func:`task_id`. Finished runs only: a run whose line
    says it failed or was lost (:func:`eada.runs.is_finished`) is run again."""
    done = {}
    for r in read_jsonl(log):
        task, method, variant, seed = json.loads(r["key"])
        key = json.dumps([task_id(task), method, variant, seed])
        done[key] = r if key == r["key"] else {**r, "key": key, "task": task_id(task)}
    return done


def run_grid(
    runs: list[GridRun],
    out: Path,
    progress: Callable[[str], None] | None = None,
    max_runs: int | None = None,
    jobs: int = 1,
    threads: int = 1,
    *,
    executor: Executor | None = None,
    failed: list[dict[str, Any]] | None = None,
    bar: bool = False,
    data_map: list[tuple[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Run every grid cell not yet finished in ``out/runs.jsonl``; returns the finished records
    of the grid (the failed ones go to ``failed``).

    Args:
        runs: the grid (:func:`build_grid`).
        out: output folder (``runs.jsonl``, ``grid.json``, ``meta.json``).
        progress: receives one line per finished run (and a few notes).
        max_runs: stop after this many NEW runs (``None``: all).
        jobs: worker processes when no ``executor`` is given (``> 1``: a
            :class:`~eada.executors.LocalProcessExecutor` of ``jobs`` processes with ``threads``
            threads each; the records are the same as one process's, the order of the lines is
            that of completion).
        threads: thread count of each worker process (only with ``jobs > 1``).
        executor: where the runs execute (:mod:`eada.executors`); default in-process for
            ``jobs == 1``.
        failed: receives the record of every run of this call that failed or was lost.
        bar: show a progress bar (done/total, failed, ETA) on stderr instead of the lines.
        data_map: ``(old, new)`` prefixes the workers rewrite in the data paths
            (``--data-map``, :func:`eada.data.identity.place_data`).

    Each run's data paths go to its worker as absolute paths (:func:`input_paths`); the
    worker checks them before it starts (a worker without them is avoided, see
    :class:`~eada.executors.DaskExecutor`), and the record keeps both (``data_paths``).
    One process at a time runs a grid in ``out``: :func:`eada.runs.folder_lock`.

    This process alone appends to ``runs.jsonl``, one whole line per finished run, as each
    finishes. A run that raises is recorded as ``{"key", "status": "failed", "error",
    "traceback", "worker", ...}`` and the grid goes on; a later call tries it again (a failed
    line never counts as finished: :func:`finished_runs`). The first Ctrl-C (``SIGINT``) stops
    starting runs, lets the running ones end and be recorded, then raises
    ``KeyboardInterrupt``; a second one stops them too.

    A stored line is reused only for the same config and the same data (its ``inputs``, see
    :func:`eada.data.identity.data_inputs`); ``progress`` is told "reused N runs made at ...
    by commit ...", and the lines keep their own ``code`` (commit, command) and time.

    Raises:
        OtherConfigError: a record in ``runs.jsonl`` has the same key but another config.
        OtherDataError: a record in ``runs.jsonl`` was made on other data (or before runs
            recorded their data, on data held in files).
        KeyboardInterrupt: Ctrl-C (the records of the runs that ended are written).
        FolderInUseError: another process runs a grid in ``out``.
    """
    check_not_store(out)  # never a project store's folder
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out):
        return _run_grid(
            runs, out, progress, max_runs, jobs, threads, executor, failed, bar, data_map or []
        )


def _run_grid(
    runs: list[GridRun],
    out: Path,
    progress: Callable[[str], None] | None,
    max_runs: int | None,
    jobs: int,
    threads: int,
    executor: Executor | None,
    failed: list[dict[str, Any]] | None,
    bar: bool,
    data_map: list[tuple[str, str]],
) -> list[dict[str, Any]]:
    """:func:`run_grid` with ``out`` locked."""
    log = out / "runs.jsonl"
    done = finished_runs(log)
    _INPUTS.clear()  # the data as they are now: hashed once for this grid command
    for run in runs:
        rec = done.get(run.key)
        if rec is None:
            continue
        if rec["config_sha"] != run.config_sha:
            diff = config_differences(rec.get("config", {}), run.config.resolved())
            if diff:
                raise OtherConfigError(
                    f"{log} holds run {run.key} with another config ({'; '.join(diff[:5])}): "
                    "the grid changed; use another --out or remove that line"
                )
        check_same_data(
            [rec], grid_inputs(run), log, "use another --out to start afresh (or remove that line)"
        )
    write_json(out / "grid.json", {"runs": [json.loads(r.key) for r in runs]})
    env = environment_info()
    if not (out / "meta.json").exists():
        write_json(out / "meta.json", env)
    code = {k: env[k] for k in ("git", "eada", "torch", "numpy", "command")}
    reused = [done[r.key] for r in runs if r.key in done]
    if reused and progress:  # stored lines keep their own code, command and time
        progress(f"{describe_reused(reused)} ({log})")
    todo = [r for r in runs if r.key not in done]
    if max_runs is not None:
        todo = todo[: max(0, max_runs)]
    if executor is None:
        executor = (
            LocalProcessExecutor(jobs, threads, preload=RUN_MODULES)
            if jobs > 1 and len(todo) > 1
            else InProcessExecutor()
        )
    remote = isinstance(executor, DaskExecutor)
    by_key = {r.key: r for r in todo}
    from eada.data.identity import input_paths
    from eada.extend import plugins_of

    grid_jobs = []
    for r in todo:
        paths = input_paths(r.config.data)  # absolute here: the workers may start elsewhere
        grid_jobs.append(
            Job(
                r.key,
                _grid_job,
                (
                    r,
                    code,
                    threads if remote else None,
                    plugins_of(r.config, r.method),
                    paths,
                    data_map,
                ),
                _run_label(r),
                gpu=r.config.device != "cpu",
                group=json.dumps(sorted(paths.items())),
            )
        )
    if hasattr(executor, "note") and progress:
        executor.note = progress  # a Dask cluster's news: workers joining, lost, avoided
    if progress and todo and not isinstance(executor, InProcessExecutor):
        if isinstance(executor, DaskExecutor):
            where = f"the Dask cluster at {executor.address}"
        elif isinstance(executor, LocalProcessExecutor):
            where = f"{min(executor.workers, len(todo))} local worker processes"
        else:
            where = str(executor.name)
        progress(f"{len(todo)} runs on {where}, {threads} thread(s) each")
    tracker = _Progress(len(todo), progress, bar)
    n_failed = 0
    with _FirstInterruptStops(executor, progress), tracker:
        for outcome in executor.run(grid_jobs):
            run = by_key[outcome.job.key]
            if outcome.status == "ok":
                assert outcome.value is not None
                rec = dict(outcome.value)
                ran_on = _where(outcome)
                ran_on["device"] = rec.pop("worker_device", ran_on["device"])
                ran_on["code"] = rec.pop("worker_code", None)
                rec.update(worker=ran_on, timing=outcome.timing())
                rec.update(attempts=outcome.attempts, workers=outcome.tried_on)
                other = code_differences(code_identity(), ran_on.get("code") or {})
                if ran_on.get("code") and other:
                    rec["other_code"] = other  # a worker allowed by --allow-mixed-code
                append_jsonl(log, rec)
                done[run.key] = rec
            else:
                rec = failure_record(run, outcome, code)
                append_jsonl(log, rec)
                n_failed += 1
                if failed is not None:
                    failed.append(rec)
            tracker.update(run, outcome, n_failed)
    if getattr(executor, "interrupted", False):
        raise KeyboardInterrupt
    return [done[r.key] for r in runs if r.key in done]


def _where(outcome: Outcome) -> dict[str, Any]:
    """The ``worker`` entry of a record: host, address, device (and the GPU ids it saw)."""
    w = outcome.worker
    return {k: w.get(k) for k in ("host", "address", "device", "cuda_visible_devices")}


def failure_record(run: GridRun, outcome: Outcome, code: dict[str, Any]) -> dict[str, Any]:
    """The line of a run that failed (its function raised) or was lost with its worker."""
    return {
        **run.identity(),
        "status": "failed" if outcome.status == "failed" else "lost",
        "error": outcome.error,
        "error_type": outcome.error_type,
        "traceback": outcome.traceback,
        "worker": _where(outcome),
        "timing": outcome.timing(),
        "attempts": outcome.attempts,
        "workers": outcome.tried_on,
        "config_sha": run.config_sha,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code,
    }


def failure_summary(failed: list[dict[str, Any]], total: int) -> str:
    """The lines ``eada bench`` prints after a grid with failed runs."""
    lines = [f"{len(failed)} of {total} runs failed (recorded in runs.jsonl; run the same "
             "command again to retry them):"]  # fmt: skip
    for rec in failed:
        var = f" [{variant_label(rec['variant'])}]" if rec["variant"] else ""
        where = rec.get("worker", {}).get("address")
        lines.append(
            f"  {rec['task']} / {rec['method']}{var} / seed {rec['seed']}: {rec['status']}: "
            f"{rec['error_type']}: {rec['error']}" + (f" [{where}]" if where else "")
        )
    return "\n".join(lines)


class _FirstInterruptStops:
    """While the grid runs, the first Ctrl-C stops submitting (``executor.stop()``) and the
    running runs end and are recorded; a second raises ``KeyboardInterrupt`` (a run cut off
    leaves no line). Only in the main thread (signal handlers live there)."""

    def __init__(self, executor: Executor, progress: Callable[[str], None] | None) -> None:
        self.executor = executor
        self.progress = progress
        self.previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if getattr(self.executor, "interrupted", False):
            raise KeyboardInterrupt
        self.executor.interrupted = True  # type: ignore[attr-defined]
        self.executor.stop()
        if self.progress:
            self.progress("interrupted: no new runs; the running ones end (Ctrl-C again to stop)")

    def __enter__(self) -> None:
        import signal
        import threading

        self.executor.interrupted = False  # type: ignore[attr-defined]
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class _Progress:
    """Progress of a grid: a rich bar (done/total, failed, ETA) on a terminal, else one plain
    line per finished run (``[3/12] ok 4.1 s: task / method / seed 0 (worker)``), never
    wrapped."""

    def __init__(
        self, total: int, sink: Callable[[str], None] | None, bar: bool, console: Any = None
    ) -> None:
        self.total, self.sink, self.n = total, sink, 0
        self.bar: Any = None
        if bar and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("grid"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console or Console(stderr=True),
                transient=False,
            )
            self.task = self.bar.add_task("grid", total=total, failed=0)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, run: GridRun, outcome: Outcome, n_failed: int) -> None:
        """One more run finished."""
        self.n += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, failed=n_failed)
            if outcome.status != "ok":
                self.bar.console.print(
                    f"{outcome.status}: {_run_label(run)}: {outcome.error}", soft_wrap=True
                )
            return
        if self.sink:
            t = outcome.timing()["run_s"]
            secs = f" {t:.1f} s" if t is not None else ""
            where = outcome.worker.get("address", "")
            where = "" if where.startswith("local:") else where  # a local worker: its device
            dev = outcome.worker.get("device")
            where += f" {dev}" if dev and dev != "cpu" else ""
            line = f"[{self.n}/{self.total}] {outcome.status}{secs}: {_run_label(run)}"
            if outcome.status != "ok":
                line += f": {outcome.error_type}: {outcome.error}"
            self.sink(line + (f" ({where.strip()})" if where.strip() else ""))


def _run_label(run: GridRun) -> str:
    var = f" [{variant_label(list(run.variant))}]" if run.variant else ""
    return f"{run.task} / {run.method}{var} / seed {run.seed}"


_CACHE = _TaskCache()  # one per process (the grid's worker processes each keep their own)


#: free energies a domain and snapshot kept in a bench line (``eada run`` keeps 1,000): enough
#: for the report's histograms, at a fifth of the size
BENCH_FREE_ENERGIES = 200


#: the data identity of each data config this process has seen (a grid command computes it once)
_INPUTS: dict[str, dict[str, Any]] = {}


def grid_inputs(run: GridRun) -> dict[str, Any]:
    """:func:`eada.data.identity.data_inputs` of a run's data, once per data config within one
    :func:`run_grid` call and process (a grid of many runs over one image folder stats its
    images once)."""
    return _config_inputs(run.config)


def _config_inputs(config: ExperimentConfig) -> dict[str, Any]:
    from eada.data.identity import data_inputs

    ident = json.dumps([config.data.model_dump(mode="json"), config.model.weights])
    if ident not in _INPUTS:
        _INPUTS[ident] = data_inputs(config.data, config.model)
    return _INPUTS[ident]


def _stop_when_cancelled(event: str, trainer: Any, info: dict[str, Any]) -> None:
    """Trainer callback of a run on a Dask worker: end the run at its next epoch or round
    once its task was cancelled (a second Ctrl-C of the driver), freeing the worker."""
    if task_cancelled():
        raise RunCancelled("the grid was interrupted: run cancelled")


def _grid_job(
    run: GridRun,
    code: dict[str, Any],
    threads: int | None = None,
    plugins: list[dict[str, Any]] | tuple[()] = (),
    paths: dict[str, str] | None = None,
    data_map: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Train one grid cell; its record (where it runs: this process, a local worker or a Dask
    worker; ``threads``: set this worker's thread count first, for Dask workers; ``plugins``:
    the plugins the run uses (:func:`eada.extend.plugins_of`), imported here first, each
    checked to be the same code; a worker without one fails the run naming module and
    worker; ``paths``: the driver's absolute data paths, checked and mapped here,
    :func:`~eada.data.identity.place_data`). The record's ``plugins`` names them as this
    worker has them."""
    from eada.data.identity import place_data
    from eada.experiment import run_once
    from eada.plugins import activate
    from eada.train.domain_stats import DomainStatsRecorder

    try:
        used = activate(plugins)
    except ValueError as err:  # a plugin this worker lacks: its fault, not the run's
        err.environment = True  # type: ignore[attr-defined]
        raise

    config, placed = run.config, None
    if paths:
        data, placed = place_data(run.config.data, paths, data_map or [])
        config = run.config.model_copy(update={"data": data})

    if threads is not None:
        from threadpoolctl import threadpool_limits

        from eada.threads import set_threads

        set_threads(threads, local=False)  # the grid's count for its runs
        threadpool_limits(limits=threads)
    cbs: list[Any] | None = [_LabelAllTarget()] if run.method == "target_supervised" else None
    stats = DomainStatsRecorder(n_free_energy=BENCH_FREE_ENERGIES, seed=run.seed)
    cbs = [*(cbs or []), stats]  # compact domain statistics for the report (histograms, toy)
    if threads is not None:  # a Dask worker's task: stop when cancelled
        cbs.append(_stop_when_cancelled)
    inputs = _config_inputs(config)
    result = run_once(config, _CACHE.get(config), callbacks=cbs, record_stats=False)
    result["results"]["domain_stats"] = stats.data
    rec = run_record(run, result, code)  # the grid's config (its paths as given), its identity
    rec["inputs"] = inputs
    rec["plugins"] = [p.record() for p in used]
    if placed:
        rec["data_paths"] = placed  # the driver's path and the one read here, per key
    from eada.train.loop import resolve_device

    on_cpu = resolve_device(run.config.device).type == "cpu"
    rec["worker_device"] = "cpu" if on_cpu else worker_device()  # the record's worker.device
    rec["worker_code"] = code_identity()  # the record's worker.code: eada version, commit
    return rec


#: What every run imports on first use (the first ``torch.optim`` optimizer imports
#: ``torch._dynamo``, ~1 s; the domain statistics scikit-learn): imported ONCE by the parent
#: before it forks the workers, instead of once by each worker.
RUN_MODULES = (
    "eada.experiment",
    "eada.reports.domain_stats",
    "torch._dynamo",
    "sklearn.linear_model",
    "sklearn.model_selection",
    "sklearn.pipeline",
    "sklearn.preprocessing",
)


def make_executor(
    jobs: int,
    threads: int = 1,
    *,
    devices: list[int] | None = None,
    runs_per_device: int | None = None,
    retries: int = 0,
    dask: str | None = None,
    allow_mixed_code: bool = False,
    wait_workers: float | None = None,
) -> Executor:
    """The executor of ``eada bench``'s options: Dask (``dask``: a scheduler address), else
    ``jobs`` local workers each given its GPU (:func:`~eada.executors.assign_devices`), else
    in-process (``jobs == 1`` without ``devices``)."""
    from eada.config import ConfigError

    if dask:
        if devices is not None or runs_per_device is not None:
            raise ConfigError("--devices and --runs-per-device are for local workers, not --dask")
        return DaskExecutor(
            dask,
            retries=retries,
            allow_mixed_code=allow_mixed_code,
            code=code_identity,
            wait_workers=wait_workers,
        )
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if runs_per_device is not None and runs_per_device < 1:
        raise ConfigError(f"--runs-per-device must be >= 1, got {runs_per_device}")
    slots = assign_devices(jobs, devices, runs_per_device)
    if jobs == 1 and devices is None and not retries:
        return InProcessExecutor()
    return LocalProcessExecutor(jobs, threads, slots, retries=retries, preload=RUN_MODULES)


# -- command line --------------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    """Add the ``bench`` subcommand to the ``eada`` parser's subparsers."""
    b = sub.add_parser(
        "bench",
        help="grid of tasks x methods x seeds, resumable, paper-style tables",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "tasks",
        nargs="?",
        default="",
        help="comma-separated presets or YAML configs, e.g. digits/mnist-usps (with --table-only: "
        "the tasks to tabulate, default all in OUT)",
    )
    b.add_argument("--methods", default="source_only,random,eada", help="comma-separated methods")
    b.add_argument("--seeds", default="0-2", help="seeds, e.g. 0-4 or 0,1,2 (default 0-2)")
    b.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override (every run)"
    )
    b.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="add variants (repeatable)",
    )
    b.add_argument("--data-root", default=None, help="override data.root of every task")
    b.add_argument("--out", required=True, help="output folder (runs.jsonl, tables)")
    b.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    b.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="run the grid in N local worker processes with one thread each (--threads to "
        "change), each given its own GPU round-robin (CUDA_VISIBLE_DEVICES) where there are "
        "GPUs; resumable as with one process (default 1, or GPUs x --runs-per-device)",
    )
    b.add_argument(
        "--devices",
        default=None,
        metavar="I,J,...",
        help="the GPUs the workers use, as cuda:N counts them (default: every visible GPU)",
    )
    b.add_argument(
        "--runs-per-device",
        type=int,
        default=None,
        metavar="K",
        help="workers sharing one GPU (small runs); without --jobs: GPUs x K workers",
    )
    b.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="K",
        help="start a run again up to K times when its worker died under it (an error in the "
        "run itself is recorded, never retried; default 0)",
    )
    b.add_argument(
        "--dask",
        default=None,
        metavar="ADDRESS",
        help="run every run as a task on a Dask distributed cluster, e.g. tcp://HOST:8786 "
        "(needs the cluster extra; the workers need the data, at the paths the driver sees or "
        "mapped by --data-map)",
    )
    b.add_argument(
        "--data-map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="workers read data under NEW where this machine has them under OLD (repeatable; "
        "a worker's own EADA_DATA_MAP comes first)",
    )
    s = b.add_argument_group("Slurm (--slurm: the workers as Slurm jobs, through dask-jobqueue)")
    s.add_argument(
        "--slurm",
        action="store_true",
        help="start the Dask workers as Slurm jobs (sbatch), wait for the first, run the grid, "
        "cancel the jobs at the end or on Ctrl-C",
    )
    s.add_argument("--slurm-partition", default=None, metavar="P", help="sbatch -p")
    s.add_argument("--slurm-account", default=None, metavar="A", help="sbatch -A")
    s.add_argument("--slurm-gpus", type=int, default=0, metavar="N", help="GPUs a job (0)")
    s.add_argument("--slurm-cpus", type=int, default=1, metavar="N", help="CPU cores a job (1)")
    s.add_argument("--slurm-memory", default="8GB", metavar="M", help="memory a job (8GB)")
    s.add_argument("--slurm-walltime", default="01:00:00", metavar="T", help="sbatch -t")
    s.add_argument("--slurm-jobs", type=int, default=1, metavar="N", help="jobs at once (1)")
    s.add_argument(
        "--slurm-adapt",
        default=None,
        metavar="MIN:MAX",
        help="adaptive scaling between MIN and MAX jobs instead of --slurm-jobs",
    )
    s.add_argument(
        "--slurm-interface",
        default=None,
        metavar="IFACE",
        help="network interface of the scheduler (here) and the workers, e.g. ib0",
    )
    s.add_argument(
        "--slurm-wait",
        type=float,
        default=3600.0,
        metavar="S",
        help="seconds to wait for the first job to start (3600)",
    )
    b.add_argument(
        "--allow-mixed-code",
        action="store_true",
        help="use Dask workers whose eada version or commit differ from this one's (recorded "
        "in each of their runs); default: refused",
    )
    from eada.threads import add_threads_argument

    add_threads_argument(b)
    from eada.plugins import add_plugin_argument

    add_plugin_argument(b)
    b.add_argument("--format", choices=("md", "latex"), default="md", help="table format")
    b.add_argument("--table-only", action="store_true", help="print the tables of OUT only")
    b.add_argument("--dry-run", action="store_true", help="validate the grid and list it")
    b.set_defaults(func=cmd_bench)


def plain_text(doc: str) -> str:
    """``doc`` without its reStructuredText markup, for ``--help``.

    >>> plain_text("``eada bench`` runs :data:`eada.hparams.METHODS` (:func:`~eada.x.f`)")
    'eada bench runs eada.hparams.METHODS (f)'
    """
    doc = re.sub(r":[a-z]+:`~[\w.]*?(\w+)`", r"\1", doc)  # :func:`~a.b` -> b
    return re.sub(r":[a-z]+:`([^`]+)`", r"\1", doc).replace("``", "")


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def cmd_bench(args: argparse.Namespace) -> int:
    """Run (or resume) the grid and print its tables; writes ``OUT/tables.md``/``tables.tex``."""
    from eada.config import ConfigError

    out = Path(args.out)
    if args.max_runs is not None and args.max_runs < 0:
        raise ConfigError(f"--max-runs must be >= 0 (0: run nothing new), got {args.max_runs}")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.table_only:
        records = read_jsonl(out / "runs.jsonl")
        if not records:
            raise FileNotFoundError(f"no finished runs in {out / 'runs.jsonl'}")
        wanted = _split(args.tasks)
        if wanted:  # the tables of the tasks named, not of everything the folder holds
            records = [r for r in records if r["task"] in wanted]
            if not records:
                held = ", ".join(dict.fromkeys(r["task"] for r in read_jsonl(out / "runs.jsonl")))
                raise FileNotFoundError(
                    f"no finished runs of {', '.join(wanted)} in {out / 'runs.jsonl'} (it holds: "
                    f"{held})"
                )
    else:
        if not _split(args.tasks):
            raise ConfigError("give the tasks: comma-separated presets or YAML config files")
        runs = build_grid(
            _split(args.tasks),
            _split(args.methods),
            parse_seeds(args.seeds),
            args.set,
            args.sweep,
            args.data_root,
        )
        from eada.data.identity import parse_data_map

        data_map = parse_data_map(args.data_map)
        if args.dry_run:
            done = set(finished_runs(out / "runs.jsonl"))
            todo = [r for r in runs if r.key not in done]
            where = placements(todo, args)
            for r in runs:
                print(("done " if r.key in done else "todo ") + r.key + where.get(r.key, ""))
            print(f"{len(runs)} runs, {sum(r.key in done for r in runs)} done; configs valid")
            return 0
        threads = args.threads or 1
        with _slurm(args, log) as slurm:  # --slurm: its jobs live as long as the grid
            executor = make_executor(
                _jobs(args),
                threads,
                devices=_device_list(args.devices),
                runs_per_device=args.runs_per_device,
                retries=_retries(args.retries),
                dask=slurm.address if slurm else args.dask,
                wait_workers=slurm.wait if slurm else None,
                allow_mixed_code=args.allow_mixed_code,
            )
            failed: list[dict[str, Any]] = []
            records = run_grid(
                runs,
                out,
                progress=log,
                max_runs=args.max_runs,
                jobs=_jobs(args),
                threads=threads,
                executor=executor,
                failed=failed,
                bar=sys.stderr.isatty(),
                data_map=data_map,
            )
        for note in cluster_notes(executor):
            log(note)
        if failed:
            if records:
                _write_tables(records, out, args.format)
            log(failure_summary(failed, len(runs)))
            return 1
    _write_tables(records, out, args.format)
    return 0


@dataclass
class _SlurmGrid:
    address: str
    wait: float


@contextmanager
def _slurm(args: argparse.Namespace, log: Callable[[str], None]) -> Iterator[_SlurmGrid | None]:
    """``--slurm``: a dask-jobqueue cluster whose jobs live as long as the block (cancelled at
    its end, Ctrl-C included); ``None`` without ``--slurm``."""
    from eada.config import ConfigError

    if not args.slurm:
        yield None
        return
    if args.dask:
        raise ConfigError("--slurm starts its own Dask cluster: give it or --dask, not both")
    if Path(args.out).is_dir():  # another grid on this folder: refused before any job starts
        with folder_lock(Path(args.out)):
            pass
    from eada.executors import SlurmOptions, parse_adapt, slurm_cluster

    opts = SlurmOptions(
        partition=args.slurm_partition,
        account=args.slurm_account,
        gpus=args.slurm_gpus,
        cpus=args.slurm_cpus,
        memory=args.slurm_memory,
        walltime=args.slurm_walltime,
        jobs=args.slurm_jobs,
        adapt=parse_adapt(args.slurm_adapt) if args.slurm_adapt else None,
        interface=args.slurm_interface,
        wait=args.slurm_wait,
    )
    cluster = slurm_cluster(opts)
    jobs = f"adaptive {opts.adapt[0]}-{opts.adapt[1]}" if opts.adapt else str(opts.jobs)
    log(f"Slurm: {jobs} job(s) of one Dask worker ({opts.gpus} GPU(s), {opts.cpus} CPU(s), "
        f"{opts.memory}, {opts.walltime}); scheduler {cluster.scheduler_address}")  # fmt: skip
    try:
        yield _SlurmGrid(cluster.scheduler_address, opts.wait)
    finally:
        cluster.close()  # scancel of every job it submitted
        log("Slurm: the grid's jobs cancelled")


def placements(todo: list[GridRun], args: argparse.Namespace) -> dict[str, str]:
    """Where ``eada bench --dry-run`` says each run would go: `` -> worker 2, cuda:1``
    (local workers: the first run of each worker exactly, the later ones to whichever worker
    is free first), `` -> any Dask worker with GPU=1``, `` -> this process, cpu``.

    Raises:
        ExecutorError: the options name GPUs that are not there, or more workers than GPUs
            without ``--runs-per-device`` (the same check as a real run).
    """
    if not todo:
        return {}
    if args.dask or args.slurm:
        return {
            r.key: " -> any Dask worker" + (" with GPU=1" if r.config.device != "cpu" else "")
            for r in todo
        }
    jobs = _jobs(args)
    slots = assign_devices(jobs, _device_list(args.devices), args.runs_per_device)
    n = min(jobs, len(todo))

    def device(r: GridRun, slot: str | None) -> str:
        return "cpu" if r.config.device == "cpu" or slot is None else f"cuda:{slot}"

    if n == 1 and jobs == 1:
        return {r.key: f" -> this process, {device(r, slots[0])}" for r in todo}
    out = {}
    for i, r in enumerate(todo):
        if i < n:
            out[r.key] = f" -> worker {i + 1}, {device(r, slots[i])}"
        else:
            free = sorted({device(r, slots[k]) for k in range(n)})
            out[r.key] = f" -> the first worker free ({' or '.join(free)})"
    return out


def cluster_notes(executor: Executor) -> list[str]:
    """What ``eada bench`` says after a Dask grid about its cluster: each worker avoided for
    lacking a run's data or modules (node and reason), each refused or allowed for its code,
    each lost."""
    notes = []
    for a in getattr(executor, "avoided", []):
        what = "every run" if a["group"] == "*" else "runs of that data set"
        notes.append(f"avoided worker {a['worker']} (host {a['host']}) for {what}: {a['error']}")
    for w, diff in getattr(executor, "refused", {}).items():
        notes.append(f"refused worker {w}: other code ({', '.join(diff)})")
    for w, c in getattr(executor, "mixed", {}).items():
        notes.append(
            f"used worker {w} (host {c['host']}) with other code: eada {c['eada']}, commit "
            f"{c['commit']} (--allow-mixed-code; recorded in its runs)"
        )
    for w in getattr(executor, "lost", []):
        notes.append(f"lost worker {w} during the grid")
    return notes


def _write_tables(records: list[dict[str, Any]], out: Path, fmt: str) -> None:
    tables = {f: render_tables(records, f) for f in ("md", "latex")}
    for name, fmt_ in (("tables.md", "md"), ("tables.tex", "latex")):  # whole or not at all
        write_bytes_atomic(out / name, (tables[fmt_] + "\n").encode("utf-8"))
    print(tables[fmt])


def _jobs(args: argparse.Namespace) -> int:
    """``--jobs``, or GPUs x ``--runs-per-device`` without it, else 1."""
    if args.jobs is not None:
        return int(args.jobs)
    if args.runs_per_device is not None and not args.dask:
        from eada.executors import visible_gpus

        devices = _device_list(args.devices)
        n = len(devices) if devices is not None else len(visible_gpus())
        return max(1, n * max(1, args.runs_per_device))
    return 1


def _device_list(text: str | None) -> list[int] | None:
    from eada.config import ConfigError

    if text is None:
        return None
    try:
        out = [int(t) for t in _split(text)]
    except ValueError:
        raise ConfigError(f"--devices {text!r}: give GPU numbers, e.g. 0,2,3") from None
    if not out:
        raise ConfigError("--devices names no GPU")
    return out


def _retries(n: int) -> int:
    from eada.config import ConfigError

    if n < 0:
        raise ConfigError(f"--retries must be >= 0, got {n}")
    return n


# -- Python API: eada.bench(...) ----------------------------------------------------------------
def bench(
    tasks: str | list[str],
    methods: str | list[str] = "source_only,random,eada",
    seeds: int | str | list[int] = "0-2",
    *,
    out: str | Path,
    overrides: list[str] | dict[str, Any] | None = None,
    sweeps: list[str] | None = None,
    executor: Executor | str | Any = None,
    jobs: int = 1,
    threads: int = 1,
    data_root: str | None = None,
    plugins: list[str | Path] | tuple[()] = (),
    max_runs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """``eada bench`` from Python (also callable as ``eada.bench(...)``): run (or resume) the
    grid tasks x methods x sweep variants x seeds into ``out/runs.jsonl`` and return its
    finished records, in grid order. The same functions as the command (:func:`build_grid`,
    :func:`make_executor`, :func:`run_grid`); tables: :func:`render_tables` of the records,
    a DataFrame: :func:`eada.api.results`.

    Args:
        tasks: presets or YAML configs (a list, or comma-separated).
        methods: methods (a plugin's, or a strategy's name, included).
        seeds: ``"0-2"``, ``[0, 1]``, ``3``.
        out: output folder.
        overrides: ``--set`` items, or a ``{key: value}`` dict.
        sweeps: ``--sweep`` items (``"active.alpha1=0.25,0.5"``).
        executor: where the runs execute: an :class:`~eada.executors.Executor`, a Dask
            scheduler address (``"tcp://HOST:8786"``) or a ``distributed.Client``; default
            ``jobs`` local worker processes (in-process for 1).
        jobs: local worker processes when no executor is given.
        threads: threads a worker.
        data_root: ``--data-root``.
        plugins: plugin files or modules to import first (``--plugin``).
        max_runs: stop after this many new runs.
        progress: receives one line a finished run.

    Raises:
        BenchError: runs failed (``.failed`` holds their records, ``.records`` the finished
            ones); the same call again retries them.

    Example::

        import eada
        records = eada.bench(["configs/office_caltech10_surf.yaml"], ["random", "eada"],
                             "0-1", out="runs/g", overrides={"train.epochs": 12},
                             executor="tcp://127.0.0.1:8786")
    """
    from eada.api import _override_list, seed_list
    from eada.plugins import load_plugins

    load_plugins(plugins)
    task_list = _split(tasks) if isinstance(tasks, str) else list(tasks)
    method_list = _split(methods) if isinstance(methods, str) else list(methods)
    runs = build_grid(
        task_list, method_list, seed_list(seeds), _override_list(overrides), sweeps, data_root
    )
    if isinstance(executor, str):
        executor = make_executor(1, threads, dask=executor)
    elif executor is not None and hasattr(executor, "scheduler") and hasattr(executor, "submit"):
        executor = make_executor(1, threads, dask=executor.scheduler.address)  # a Client
    elif executor is None:
        executor = make_executor(jobs, threads)
    failed: list[dict[str, Any]] = []
    records = run_grid(
        runs,
        Path(out),
        progress=progress,
        max_runs=max_runs,
        jobs=jobs,
        threads=threads,
        executor=executor,
        failed=failed,
    )
    if failed:
        raise BenchError(failure_summary(failed, len(runs)), records, failed)
    return records


class BenchError(RuntimeError):
    """Runs of a grid failed (the message lists them).

    Attributes:
        records: the finished records.
        failed: the failed or lost runs' records.
    """

    def __init__(
        self, message: str, records: list[dict[str, Any]], failed: list[dict[str, Any]]
    ) -> None:
        super().__init__(message)
        self.records, self.failed = records, failed


class _CallableModule(type(sys)):  # type: ignore[misc]
    """``eada.bench`` is this module, and calling it calls :func:`bench` (``eada.bench(...)``
    in a notebook, as ``eada.run(...)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return bench(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
