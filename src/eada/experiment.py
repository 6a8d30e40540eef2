"""Run one config (one seed) or a config over several seeds, and write the run records.

Layout of a multi-seed output folder::

    OUT/
      config.json          resolved config (seed of the first run)
      meta.json            versions, git commit, machine, command
      runs.jsonl           one JSON line per finished seed (full measurements)
      results.json         summary: per-round and final mean +- std over seeds
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from eada.config import ExperimentConfig
from eada.data.tasks import Task, load_task
from eada.runs import append_jsonl, environment_info, read_jsonl, summarize, write_json
from eada.train import ActiveDATrainer
from eada.train.loop import Callback


def run_once(
    cfg: ExperimentConfig,
    task: Task | None = None,
    callbacks: list[Callback] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train one seed; returns ``{"seed", "config", "results"}`` (JSON-ready)."""
    task = task if task is not None else load_task(cfg.data, cfg.seed)
    trainer = ActiveDATrainer(cfg, task, callbacks=callbacks)
    result = trainer.run(progress=progress)
    return {"seed": cfg.seed, "config": cfg.resolved(), "results": result.to_dict()}


def final_accuracy(
    run: dict[str, Any], split: str = "target", key: str = "accuracy", which: str = "last_epoch"
) -> float:
    """A run's final accuracy (percent) on ``split`` (``target``/``heldout``)."""
    return float(run["results"]["final"][which][split][key])


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean +- std over seeds: final (last and best epoch) and after every round."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "final": {}, "rounds": []}
    splits = [s for s in ("target", "heldout") if s in runs[0]["results"]["final"]["last_epoch"]]
    for which in ("last_epoch", "best_epoch"):
        for split in splits:
            for key in ("accuracy", "mean_class_accuracy"):
                vals = [final_accuracy(r, split, key, which) for r in runs]
                out["final"][f"{which}/{split}/{key}"] = {"values": vals, **summarize(vals)}
    n_rounds = min(len(r["results"]["rounds"]) for r in runs)
    for i in range(n_rounds):
        recs = [r["results"]["rounds"][i] for r in runs]
        row: dict[str, Any] = {"round": i, "n_labeled": [x["n_labeled"] for x in recs]}
        for split in splits:
            vals = [x["after_training"][split]["accuracy"] for x in recs if "after_training" in x]
            if len(vals) == len(recs):
                row[f"{split}/accuracy"] = {"values": vals, **summarize(vals)}
        if i > 0:
            row["selection_seconds"] = summarize([x["selection_seconds"] for x in recs])
            row["selected_error_rate"] = summarize([x["selected_error_rate"] for x in recs])
        out["rounds"].append(row)
    return out


def run_seeds(
    make_config: Callable[[int], ExperimentConfig],
    seeds: list[int],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``make_config(seed)`` for every seed, appending each finished run to
    ``runs.jsonl``; seeds already there are not run again (resume after an interruption)."""
    configs = {s: make_config(s) for s in seeds}  # validate every config before any work
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "config.json", configs[seeds[0]].resolved())
    write_json(out_dir / "meta.json", environment_info())
    log = out_dir / "runs.jsonl"
    done = {r["seed"]: r for r in read_jsonl(log)}
    for seed in seeds:
        if seed in done:
            continue
        if progress:
            progress(f"seed {seed}")
        run = run_once(configs[seed], progress=progress)
        append_jsonl(log, run)
        done[seed] = run
    runs = [done[s] for s in seeds]
    summary = {
        "name": configs[seeds[0]].name,
        "strategy": configs[seeds[0]].active.strategy,
        **summarize_runs(runs),
    }
    write_json(out_dir / "results.json", summary)
    return summary
