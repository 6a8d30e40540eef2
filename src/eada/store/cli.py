"""The annotation-round subcommands of ``eada`` (a project store in a folder):

eada init --store DIR (--preset NAME [--method M] | --config FILE.yaml
                       | --source-dir D --target-dir D) [--seed S] [--set k=v ...] [--root DIR ...]
                       [--threads N]
eada query --store DIR [--budget N] [--threads N]
                                               score the pool, select, export CSV/JSON/Label Studio
eada label import FILE --store DIR [--annotator NAME] [--allow-unqueried]
eada train --store DIR [--epochs N] [--simulate]
eada status --store DIR [--json]
eada export --store DIR --out DIR              labels (CSV) and the final model (weights + JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
DEFAULT_STORE = os.environ.get("EADA_STORE", "eada-project")


def _log(msg: str) -> None:
    """A progress line on stderr, plain and unwrapped (logs and CI read it whole)."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _project(args: argparse.Namespace) -> Any:
    from eada.store import Project

    return Project(args.store)


def _cmd_init(args: argparse.Namespace) -> int:
    from eada.config import ConfigError
    from eada.hparams import preset_config
    from eada.store import init_project
    from eada.store.config import StoreOptions, build_config, load_project_config

    options = StoreOptions()
    given = [x for x in (args.preset, args.config, args.source_dir) if x]
    if len(given) != 1:
        raise ConfigError("give exactly one of --preset, --config, or --source-dir/--target-dir")
    if args.preset:
        cfg = preset_config(args.preset, args.method, args.seed, args.set)
    elif args.config:
        cfg, options = load_project_config(args.config, [*args.set, f"seed={args.seed}"])
    else:
        if not args.target_dir:
            raise ConfigError("--source-dir needs --target-dir")
        from eada.config import apply_overrides

        raw: dict[str, Any] = {
            "name": "folders",
            "seed": args.seed,
            "data": {
                "kind": "folders",
                "source": str(Path(args.source_dir).absolute()),
                "target": str(Path(args.target_dir).absolute()),
                "image_size": args.image_size,
            },
            "model": {"name": "lenet"},
            "optim": {"name": "adam", "lr": 0.001},
            "train": {"epochs": 7, "batch_size": 32},
            "active": {"strategy": "eada", "rounds_at": [1, 2, 3, 4, 5], "budget_per_round": 0.01},
        }
        cfg = build_config(apply_overrides(raw, args.set), "--source-dir/--target-dir project")
    roots = [Path(r) for r in args.root]
    proj = init_project(args.store, cfg, roots, options, progress=_log)
    st = proj.status()
    labeled = "labeled" if proj.target_labeled else "unlabeled"
    console.print(
        f"project {args.store}: {len(proj.store.samples('source'))} source and "
        f"{st['n_target']} {labeled} target samples, {len(proj.classes)} classes; "
        f"plan: {len(proj.plan())} rounds; next: eada train --store {args.store}"
    )
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    proj = _project(args)
    out = proj.query(budget=args.budget)
    what = "still awaits labels, exported again" if out["reexported"] else "selected"
    console.print(f"round {out['round']}: {out['selected']} samples {what}")
    for k, v in out["files"].items():
        console.print(f"  {k:<20} {v}")
    if "json" in out["files"]:
        doc = json.loads(Path(out["files"]["json"]).read_text())
        root = doc.get("label_studio_document_root")
        if any(s.get("path") for s in doc.get("samples", [])):  # feature rows: no files served
            console.print(f"  Label Studio: LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={root}")
    return 0


def _cmd_label_import(args: argparse.Namespace) -> int:
    proj = _project(args)
    out = proj.import_labels(args.file, args.annotator, args.allow_unqueried)
    console.print(
        f"imported {args.file} ({out['format']}): {out['new']} new, {out['corrections']} "
        f"corrections, {out['unchanged']} unchanged; {out['pending']} queried samples await labels"
    )
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    proj = _project(args)
    if args.simulate:
        if args.epochs is not None:
            raise ValueError("--simulate follows the config's schedule; drop --epochs")
        st = proj.run_simulated(progress=_log)
        _print_status(st)
        return 0
    out = proj.train(epochs=args.epochs, progress=_log)
    m = out["metrics"]
    accs = [
        f"{name} accuracy {m[key]['accuracy']:.2f}%"
        for key, name in (("target", "target"), ("heldout", "held-out"))
        if isinstance(m.get(key), dict)
    ]
    console.print(
        f"trained epochs {out['from_epoch']}->{out['epoch']} with {out['n_labeled']} target "
        f"labels: {'; '.join(accs) or 'no labeled split to measure accuracy on'}; "
        f"next: {proj.next_action()}"
    )
    return 0


