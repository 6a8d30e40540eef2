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
from eada.data.identity import data_inputs
from eada.data.tasks import Task, load_task
from eada.distributed import broadcast_object, rank_world
from eada.runs import (
    OtherConfigError,
    SeedFolder,
    collect_warnings,
    open_seed_folder,
    summarize,
    write_json,
)
from eada.threads import thread_record
from eada.train import ActiveDATrainer
from eada.train.domain_stats import DomainStatsRecorder
from eada.train.loop import Callback


def resolve_config(
    config: str | Path,
    method: str | None = None,
    seed: int = 0,
    overrides: list[str] | None = None,
) -> ExperimentConfig:
    """The validated config of one ``eada run`` seed: a preset (with ``method``'s changes
    merged) or a YAML file (with ``method``'s changes as overrides), then ``overrides``.

    Raises:
        ConfigError: neither a preset nor a file, an unknown method, or an invalid config.
    """
    from eada.config import ConfigError, load_config
    from eada.hparams import PRESETS, get_method, preset_config

    if str(config) in PRESETS:
        return preset_config(str(config), method, seed, list(overrides or []))
    path = Path(config)
    if not path.exists():
        raise ConfigError(
            f"{str(config)!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
            "nor an existing config file"
        )
    changes: list[str] = []
    if method:
        try:
            made = get_method(method)  # a plugin's method too
        except ValueError as err:
            raise ConfigError(str(err)) from None
        changes = [f"{sec}.{k}={v}" for sec, d in made.items() for k, v in d.items()]
    return load_config(path, [*changes, *(overrides or []), f"seed={seed}"])


def run_once(
    cfg: ExperimentConfig,
    task: Task | None = None,
    callbacks: list[Callback] | None = None,
    progress: Callable[[str], None] | None = None,
    record_stats: bool = True,
) -> dict[str, Any]:
    """Train one seed; returns ``{"seed", "config", "results"}`` (JSON-ready).

    With ``record_stats`` a :class:`~eada.train.domain_stats.DomainStatsRecorder` adds
    ``results["domain_stats"]`` (free energies, A-distance, MMD per round, for the report).
    Callbacks with an ``attach(trainer)`` method are attached before training starts.
    """
    task = task if task is not None else load_task(cfg.data, cfg.seed, cfg.model, cfg.device)
    recorder = DomainStatsRecorder(seed=cfg.seed) if record_stats else None
    cbs: list[Callback] = [*(callbacks or []), *([recorder] if recorder else [])]
    trainer = ActiveDATrainer(cfg, task, callbacks=cbs)
    for cb in cbs:
        attach = getattr(cb, "attach", None)
        if callable(attach):
            attach(trainer)
    result = trainer.run(progress=progress).to_dict()
    if recorder is not None:
        result["domain_stats"] = recorder.data
    result["threads"] = trainer.threads
    result["step_setup"] = trainer.step_setup  # what the step ran with on this device
    result["data"] = {"classes": list(task.target.classes), **task.notes}  # e.g. skipped images
    from eada.extend import plugins_of

    out = {"seed": cfg.seed, "config": cfg.resolved(), "results": result}
    used = plugins_of(cfg)  # the plugins (strategy, components, backbone) the run used
    if used:
        out["plugins"] = used
    return out


