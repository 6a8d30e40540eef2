"""Two-class tasks: the alignment variants when ``C = 2`` (issue 23, part 6).

Two-class tasks built from the in-repo data with ``data.keep_classes``:

* SURF (Office-Caltech10, ``configs/office_caltech10_surf.yaml``): for each of the 12 domain
  pairs, the class pair a 1-nearest-neighbour classifier trained on the source confuses most
  on the target (symmetric count of confusions; chosen before any EADA run, so the pairs are
  hard ones, not ones picked for a result). The same protocol as the 10-class tasks.
* digits 3-vs-8 (``--digits``): MNIST->USPS and MNIST->MNIST-M, the ``digits/*`` presets.
* Office-31 (``--office31``): frozen EfficientNet-Lite0 features, amazon subset <-> webcam
  (``configs/office31_*_lite0_frozen.yaml``), per direction the two class pairs a 1-NN on the
  frozen features confuses most.

Each task runs EADA with the default ``normalized`` alignment, with the paper's ``paper``
alignment and without ``L_fea`` (``eada_no_fea``: paired, ``L_fea`` weighted 0 on EADA's own
batches; ``no_fea_unpaired``, ``gamma = 0``, holds the records made before it was paired),
seeds 0-2 by default; one ``runs.jsonl`` a
task and variant under ``--out`` (resumable), the summary in ``OUT/summary.json``.

Usage (repository root, ../shared/data beside it; one torch thread):

    python benchmarks/investigations/two_class.py [--seeds 0-2] [--digits] \\
        [--out benchmarks/results/two_class]
    python benchmarks/investigations/two_class.py --table-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from eada.config import ExperimentConfig, load_config
from eada.data.features import normalize_features, read_feature_file
from eada.experiment import run_seeds
from eada.hparams import METHODS, preset_config
from eada.reports.tables import markdown_table
from eada.runs import environment_info, jsonl_exists, parse_seeds, read_jsonl, write_json

CONFIG = "configs/office_caltech10_surf.yaml"
DOMAINS = {"C": "Caltech10", "A": "amazon", "W": "webcam", "D": "dslr"}
# labels 1..10 of the SURF files: the Office-Caltech10 classes in alphabetical order (the files
# carry no names)
SURF_CLASSES = [
    "back_pack",
    "bike",
    "calculator",
    "headphones",
    "keyboard",
    "laptop",
    "monitor",
    "mouse",
    "mug",
    "projector",
]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    # the variants without a gate pin it: "normalized" is the default before it became the
    # labels gate ("normalized_labels")
    "normalized": ("eada", ["train.alignment=normalized", "train.fea_gate=none"]),
    "paper": ("eada", ["train.alignment=paper", "train.fea_gate=none"]),
    # w/o L_fea, paired (train.fea_gate: zero: EADA's batches, the term weighted 0); the records
    # before it existed are the unpaired one (train.gamma: 0: no unlabeled batch drawn)
    "no_fea": ("eada_no_fea", ["train.alignment=normalized"]),
    "no_fea_unpaired": (
        "eada",
        ["train.alignment=normalized", "train.gamma=0", "train.fea_gate=none"],
    ),
    # L_fea gated (train.fea_gate, eada.energy.FEA_GATES), added after the first three
    "normalized_dann": ("eada", ["train.alignment=normalized", "train.fea_gate=dann"]),
    "normalized_labels": ("eada", ["train.alignment=normalized", "train.fea_gate=labels"]),
    "normalized_confidence": (
        "eada",
        ["train.alignment=normalized", "train.fea_gate=confidence"],
    ),
}
GATED = ("normalized_dann", "normalized_labels", "normalized_confidence")
OFFICE31 = {  # frozen EfficientNet-Lite0 features of Office-31, amazon subset <-> webcam
    "Office-31 A(sub)->W": "configs/office31_amazon_subset_webcam_lite0_frozen.yaml",
    "Office-31 W->A(sub)": "configs/office31_webcam_amazon_subset_lite0_frozen.yaml",
}
DIGIT_TASKS = {"MNIST->USPS 3v8": "mnist-usps", "MNIST->MNIST-M 3v8": "mnist-mnistm"}


def most_confused_pair(src: Path, tgt: Path) -> tuple[list[int], int]:
    """The class pair (0-based ids) a source-trained 1-NN confuses most on the target (the
    JDA preprocessing), and its count of confusions (both directions)."""
    from sklearn.neighbors import KNeighborsClassifier

    xs, ys = read_feature_file(src)
    xt, yt = read_feature_file(tgt)
    xs, xt = normalize_features(xs, "l1_zscore"), normalize_features(xt, "l1_zscore")
    pred = KNeighborsClassifier(n_neighbors=1).fit(xs, ys).predict(xt)
    classes = sorted(set(ys.tolist()))
    conf = np.zeros((len(classes), len(classes)), dtype=int)
    for a, b in zip(yt.tolist(), pred.tolist(), strict=True):
        conf[classes.index(a), classes.index(b)] += 1
    sym = conf + conf.T
    np.fill_diagonal(sym, -1)
    i, j = np.unravel_index(int(np.argmax(sym)), sym.shape)
    return sorted([int(i), int(j)]), int(sym[i, j])


def last_acc(rec: dict[str, Any]) -> float:
    """A run record's last-epoch target accuracy (%)."""
    return float(rec["results"]["final"]["last_epoch"]["target"]["accuracy"])


