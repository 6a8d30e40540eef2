"""``eada data unlabel``, ``subset`` and ``fill-labels``: a labeled image folder turned into the
unlabeled target folder a user has, with its labels kept aside to play the annotator and to
score the model.

``unlabel`` copies ``DOMAIN/[images/]CLASS/*.jpg`` into ONE flat folder under neutral names
(``img_0000.jpg``, ...: nothing in a name tells the class) and writes the truth CSV
(``file,label``). ``subset`` copies some classes of a labeled folder (a quick source).
``fill-labels`` fills the empty ``label`` column of a round's CSV
(``eada query``'s export) from that truth CSV, as an annotator would, for tours and tests.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
from pathlib import Path
from typing import Any

from eada.data.images import IMAGE_EXTENSIONS


class UnlabelError(ValueError):
    """A folder or CSV ``eada data unlabel`` / ``fill-labels`` cannot use (named)."""


def _class_folders(folder: Path) -> dict[str, list[Path]]:
    root = folder / "images" if (folder / "images").is_dir() else folder
    out: dict[str, list[Path]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(
            f
            for f in d.iterdir()
            if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS and not f.name.startswith(".")
        )
        if files:
            out[d.name] = files
    return out


def unlabel_folder(
    folder: str | Path,
    out: str | Path,
    truth: str | Path,
    classes: list[str] | None = None,
    per_class: int | None = None,
) -> dict[str, Any]:
    """Copy the images of ``folder`` (``[images/]CLASS/*``), the first ``per_class`` of each
    of ``classes`` (default: all), into the flat folder ``out`` as ``img_NNNN.<ext>`` and
    write ``truth`` (``file,label``). Returns ``{"images", "classes", "out", "truth"}``.

    Raises:
        UnlabelError: no class folders, an unknown class, a non-empty ``out``.
        FileNotFoundError: ``folder`` does not exist.
    """
    folder, out, truth = Path(folder), Path(out), Path(truth)
    found = _chosen(folder, classes, per_class)
    _check_new(out)
    rows = []
    for c, files in found.items():
        for f in files[:per_class]:
            rows.append((f, c))
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["file", "label"])
    for i, (f, c) in enumerate(rows):
        name = f"img_{i:04d}{f.suffix.lower()}"
        shutil.copyfile(f, out / name)
        w.writerow([name, c])
    truth.parent.mkdir(parents=True, exist_ok=True)
    truth.write_text(buf.getvalue(), encoding="utf-8")
    return {"images": len(rows), "classes": len(found), "out": str(out), "truth": str(truth)}


def subset_folder(
    folder: str | Path, out: str | Path, classes: list[str] | None, per_class: int | None
) -> dict[str, Any]:
    """Copy the first ``per_class`` images of each of ``classes`` (default: all) of
    ``folder`` (``[images/]CLASS/*``) into ``out/CLASS/``, names kept: a smaller labeled
    domain. Returns ``{"images", "classes", "out"}``.

    Raises:
        UnlabelError: as :func:`unlabel_folder`.
        FileNotFoundError: ``folder`` does not exist.
    """
    found = _chosen(Path(folder), classes, per_class)
    out = Path(out)
    _check_new(out)
    n = 0
    for c, files in found.items():
        (out / c).mkdir(parents=True, exist_ok=True)
        for f in files[:per_class]:
            shutil.copyfile(f, out / c / f.name)
            n += 1
    return {"images": n, "classes": len(found), "out": str(out)}


def _chosen(
    folder: Path, classes: list[str] | None, per_class: int | None
) -> dict[str, list[Path]]:
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder}")
    found = _class_folders(folder)
    if not found:
        raise UnlabelError(f"{folder}: no class folders with images (CLASS/*.jpg)")
    if classes:
        unknown = [c for c in classes if c not in found]
        if unknown:
            raise UnlabelError(
                f"{folder}: no class folder {', '.join(map(repr, unknown))} (found: "
                f"{', '.join(list(found)[:10])}{' ...' if len(found) > 10 else ''})"
            )
        found = {c: found[c] for c in classes}
    if per_class is not None and per_class < 1:
        raise UnlabelError(f"--per-class must be >= 1, got {per_class}")
    return found


def _check_new(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UnlabelError(f"{out} exists and is not an empty folder; name a new folder")


def fill_labels(round_csv: str | Path, truth: str | Path, out: str | Path) -> dict[str, int]:
    """Write ``out``: the rows of ``round_csv`` (an ``eada query`` export) with the ``label``
    column filled from ``truth`` (``file,label``, matched by the file name of each row's
    ``path``). Returns ``{"rows", "filled"}``.

    Raises:
        UnlabelError: a CSV without the needed columns, or a row whose file the truth lacks.
        FileNotFoundError: a missing CSV.
    """
    round_csv, truth, out = Path(round_csv), Path(truth), Path(out)
    for f in (round_csv, truth):
        if not f.is_file():
            raise FileNotFoundError(f"CSV not found: {f}")
    with open(truth, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not {"file", "label"} <= set(reader.fieldnames or []):
            raise UnlabelError(f"{truth}: needs the columns file and label")
        known = {r["file"]: r["label"] for r in reader}
    with open(round_csv, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        cols = list(reader.fieldnames or [])
        rows = list(reader)
    if not {"path", "label"} <= set(cols):
        raise UnlabelError(f"{round_csv}: needs the columns path and label (an eada query CSV)")
    missing = [r["path"] for r in rows if Path(r["path"]).name not in known]
    if missing:
        raise UnlabelError(
            f"{truth}: no label for {len(missing)} row(s) of {round_csv} (first: {missing[0]})"
        )
    for r in rows:
        r["label"] = known[Path(r["path"]).name]
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(buf.getvalue(), encoding="utf-8")
    return {"rows": len(rows), "filled": len(rows)}


def _cmd_unlabel(args: argparse.Namespace) -> int:
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    res = unlabel_folder(args.folder, args.out, args.truth, classes, args.per_class)
    print(
        f"{res['images']} images of {res['classes']} classes copied, unlabeled, into "
        f"{res['out']}; their labels kept aside in {res['truth']}"
    )
    return 0


def _cmd_subset(args: argparse.Namespace) -> int:
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    res = subset_folder(args.folder, args.out, classes, args.per_class)
    print(f"{res['images']} images of {res['classes']} classes copied into {res['out']}")
    return 0


def _cmd_fill(args: argparse.Namespace) -> int:
    res = fill_labels(args.round_csv, args.truth, args.out)
    print(f"{res['filled']} labels filled from {args.truth} -> {args.out}")
    return 0


def add_unlabel_commands(dsub: Any) -> None:
    """Add ``unlabel`` and ``fill-labels`` to the ``eada data`` subparsers ``dsub``."""
    u = dsub.add_parser(
        "unlabel",
        help="copy a labeled folder (CLASS/*.jpg) flat under neutral names; labels kept aside",
    )
    u.add_argument("folder", help="a labeled domain folder DOMAIN/[images/]CLASS/*.jpg")
    u.add_argument("out", help="the flat folder to create (new or empty)")
    u.add_argument("--truth", required=True, help="the CSV (file,label) of the labels kept aside")
    u.add_argument("--classes", default=None, help="comma-separated class folders (default: all)")
    u.add_argument("--per-class", type=int, default=None, help="at most N images a class")
    u.set_defaults(func=_cmd_unlabel)
    s = dsub.add_parser(
        "subset", help="copy some classes (and at most N images a class) of a labeled folder"
    )
    s.add_argument("folder", help="a labeled domain folder DOMAIN/[images/]CLASS/*.jpg")
    s.add_argument("out", help="the folder to create (new or empty): OUT/CLASS/*.jpg")
    s.add_argument("--classes", default=None, help="comma-separated class folders (default: all)")
    s.add_argument("--per-class", type=int, default=None, help="at most N images a class")
    s.set_defaults(func=_cmd_subset)
    f = dsub.add_parser(
        "fill-labels",
        help="fill a round CSV's label column from a truth CSV (an annotator's stand-in)",
    )
    f.add_argument("round_csv", help="a round's CSV (eada query)")
    f.add_argument("--truth", required=True, help="file,label CSV (eada data unlabel --truth)")
    f.add_argument("--out", required=True, help="the filled CSV to write")
    f.set_defaults(func=_cmd_fill)


__all__ = ["UnlabelError", "add_unlabel_commands", "fill_labels", "subset_folder", "unlabel_folder"]