def final_accuracy(
    run: dict[str, Any], split: str = "target", key: str = "accuracy", which: str = "last_epoch"
) -> float:
    """A run's final accuracy (percent) on ``split``: ``target`` (whole target set),
    ``target_unlabeled`` (target samples never labeled) or ``heldout``."""
    return float(run["results"]["final"][which][split][key])


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean +- std over seeds: final (last and best epoch) and after every round; the runs'
    training warnings, each with its seed."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "final": {}, "rounds": []}
    # target: the whole target set (transductive, as the paper); target_unlabeled: its samples
    # not labeled (at the end: never labeled); heldout: the held-out split, where there is one
    splits = [
        s
        for s in ("target", "target_unlabeled", "heldout")
        if all(s in r["results"]["final"]["last_epoch"] for r in runs)
    ]
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
            vals = [
                x["after_training"][split]["accuracy"]
                for x in recs
                if split in x.get("after_training", {})
            ]
            if len(vals) == len(recs):
                row[f"{split}/accuracy"] = {"values": vals, **summarize(vals)}
                mca = [x["after_training"][split]["mean_class_accuracy"] for x in recs]
                row[f"{split}/mean_class_accuracy"] = {"values": mca, **summarize(mca)}
        if i > 0:
            row["selection_seconds"] = summarize([x["selection_seconds"] for x in recs])
            row["selected_error_rate"] = summarize([x["selected_error_rate"] for x in recs])
        out["rounds"].append(row)
    final0 = runs[0]["results"]["final"]
    out["protocol"] = final0.get("protocol")
    out["best_epochs"] = [r["results"]["final"]["best_epoch"]["epoch"] for r in runs]
    out["classes"] = runs[0]["results"].get("data", {}).get("classes")
    out["warnings"] = collect_warnings(runs)  # e.g. the L_fea runaway (eada.energy)
    for split in splits:  # per-class accuracy at the last epoch (VisDA's table)
        pcs = [r["results"]["final"]["last_epoch"][split]["per_class_accuracy"] for r in runs]
        out["final"][f"last_epoch/{split}/per_class_accuracy"] = [
            summarize([p[c] for p in pcs if p[c] is not None]) for c in range(len(pcs[0]))
        ]
    return out


def run_seeds(
    make_config: Callable[[int], ExperimentConfig],
    seeds: list[int],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
    make_callbacks: Callable[[int], list[Callback]] | None = None,
) -> dict[str, Any]:
    """Run ``make_config(seed)`` for every seed, appending each finished run to
    ``runs.jsonl``; seeds already there are not run again (resume after an interruption).
    A folder whose runs were made with another config (any key but the seed) is refused with
    :class:`~eada.runs.OtherConfigError` before any work, so results are never mixed; one
    whose runs were made on other data (the digests of :func:`eada.data.identity.data_inputs`
    differ, or were not recorded) with :class:`~eada.runs.OtherDataError`. Each new record
    carries its ``inputs`` and its own ``meta`` (commit, command, time); reused runs keep
    theirs, ``progress`` is told "reused N runs made at ... by commit ...", and ``meta.json``
    and ``results.json`` are rewritten only when something was trained.
    ``make_callbacks(seed)`` gives each run its trainer callbacks (progress bars, TensorBoard).

    Under ``torchrun`` every rank trains; rank 0 alone decides which seeds remain, writes the
    records and returns the summary (the other ranks return ``{}``)."""
    configs = {s: make_config(s) for s in seeds}  # validate every config before any work
    rank, world = rank_world()
    folder: SeedFolder | None = None
    problem = None
    if rank == 0:  # under torchrun only rank 0 reads and writes the records
        first = configs[seeds[0]]
        try:
            inputs = data_inputs(first.data, first.model)  # the data's identity, hashed once
            folder = open_seed_folder(
                out_dir, first.resolved(), inputs, seeds, progress, {"world_size": world}
            )
        except OtherConfigError as err:
            problem = str(err)
    problem = broadcast_object(problem)  # every rank stops together
    if problem is not None:
        raise OtherConfigError(problem)
    todo = broadcast_object(folder.todo if folder is not None else None)
    for seed in todo:
        if progress and rank == 0:
            progress(f"seed {seed}")
        cbs = make_callbacks(seed) if make_callbacks and rank == 0 else None
        run = run_once(
            configs[seed],
            callbacks=cbs,
            progress=progress if rank == 0 else None,
            record_stats=rank == 0,
        )
        if folder is not None:
            folder.record(seed, run)
    if folder is None:
        return {}
    if todo:  # the count the runs trained with (chosen per model once it was built)
        write_json(out_dir / "meta.json", {**folder.meta, "threads": thread_record()})
    summary = {
        "name": configs[seeds[0]].name,
        "strategy": configs[seeds[0]].active.strategy,
        **summarize_runs([folder.done[s] for s in seeds]),
    }
    folder.write_results(summary)
    return summary