def _print_status(st: dict[str, Any]) -> None:
    console.print(
        f"mode {st['mode']}, epoch {st['epoch']}, labeled {st['n_labeled']}/{st['n_target']} "
        f"({st['budget_spent_percent']:.2f}% of the target), corrections {st['corrections']}, "
        f"next: {st['next']}"
    )
    t = Table(title="rounds")
    for col in ("round", "epoch", "strategy", "selected", "labeled", "pending"):
        t.add_column(col)
    for r in st["rounds"]:
        t.add_row(
            *[str(r[c]) for c in ("round", "epoch", "strategy", "selected", "labeled", "pending")]
        )
    console.print(t)
    h = Table(title="accuracy history")
    for col in ("epoch", "labeled", "target %", "heldout %"):
        h.add_column(col, justify="right")
    for e in st["history"]:
        h.add_row(
            str(e["epoch"]),
            str(e["n_labeled"]),
            *[f"{e[k]:.2f}" if k in e else "-" for k in ("target_accuracy", "heldout_accuracy")],
        )
    console.print(h)
    acc = st.get("accuracy") or {}
    for key, name in (("heldout", "held-out"), ("target", "target"), ("queried", "queried")):
        a = acc.get(key)
        if a is not None:
            console.print(f"{name} accuracy {a['accuracy']:.2f}% ({a['note']})")
    if not any(acc.get(k) for k in ("heldout", "target", "queried")):
        console.print("accuracy: nothing labeled to measure it on yet")


def _cmd_status(args: argparse.Namespace) -> int:
    st = _project(args).status()
    if args.json:
        sys.stdout.write(json.dumps(st, indent=1) + "\n")
    else:
        _print_status(st)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    files = _project(args).export(args.out)
    for k, v in files.items():
        console.print(f"{k:<20} {v}")
    return 0


def add_store_commands(sub: Any) -> None:
    """Add ``init``, ``query``, ``label import``, ``train``, ``status`` and ``export`` to the
    ``eada`` subparsers ``sub``."""

    def store_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--store",
            default=DEFAULT_STORE,
            help=f"project folder (default $EADA_STORE or {DEFAULT_STORE})",
        )

    p = sub.add_parser("init", help="create a project store: register source and target data")
    store_arg(p)
    p.add_argument("--preset", default=None, help="a preset (see `eada presets`)")
    p.add_argument("--method", default=None, help="method variant of the preset")
    p.add_argument("--config", default=None, help="a YAML experiment config")
    p.add_argument("--source-dir", default=None, help="source image folder (CLASS/*.jpg)")
    p.add_argument("--target-dir", default=None, help="target image folder (CLASS/*.jpg)")
    p.add_argument("--image-size", type=int, default=32, help="image side for folders")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable)",
    )
    p.add_argument(
        "--root",
        action="append",
        default=[],
        help="another data root that import paths may point into (repeatable)",
    )
    from eada.threads import add_threads_argument

    add_threads_argument(  # eada.cli.main applies it
        p,
        "threads of the first feature extraction (ONNX Runtime or torch) and of any training "
        "init does (default: OMP_NUM_THREADS if set, else all cores)",
    )
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("query", help="score the unlabeled pool, select a batch, export it")
    store_arg(p)
    p.add_argument("--budget", type=int, default=None, help="override the planned batch size")
    add_threads_argument(p)
    p.set_defaults(func=_cmd_query)

    lab = sub.add_parser("label", help="label files")
    lsub = lab.add_subparsers(dest="label_command", required=True)
    p = lsub.add_parser("import", help="import labels (CSV, JSON, Label Studio JSON export)")
    p.add_argument("file")
    store_arg(p)
    p.add_argument(
        "--annotator",
        default=os.environ.get("USER", "unknown"),
        help="who labeled (when the file does not say)",
    )
    p.add_argument(
        "--allow-unqueried", action="store_true", help="accept labels for samples no round queried"
    )
    p.set_defaults(func=_cmd_label_import)

    p = sub.add_parser("train", help="train with every label so far (or --simulate a run)")
    store_arg(p)
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="train N more epochs (default: up to the next planned round)",
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="run the whole schedule with a simulated oracle (resumable)",
    )
    add_threads_argument(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("status", help="rounds, budget spent, accuracy history")
    store_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("export", help="export labels (CSV) and the final model")
    store_arg(p)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd_export)
