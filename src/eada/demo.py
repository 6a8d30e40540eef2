"""``eada demo``: the paper's toy example (Fig. 5) over several seeds, on the embedded default.

Runs Source-only, Random and EADA (plus the ablation EADA without the alignment loss) with the
fixed toy protocol of :mod:`eada.hparams`, prints target errors (mean +- std) beside the paper's,
and draws a Fig.-5-like PNG for the first seed. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eada.data.tasks import load_task
from eada.experiment import final_accuracy, run_once
from eada.hparams import METHOD_LABELS, preset_config
from eada.models.base import EnergyNet
from eada.reports.figures import ToyPanel, plot_toy
from eada.runs import append_jsonl, environment_info, summarize, write_json
from eada.train.loop import ActiveDATrainer

#: Target errors (%) the paper reports for the toy example (Sec. "Toy example").
PAPER_TOY_ERRORS: dict[str, float] = {"source_only": 52.0, "random": 8.5, "badge": 4.2, "eada": 1.0}
DEMO_METHODS: tuple[str, ...] = ("source_only", "random", "eada", "eada_no_fea")


def _boundary(model: torch.nn.Module) -> tuple[np.ndarray, float]:
    if not isinstance(model, EnergyNet):
        raise TypeError("the toy figure needs an EnergyNet with a linear head")
    w = model.head.weight.detach().cpu().numpy().astype(float)
    b = model.head.bias.detach().cpu().numpy().astype(float)
    return w[0] - w[1], float(b[0] - b[1])


def run_demo(
    seeds: int = 3,
    out: Path = Path("runs/demo"),
    methods: tuple[str, ...] = DEMO_METHODS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the toy benchmark and write ``results.json``, ``runs.jsonl`` and ``toy_fig5.png``.

    Args:
        seeds: number of seeds (0 .. seeds-1); each seed draws new data and a new init.
        out: output folder.
        methods: method names of :data:`eada.hparams.METHODS`.
        progress: called with a line of text after every run.

    Returns:
        The ``results.json`` content: per method the per-seed and mean target error in percent
        (``strategies.<name>.errors`` / ``.mean_error`` / ``.std_error``).
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    configs = {(m, s): preset_config("toy", m, s) for m in methods for s in range(seeds)}
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    log.unlink(missing_ok=True)
    strategies: dict[str, Any] = {}
    panels: list[ToyPanel] = []
    for m in methods:
        errors, round_errors = [], []
        for s in range(seeds):
            cfg = configs[(m, s)]
            task = load_task(cfg.data, s)
            bounds: list[tuple[np.ndarray, float]] = []

            def record(
                event: str,
                trainer: ActiveDATrainer,
                info: dict[str, Any],
                _b: list[tuple[np.ndarray, float]] = bounds,
            ) -> None:
                if event == "before_round":
                    _b.append(_boundary(trainer.model))

            final_model: dict[str, Any] = {}

            def keep(
                event: str,
                trainer: ActiveDATrainer,
                info: dict[str, Any],
                _f: dict[str, Any] = final_model,
            ) -> None:
                if event == "epoch_end":
                    _f["boundary"] = _boundary(trainer.model)

            run = run_once(cfg, task, callbacks=[record, keep])
            append_jsonl(log, {"method": m, **run})
            err = 100.0 - final_accuracy(run)
            errors.append(err)
            round_errors.append(
                [
                    100.0 - r["after_training"]["target"]["accuracy"]
                    for r in run["results"]["rounds"]
                    if "after_training" in r
                ]
            )
            if progress:
                progress(f"{METHOD_LABELS[m]:<16} seed {s}: target error {err:5.1f}%")
            if s == 0:
                panels.append(
                    ToyPanel.from_run(
                        f"{METHOD_LABELS[m]} (seed 0): {err:.1f}% error",
                        task,
                        run,
                        bounds,
                        final_model["boundary"],
                    )
                )
        stats = summarize(errors)
        strategies[m] = {
            "label": METHOD_LABELS[m],
            "errors": errors,
            "mean_error": stats["mean"],
            "std_error": stats["std"],
            "round_errors": round_errors,
            "paper_error": PAPER_TOY_ERRORS.get(m),
        }
    figure = plot_toy(panels, out / "toy_fig5.png")
    results = {
        "benchmark": "toy (paper Fig. 5)",
        "protocol": configs[(methods[-1], 0)].resolved(),
        "seeds": list(range(seeds)),
        "metric": "target error (%), whole target set, last epoch",
        "strategies": strategies,
        "paper": PAPER_TOY_ERRORS,
        "figure": figure.name,
        "meta": environment_info(),
    }
    write_json(out / "results.json", results)
    return results


def demo_table_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(method, ours mean +- std, paper)`` rows for printing."""
    rows = []
    for s in results["strategies"].values():
        paper = "-" if s["paper_error"] is None else f"{s['paper_error']:.1f}"
        rows.append((s["label"], f"{s['mean_error']:.1f} ± {s['std_error']:.1f}", paper))
    return rows
