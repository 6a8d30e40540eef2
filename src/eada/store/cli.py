"""The annotation-round subcommands of ``eada`` (a project store in a folder):

eada init --store DIR (--preset NAME [--method M] | --config FILE.yaml
                       | --source-dir D --target-dir D) [--seed S] [--set k=v ...]
                       [--allow-root DIR ...] [--threads N]
eada query --store DIR [--budget N] [--threads N]
                                               score the pool, select, export CSV/JSON/Label Studio
eada label import FILE --store DIR [--annotator NAME] [--allow-unqueried] [--force]
eada train --store DIR [--epochs N | --partial] [--simulate]
eada labelstudio connect --store DIR --url URL [--project ID]   a live Label Studio project
eada labelstudio pull --store DIR [--force] | push --store DIR
eada serve --store DIR [--host H] [--port P]  Label Studio ML backend (health/setup/predict/webhook)
eada status --store DIR [--json]
eada export --store DIR --out DIR [--force]    labels (CSV) and the final model (weights + JSON)
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
    roots = [Path(r) for r in args.allow_root]
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
    if out.get("labelstudio_error"):
        _log(
            f"warning: the round is recorded and exported, but Label Studio did not take it: "
            f"{out['labelstudio_error']}; retry with `eada labelstudio push --store {args.store}`"
        )
    if out["reexported"]:
        console.print(
            f"round {out['round']}: {out['pending']} of its {out['selected']} samples still "
            f"await an answer ({out['labeled']} labeled, {out['skipped']} skipped); "
            "exported again"
        )
    else:
        console.print(f"round {out['round']}: {out['selected']} samples selected")
    for k, v in out["files"].items():
        console.print(f"  {k:<20} {v}")
    if "json" in out["files"]:
        doc = json.loads(Path(out["files"]["json"]).read_text())
        root = doc.get("label_studio_document_root")
        if root is not None:  # None: feature rows (no files served), or no safe folder
            console.print(f"  Label Studio: LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={root}")
        elif doc.get("label_studio_note"):
            console.print(f"  Label Studio: {doc['label_studio_note']}")
    return 0


def _cmd_label_import(args: argparse.Namespace) -> int:
    proj = _project(args)
    out = proj.import_labels(args.file, args.annotator, args.allow_unqueried, args.force)
    console.print(f"imported {args.file} ({out['format']}): {import_summary(out)}")
    return 0


def import_summary(out: dict[str, Any]) -> str:
    """``3 new, 1 corrections, 1 skipped, 0 unchanged; 2 queried samples await an answer``."""
    parts = [f"{out['new']} new", f"{out['corrections']} corrections", f"{out['skipped']} skipped"]
    if out.get("unskipped"):
        parts.append(f"{out['unskipped']} skips undone by a label")
    parts.append(f"{out['unchanged']} unchanged")
    text = ", ".join(parts)
    if out.get("replaced_other_annotators"):
        n_forced = out["replaced_other_annotators"]
        text += f" ({n_forced} replaced another annotator's label, forced)"
    n = out["pending"]
    verb = "sample awaits" if n == 1 else "samples await"
    return text + f"; {n} queried {verb} an answer"


def _cmd_train(args: argparse.Namespace) -> int:
    proj = _project(args)
    if args.simulate:
        if args.epochs is not None:
            raise ValueError("--simulate follows the config's schedule; drop --epochs")
        st = proj.run_simulated(progress=_log)
        _print_status(st)
        return 0
    if args.partial and args.epochs is not None:
        raise ValueError("--partial trains up to the next planned round; drop --epochs")
    out = proj.train(epochs=args.epochs, progress=_log, partial=args.partial)
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


def _cmd_ls_connect(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    out = labelstudio.connect(_project(args), args.url, args.project, args.title)
    console.print(
        f"connected {args.store} to Label Studio project {out['project']} at {out['url']} "
        f"(local-files storage {out['storage']}, document root {out['document_root']}); "
        f"rounds pushed: {out['pushed'] or 'none yet'}"
    )
    console.print(f"  open {out['url']}/projects/{out['project']}/data")
    return 0


def _cmd_ls_push(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    pushed = labelstudio.push_pending(_project(args))
    console.print(f"rounds pushed to Label Studio: {pushed or 'none (all were pushed)'}")
    return 0


def _cmd_ls_pull(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    out = labelstudio.pull(_project(args), force=args.force)
    console.print(f"pulled {out['file']}: {import_summary(out)}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from eada.store.serve import make_server

    server = make_server(_project(args), args.host, args.port)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    _log(
        f"eada serve: Label Studio ML backend for {args.store} at http://{host}:{port} "
        "(/health, /setup, /predict, /webhook); Ctrl-C stops it"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _print_status(st: dict[str, Any]) -> None:
    console.print(
        f"mode {st['mode']}, epoch {st['epoch']}, labeled {st['n_labeled']}/{st['n_target']} "
        f"({st['budget_spent_percent']:.2f}% of the target), skipped {st['n_skipped']}, "
        f"corrections {st['corrections']}, next: {st['next']}"
    )
    cols = ("round", "epoch", "strategy", "selected", "labeled", "skipped", "pending")
    t = Table(title="rounds")
    for col in cols:
        t.add_column(col)
    for r in st["rounds"]:
        t.add_row(*[str(r[c]) for c in cols])
    console.print(t)
    if st["skipped_by_reason"]:
        console.print(
            "skipped by reason: "
            + "; ".join(f"{why}: {n}" for why, n in st["skipped_by_reason"].items())
        )
    if st["annotators"]:
        console.print(
            "answers in force by annotator: "
            + "; ".join(
                f"{who}: {c['labeled']} labeled, {c['skipped']} skipped"
                for who, c in st["annotators"].items()
            )
        )
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
    files = _project(args).export(args.out, force=args.force)
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
        "--allow-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder outside the config's data folders that the project's files (image "
        "lists, symlinks) and label imports may point into; recorded in the store "
        "(repeatable; the store never adds one by itself)",
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
    p.add_argument(
        "--force",
        action="store_true",
        help="let a label replace ANOTHER annotator's label (refused and named otherwise)",
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
    p.add_argument(
        "--partial",
        action="store_true",
        help="the last round still awaits answers: train with the labels it has so far",
    )

    add_threads_argument(p)
    p.set_defaults(func=_cmd_train)

    ls = sub.add_parser("labelstudio", help="a live Label Studio project for the rounds")
    lssub = ls.add_subparsers(dest="labelstudio_command", required=True)
    p = lssub.add_parser(
        "connect",
        help="create (or use) a Label Studio project with the classes and the image storage, "
        "and push the rounds (token: $LABEL_STUDIO_API_KEY)",
    )
    store_arg(p)
    p.add_argument("--url", required=True, help="the Label Studio server, http://HOST:PORT")
    p.add_argument("--project", type=int, default=None, help="use this existing project id")
    p.add_argument("--title", default=None, help="title of the project to create")
    p.set_defaults(func=_cmd_ls_connect)
    p = lssub.add_parser("push", help="send the rounds Label Studio has not received yet")
    store_arg(p)
    p.set_defaults(func=_cmd_ls_push)
    p = lssub.add_parser("pull", help="import the submitted annotations and skips")
    store_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="let an annotation replace ANOTHER annotator's label (refused and named otherwise)",
    )
    p.set_defaults(func=_cmd_ls_pull)

    p = sub.add_parser(
        "serve", help="Label Studio's ML-backend protocol for interactive pre-annotation"
    )
    store_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9090, help="port (0: a free one)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("status", help="rounds, budget spent, accuracy history")
    store_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("export", help="export labels (CSV) and the final model")
    store_arg(p)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the export already in --out (a folder holding other files is never replaced)",
    )
    p.set_defaults(func=_cmd_export)