def read_runs(folder: Path) -> list[dict[str, Any]]:
    """The run records of ``folder/runs.jsonl`` (empty when absent)."""
    log = folder / "runs.jsonl"
    archived = Path(__file__).resolve().parents[1] / "results" / "archived_logs.json"
    if not jsonl_exists(log) and archived.is_file():
        rel = log.resolve().relative_to(archived.parents[2]).as_posix()
        if any(e["path"].startswith(rel) for e in json.loads(archived.read_text())["logs"]):
            raise SystemExit(
                f"{rel} is archived in git history: run "
                f"`python scripts/run_logs.py restore {rel}` first"
            )
    return read_jsonl(log)


def summarize(out: Path, tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per task and variant the per-seed last-epoch accuracies, their mean and std, and the
    differences to ``no_fea``."""
    for name, info in tasks.items():
        for v in VARIANTS:
            recs = sorted(read_runs(out / info["folder"] / v), key=lambda r: r["seed"])
            accs = [last_acc(r) for r in recs]
            info[v] = {
                "seeds": [r["seed"] for r in recs],
                "accuracy": accs,
                "mean": float(np.mean(accs)) if accs else None,
                "std": float(np.std(accs, ddof=1)) if len(accs) > 1 else None,
            }
        base = info["no_fea"]["mean"]
        for v in ("normalized", "paper", "no_fea_unpaired", *GATED):
            m = info[v]["mean"]
            info[v]["minus_no_fea"] = None if m is None or base is None else m - base
        tasks[name] = info
    return tasks


def markdown(tasks: dict[str, dict[str, Any]]) -> str:
    """One row a task: the classes, each variant's mean ± std and the differences."""
    head = [
        "task",
        "classes",
        "EADA w/o L_fea",
        "w/o L_fea, unpaired (gamma 0)",
        "EADA paper",
        "EADA normalized (default)",
        "normalized - w/o",
        "paper - w/o",
    ]
    gated = [v for v in GATED if any(info[v]["mean"] is not None for info in tasks.values())]
    head += [f"{v} - w/o" for v in gated]
    body = []

    def cell(r: dict[str, Any]) -> str:
        if r["mean"] is None:
            return "–"
        return f"{r['mean']:.1f}" + ("" if r["std"] is None else f" ± {r['std']:.1f}")

    def diff(r: dict[str, Any]) -> str:
        d = r.get("minus_no_fea")
        return "–" if d is None else f"{d:+.1f}"

    for name, info in tasks.items():
        body.append(
            [
                name,
                " vs ".join(info["class_names"]),
                cell(info["no_fea"]),
                cell(info["no_fea_unpaired"]),
                cell(info["paper"]),
                cell(info["normalized"]),
                diff(info["normalized"]),
                diff(info["paper"]),
                *(f"{cell(info[v])} ({diff(info[v])})" for v in gated),
            ]
        )
    return markdown_table(head, body)


def gates_markdown(out: Path, tasks: dict[str, dict[str, Any]]) -> str:
    """The gated variants beside EADA w/o ``L_fea`` (paired: ``L_fea`` weighted 0 on EADA's
    own batches) and its unpaired form (``gamma = 0``, other batches); one row a task that has
    a gated run, mean over seeds 0-2 (in brackets the difference to the paired w/o)."""

    def mean(folder: Path) -> float | None:
        accs = [last_acc(r) for r in read_runs(folder) if r["seed"] <= 2]
        return float(np.mean(accs)) if len(accs) == 3 else None

    head = ["task", "w/o L_fea", "w/o L_fea, unpaired (gamma 0)", "normalized (default)"]
    head += [f"{v.removeprefix('normalized_')} gate" for v in GATED]
    body = []
    for name, info in tasks.items():
        folder = out / info["folder"]
        gated = [mean(folder / v) for v in GATED]
        if all(g is None for g in gated):
            continue
        base = mean(folder / "no_fea")

        def cell(m: float | None, base: float | None = base) -> str:
            if m is None:
                return "–"
            return f"{m:.1f}" + ("" if base is None else f" ({m - base:+.1f})")

        row = [name, cell(base, None), cell(mean(folder / "no_fea_unpaired"))]
        row += [cell(mean(folder / "normalized")), *(cell(g) for g in gated)]
        body.append(row)
    return markdown_table(head, body)


def surf_tasks(data: Path) -> dict[str, dict[str, Any]]:
    """The 12 SURF domain pairs, each on its most confused class pair."""
    tasks: dict[str, dict[str, Any]] = {}
    for s, sname in DOMAINS.items():
        for t, tname in DOMAINS.items():
            if s == t:
                continue
            src, tgt = data / f"{sname}_SURF_L10.mat", data / f"{tname}_SURF_L10.mat"
            pair, confusions = most_confused_pair(src, tgt)
            name = f"SURF {s}->{t}"
            tasks[name] = {
                "folder": f"surf/{s}-{t}",
                "kind": "surf",
                "source": str(src),
                "target": str(tgt),
                "keep_classes": pair,
                "class_names": [SURF_CLASSES[i] for i in pair],
                "nn_confusions": confusions,
            }
    return tasks


def office31_tasks(pairs: int = 2) -> dict[str, dict[str, Any]]:
    """Office-31 frozen Lite0 (both ways): per direction the ``pairs`` class pairs a
    source-trained 1-NN on the frozen features confuses most on the target (symmetric count,
    as for SURF; the features come from the config's cache, extracted there if absent)."""
    from sklearn.neighbors import KNeighborsClassifier

    from eada.data.tasks import load_task

    tasks: dict[str, dict[str, Any]] = {}
    for name, config in OFFICE31.items():
        cfg = load_config(config)
        task = load_task(cfg.data, 0, cfg.model)
        xs, ys = task.source.x.numpy(), task.source.y.numpy()  # type: ignore[attr-defined]
        xt, yt = task.target.x.numpy(), task.target.y.numpy()  # type: ignore[attr-defined]
        pred = KNeighborsClassifier(n_neighbors=1).fit(xs, ys).predict(xt)
        c = len(task.source.classes)
        conf = np.zeros((c, c), dtype=int)
        np.add.at(conf, (yt, pred), 1)
        sym = conf + conf.T
        np.fill_diagonal(sym, -1)
        iu = np.triu_indices(c, k=1)
        order = np.argsort(-sym[iu], kind="stable")[:pairs]
        for k in order:
            pair = [int(iu[0][k]), int(iu[1][k])]
            names = [task.source.classes[i] for i in pair]
            short = "A-W" if name.endswith("->W") else "W-A"
            tasks[f"{name} {names[0]} vs {names[1]}"] = {
                "folder": f"office31/{short}_{names[0]}_vs_{names[1]}",
                "kind": "office31",
                "config": config,
                "keep_classes": pair,
                "class_names": names,
                "nn_confusions": int(sym[pair[0], pair[1]]),
            }
    return tasks


def digit_tasks() -> dict[str, dict[str, Any]]:
    """Digits 3-vs-8 on the digits presets."""
    return {
        name: {
            "folder": f"digits/{preset}_3v8",
            "kind": "digits",
            "preset": f"digits/{preset}",
            "keep_classes": [3, 8],
            "class_names": ["3", "8"],
        }
        for name, preset in DIGIT_TASKS.items()
    }


def config_maker(info: dict[str, Any], variant: str) -> Callable[[int], ExperimentConfig]:
    """``seed -> config`` of one task and variant."""
    method, extra = VARIANTS[variant]
    keep = f"data.keep_classes=[{info['keep_classes'][0]}, {info['keep_classes'][1]}]"
    if info["kind"] == "surf":
        sets = [f"{a}.{k}={v}" for a, d in METHODS[method].items() for k, v in d.items()]
        sets += [f"data.source={info['source']}", f"data.target={info['target']}"]
        sets += [f"name=two_class/{info['folder']}", keep, *extra]
        return lambda seed: load_config(CONFIG, [*sets, f"seed={seed}"])
    if info["kind"] == "office31":
        sets = [f"{a}.{k}={v}" for a, d in METHODS[method].items() for k, v in d.items()]
        sets += [f"name=two_class/{info['folder']}", keep, *extra]
        return lambda seed: load_config(info["config"], [*sets, f"seed={seed}"])
    sets = [keep, "train.forward=fused", "train.channels_last=true", *extra]
    return lambda seed: preset_config(info["preset"], method, seed, sets)


def selection_check(info: dict[str, Any], variant: str, seed: int) -> dict[str, Any]:
    """Train ``variant`` on a SURF task up to its first round (``rounds_at[0]`` epochs), then
    let EADA, entropy, margin (BvSB) and least confidence select the first round's budget from
    the same pool outputs; also the free-energy rank (1 = highest) of the 10 most uncertain
    samples (smallest ``|E1 - E2|``) and the correlation of ``F`` with ``-|E1 - E2|``."""
    import torch

    from eada.data.tasks import load_task
    from eada.strategies import get_strategy
    from eada.strategies.base import resolve_budget
    from eada.train import ActiveDATrainer

    cfg = config_maker(info, variant)(seed)
    first = cfg.active.rounds_at[0]
    cfg = load_config(
        CONFIG,
        [
            f"data.source={info['source']}",
            f"data.target={info['target']}",
            f"data.keep_classes=[{info['keep_classes'][0]}, {info['keep_classes'][1]}]",
            f"train.alignment={cfg.train.alignment}",
            f"train.epochs={first}",
            "active.rounds_at=[]",
            f"seed={seed}",
        ],
    )
    tr = ActiveDATrainer(cfg, load_task(cfg.data))
    tr.run()
    pool = torch.nonzero(~tr.labeled_mask).squeeze(1)
    out = tr._score(pool, ("energies",))
    a = cfg.active
    budget = resolve_budget(a.budget_per_round, len(pool))
    share = a.budget_per_round if isinstance(a.budget_per_round, float) else None
    chosen = {}
    for name in ("eada", "entropy", "margin", "least_confidence"):
        kw: dict[str, Any] = {}
        if name == "eada":
            kw = {"alpha1": a.alpha1, "rule": a.selection_rule, "budget_share": share}
        sel = get_strategy(name).fn(out, budget, np.random.default_rng(seed), **kw)
        chosen[name] = sorted(int(i) for i in sel.indices)
    e = torch.from_numpy(np.asarray(out.energies))
    f = -torch.logsumexp(-e, dim=1)
    margin = (e[:, 0] - e[:, 1]).abs()
    rank_f = torch.argsort(torch.argsort(-f)) + 1
    return {
        "variant": variant,
        "seed": seed,
        "pool": len(pool),
        "budget": budget,
        "selected": chosen,
        "eada_equals_entropy": chosen["eada"] == chosen["entropy"],
        "f_rank_of_10_most_uncertain": rank_f[torch.argsort(margin)[:10]].tolist(),
        "corr_f_uncertainty": float(np.corrcoef(f.numpy(), -margin.numpy())[0, 1]),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the tasks x variants x seeds; write ``OUT/summary.json``; print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/two_class")
    p.add_argument("--digits", action="store_true", help="also the digits 3-vs-8 tasks")
    p.add_argument(
        "--office31",
        action="store_true",
        help="also Office-31 frozen Lite0 both ways, two class pairs each",
    )
    p.add_argument("--only", default="", help="comma-separated task folders to run, e.g. surf/D-A")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated variants to run (default all: {', '.join(VARIANTS)})",
    )
    p.add_argument("--table-only", action="store_true")
    p.add_argument(
        "--gates-table",
        action="store_true",
        help="print the gated variants beside w/o L_fea (paired and unpaired)",
    )
    p.add_argument(
        "--resummarize",
        action="store_true",
        help="recompute summary.json from the run records (keeps its timing fields)",
    )
    p.add_argument(
        "--selection-check",
        default="",
        help="a SURF task folder (e.g. surf/A-C): compare the first round's selections instead",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    summary_file = out / "summary.json"
    if args.selection_check:
        info = next(
            i for i in surf_tasks(Path(args.data)).values() if i["folder"] == args.selection_check
        )
        rows = [
            selection_check(info, v, s)
            for v in ("normalized", "paper", "no_fea")
            for s in parse_seeds(args.seeds)
        ]
        for r in rows:
            print(json.dumps(r), file=sys.stderr)
        name = args.selection_check.replace("/", "_")
        write_json(out / f"selection_check_{name}.json", {"task": info, "rounds": rows})
        return 0
    if args.gates_table:
        print(gates_markdown(out, json.loads(summary_file.read_text())["tasks"]))
        return 0
    if args.table_only:
        print(markdown(json.loads(summary_file.read_text())["tasks"]))
        return 0
    if args.resummarize:
        old = json.loads(summary_file.read_text())
        old["tasks"] = summarize(out, old["tasks"])
        write_json(summary_file, old)
        print(markdown(old["tasks"]))
        return 0
    seeds = parse_seeds(args.seeds)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    tasks = surf_tasks(Path(args.data)) | (digit_tasks() if args.digits else {})
    tasks |= office31_tasks() if args.office31 else {}
    if summary_file.is_file():  # keep the tasks of earlier invocations (e.g. --digits)
        tasks = json.loads(summary_file.read_text())["tasks"] | tasks
    only = set(filter(None, args.only.split(",")))
    t_start, c_start = time.perf_counter(), time.process_time()
    for name, info in tasks.items():
        if only and info["folder"] not in only:
            continue
        if info["kind"] == "digits" and not args.digits:
            continue
        if info["kind"] == "office31" and not args.office31:
            continue
        for v in variants:
            run_seeds(config_maker(info, v), seeds, out / info["folder"] / v)
        print(f"{name} {info['class_names']}: done", file=sys.stderr)
    summary: dict[str, Any] = {"benchmark": "two_class", "seeds": seeds}
    summary["variants"] = {v: {"method": m, "sets": s} for v, (m, s) in VARIANTS.items()}
    summary["tasks"] = summarize(out, tasks)
    summary["seconds"] = time.perf_counter() - t_start
    summary["cpu_seconds"] = time.process_time() - c_start
    summary["loadavg_end"] = os.getloadavg()
    summary["meta"] = environment_info()
    write_json(summary_file, summary)
    print(markdown(summary["tasks"]))
    print(f"\ntotal {summary['seconds']:.0f} s wall, {summary['cpu_seconds']:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
