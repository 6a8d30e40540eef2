"""``eada run CONFIG.yaml`` for configs with ``task: segmentation`` (dispatched from
:mod:`eada.cli`): the dry-run printer and the multi-seed runner."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from eada.config import ConfigError
from eada.runs import format_warning, parse_seeds
from eada.segmentation.config import (
    GtavCityscapesData,
    SegExperimentConfig,
    SyntheticSegData,
    load_seg_config,
)
from eada.segmentation.data import CITYSCAPES_SIZES, GTAV_SIZE


def resolve_seg_config(
    path: str, method: str | None, overrides: list[str], seed: int
) -> SegExperimentConfig:
    """A segmentation config with a method's overrides (``eada.hparams.METHODS``), the user's
    ``--set`` overrides and the seed applied, validated."""
    pre: list[str] = []
    if method:
        from eada.hparams import METHODS

        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        pre = [f"{sec}.{k}={v}" for sec, d in METHODS[method].items() for k, v in d.items()]
    return load_seg_config(path, [*pre, *overrides, f"seed={seed}"])


def nominal_sizes(cfg: SegExperimentConfig) -> dict[str, int]:
    """Image counts the plan assumes without reading data: the public release sizes for GTAV /
    Cityscapes, the configured sizes for the synthetic pair."""
    if isinstance(cfg.data, SyntheticSegData):
        d = cfg.data
        return {"source": d.n_source, "target": d.n_target, "val": d.n_val}
    return {
        "source": GTAV_SIZE,
        "target": CITYSCAPES_SIZES["train"],
        "val": CITYSCAPES_SIZES["val"],
    }


def describe(cfg: SegExperimentConfig) -> list[str]:
    """Human-readable lines describing the protocol a config runs (for ``--dry-run``)."""
    from eada.segmentation.train import plan_rounds

    m, o, t, a = cfg.model, cfg.optim, cfg.train, cfg.active
    sizes = nominal_sizes(cfg)
    stride = m.output_stride if m.backbone != "tiny" else 4
    lines = [
        f"model: {m.head} on {m.backbone} (output stride {stride}), "
        f"ASPP rates {m.aspp_rates}, weights {m.weights or 'none (random init)'}, "
        f"frozen backbone BN {m.freeze_bn}",
        f"optimiser: SGD lr {o.lr} (head x{o.head_lr_mult}), momentum {o.momentum}, "
        f"weight decay {o.weight_decay}, poly power {o.poly_power} over {t.iterations} iterations",
        f"loss: {t.delta_s}*NLL(source) + {t.delta_t}*NLL(labeled target) + "
        f"{t.gamma}*L_fea(unlabeled target pixels), tau {t.tau}, Delta '{t.delta_mode}'",
    ]
    if isinstance(cfg.data, GtavCityscapesData):
        d = cfg.data
        for label, root in (("GTAV", d.gtav_root), ("Cityscapes", d.cityscapes_root)):
            state = "found" if root.is_dir() else "NOT FOUND (needed for a real run)"
            lines.append(f"{label} root: {root} ({state})")
        lines.append(
            f"source resized to {d.source_size[0]}x{d.source_size[1]}, crop {d.source_crop}; "
            f"target resized to {d.target_size[0]}x{d.target_size[1]}, crop {d.target_crop}; "
            f"batch {t.batch_size}; 19 classes, ignore 255"
        )
    lines.append(
        f"images (nominal): source {sizes['source']}, target pool {sizes['target']}, "
        f"val {sizes['val']}"
    )
    if a.enabled:
        plan = plan_rounds(a, sizes["target"])
        lines.append(
            f"active: strategy {a.strategy}, alpha1 {a.alpha1}, total budget {a.budget_total:.1%} "
            f"of the target images over {len(plan)} rounds; image score: F by "
            f"{a.free_energy_aggregation}, MvSM by {a.mvsm_aggregation}"
            + (
                f" (top {a.top_k_share:.1%} of pixels)"
                if "top_k" in (a.free_energy_aggregation, a.mvsm_aggregation)
                else ""
            )
        )
        for p in plan:
            lines.append(
                f"  round {p['round']} after iteration {p['iteration']}: pool {p['pool_before']}, "
                f"step 1 keeps {p['stage1']}, label {p['budget']} images"
            )
    else:
        lines.append("no active rounds (no target labels)")
    return lines


def run_segmentation_command(
    args: argparse.Namespace, console: Console, log: Callable[[str], None]
) -> int:
    """``eada run`` for a segmentation config: ``--dry-run`` validates and prints the plan
    without touching data; otherwise runs every seed and prints the mIoU table."""
    if getattr(args, "tensorboard", None):
        raise ConfigError("--tensorboard is not supported for segmentation configs")
    seeds = parse_seeds(args.seeds)
    configs = {s: resolve_seg_config(args.config, args.method, args.set, s) for s in seeds}
    cfg = configs[seeds[0]]
    if args.dry_run:
        console.print(yaml.safe_dump(cfg.resolved(), sort_keys=False))
        console.print(f"seeds: {seeds}")
        for line in describe(cfg):
            console.print(line, highlight=False)
        console.print("config valid; no data touched (--dry-run)")
        return 0
    from eada.segmentation.train import run_seg_seeds

    default_out = cfg.name.replace("/", "_") + (f"_{args.method}" if args.method else "")
    out = Path(args.out) if args.out else Path("runs") / default_out
    summary = run_seg_seeds(lambda s: configs[s], seeds, out, progress=log)
    table = Table(
        title=f"{cfg.name} / {cfg.active.strategy}: val mIoU % (mean ± std, {len(seeds)} seeds)"
    )
    for col in ("round", "labeled images", "mIoU"):
        table.add_column(col, justify="right")
    for row in summary["rounds"]:
        miou = row.get("miou")
        table.add_row(
            str(row["round"]),
            str(row["n_labeled"][0]),
            f"{miou['mean']:.2f} ± {miou['std']:.2f}" if miou else "-",
        )
    fin = summary["final"]["miou"]
    table.add_row("final", "", f"{fin['mean']:.2f} ± {fin['std']:.2f}")
    console.print(table)
    for w in summary.get("warnings", []):
        console.print(format_warning(w), highlight=False, markup=False)
    console.print(f"results: {out / 'results.json'}")
    return 0
