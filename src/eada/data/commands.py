"""``eada data index`` / ``eada data check`` and the extra tables of ``eada run``'s summary.

eada data index FOLDER --out LIST.txt [--no-checksums]
    write a ``path label`` list file with a ``# class`` header (+ ``LIST.txt.sha256``)
eada data check SOURCE TARGET [--root DIR] [--no-decode]
    validate a source/target pair (folders or list files); exit status 2 on any error
    (a data problem is the user's to fix, like every other user error)
eada data features CONFIG --out OUT.npz|OUT.parquet [--set KEY=VALUE] [--device cpu]
    a backbone's features of an image config, one file a domain, + OUT.yaml to train on them
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from eada.runs import format_warning

PER_CLASS_TABLE_MAX = 20  # print a per-class table when a task has at most this many classes


def _cmd_index(args: argparse.Namespace) -> int:
    from eada.data.images import index_folder

    images = index_folder(args.folder, args.out, checksums=not args.no_checksums)
    print(
        f"{args.out}: {len(images)} images, {len(images.classes)} classes"
        + ("" if args.no_checksums else f"; checksums in {args.out}.sha256")
    )
    base = Path(args.out).resolve().parent
    if any(base not in Path(p).resolve().parents for p in images.paths[:1]):
        print(
            f"note: the images lie outside {base}, the folder list paths are confined to: "
            "read this list with --allow-outside-root (data.allow_outside_root: true), or "
            "write it inside the data folder"
        )
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from eada.data.images import check_pair, load_image_list

    src = load_image_list(args.source, args.root, allow_outside=args.allow_outside_root)
    tgt = load_image_list(args.target, args.root, allow_outside=args.allow_outside_root)
    report = check_pair(src, tgt, decode=not args.no_decode)
    # plain print: the report holds paths and brackets that rich would wrap or read as markup
    print(report.format())
    return 0 if report.ok else 2


def _cmd_features(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from eada.config import load_config
    from eada.data.export import export_features

    cfg = load_config(args.config, args.set)
    files = export_features(cfg, Path(args.out), args.device)
    for role, path in files.items():  # plain lines: paths must not wrap in a log
        print(f"{role}: {path}")
    if "store" in (yaml.safe_load(files["config"].read_text()) or {}):  # unlabeled target
        print(f"next: eada init --store PROJECT --config {files['config']}")
    else:
        print(f"train on them: eada run {files['config']}")
    return 0


def add_data_commands(sub: Any) -> None:
    """Register ``eada data index``, ``check`` and ``features`` on the ``eada`` subparsers."""
    d = sub.add_parser(
        "data", help="image data: index a folder, check a pair, export backbone features"
    )
    dsub = d.add_subparsers(dest="data_command", required=True)
    i = dsub.add_parser("index", help="write a list file (+ class map, checksums) of a folder")
    i.add_argument("folder", help="a domain folder DOMAIN/[images/]CLASS/*.jpg")
    i.add_argument("--out", required=True, help="the list file to write")
    i.add_argument("--no-checksums", action="store_true", help="skip the .sha256 file")
    i.set_defaults(func=_cmd_index)
    c = dsub.add_parser("check", help="validate a source/target pair; all problems at once")
    c.add_argument("source", help="source domain folder or list file")
    c.add_argument("target", help="target domain folder or list file")
    c.add_argument("--root", default=None, help="where relative list paths start")
    c.add_argument("--no-decode", action="store_true", help="check existence only (faster)")
    c.add_argument(
        "--allow-outside-root",
        action="store_true",
        help="accept list paths that resolve outside --root (default: an error)",
    )
    c.set_defaults(func=_cmd_check)
    f = dsub.add_parser(
        "features",
        help="write a backbone's features of an image config (.npz/.parquet + a config)",
    )
    f.add_argument("config", help="an image config (data.kind: images), any backbone it takes")
    f.add_argument(
        "--out",
        required=True,
        help="OUT.npz or OUT.parquet: writes OUT_source/_target[/_heldout] files and OUT.yaml",
    )
    f.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    f.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    from eada.threads import add_threads_argument

    add_threads_argument(  # eada.cli.main applies it
        f, "torch threads of the extraction (default: OMP_NUM_THREADS if set, else all cores)"
    )
    f.set_defaults(func=_cmd_features)
    from eada.data.unlabel import add_unlabel_commands

    add_unlabel_commands(dsub)  # eada data unlabel / fill-labels


def print_summary_extras(console: Console, summary: dict[str, Any]) -> None:
    """Protocol, last/best epoch, training warnings and (few classes, e.g. VisDA's 12) the
    per-class table."""
    fin = summary.get("final", {})
    if summary.get("protocol"):
        console.print(f"protocol: {summary['protocol']}; best epochs {summary.get('best_epochs')}")
    for which in ("last_epoch", "best_epoch"):
        parts = []
        for key in ("accuracy", "mean_class_accuracy"):
            v = fin.get(f"{which}/target/{key}")
            if v and v.get("mean") is not None:
                parts.append(f"{key} {v['mean']:.2f} ± {v['std']:.2f}")
        if parts:
            console.print(f"{which.replace('_', ' ')} target: " + ", ".join(parts))
    for w in summary.get("warnings", []):
        console.print(format_warning(w), highlight=False, markup=False)
    per_class = fin.get("last_epoch/target/per_class_accuracy")
    classes = summary.get("classes") or []
    if per_class and len(per_class) <= PER_CLASS_TABLE_MAX:
        console.print("per-class target accuracy %, last epoch (mean ± std)", soft_wrap=True)
        table = Table()
        for name in ("class", "accuracy"):
            table.add_column(name, justify="left" if name == "class" else "right")
        for c, s in enumerate(per_class):
            name = classes[c] if c < len(classes) else str(c)
            val = "-" if s.get("mean") is None else f"{s['mean']:.2f} ± {s['std']:.2f}"
            table.add_row(name, val)
        console.print(table)
