"""The tutorial's round as a picture: the photos a round asks for, as thumbnails, each with the
model's guess (and its probability) and, where a truth file is given, the true class.

Usage (after the tutorial's `eada query`, docs/tutorial-own-images.md)::

    python benchmarks/investigations/tutorial_picks_figure.py runs/mine/exports/round-001.csv \\
        --truth runs/truth.csv --out docs/figures/tutorial-round1-picks.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from PIL import Image, ImageDraw


def contact_sheet(
    rows: list[dict[str, str]], truth: dict[str, str], size: int = 112, per_row: int = 4
) -> Image.Image:
    """One thumbnail a row of the round's export CSV, captioned with its rank, the model's
    guess and probability (first line) and the true class where known (second line: green when
    the guess is right, red when not)."""
    caption = 34
    n = len(rows)
    cols = min(per_row, n)
    lines = (n + cols - 1) // cols
    sheet = Image.new("RGB", (cols * (size + 8) + 8, lines * (size + caption + 8) + 8), "white")
    draw = ImageDraw.Draw(sheet)
    for i, r in enumerate(rows):
        x = 8 + (i % cols) * (size + 8)
        y = 8 + (i // cols) * (size + caption + 8)
        with Image.open(r["path"]) as im:
            thumb = im.convert("RGB")
            thumb.thumbnail((size, size))
        sheet.paste(thumb, (x + (size - thumb.width) // 2, y + (size - thumb.height) // 2))
        guess = f"#{r['rank']} {r['predicted']} {float(r['score']):.2f}"
        true = truth.get(Path(r["path"]).name)
        draw.text((x, y + size + 3), guess, fill="black")
        if true is not None:
            colour = "darkgreen" if true == r["predicted"] else "firebrick"
            draw.text((x, y + size + 17), f"true: {true}", fill=colour)
    return sheet


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", help="a round's export CSV (eada query)")
    p.add_argument("--truth", default=None, help="a CSV of file and label (eada data unlabel)")
    p.add_argument("--out", required=True, help="the PNG to write")
    args = p.parse_args(argv)
    with open(args.export, newline="") as fh:
        rows = list(csv.DictReader(fh))
    truth: dict[str, str] = {}
    if args.truth:
        with open(args.truth, newline="") as fh:
            for t in csv.DictReader(fh):
                name = t.get("file") or t.get("path") or t.get("id") or ""
                truth[Path(name).name] = t["label"]
    sheet = contact_sheet(rows, truth)
    sheet = sheet.quantize(colors=128)  # a small PNG: a palette of 128 colours
    sheet.save(args.out, optimize=True)
    print(f"{len(rows)} picks -> {args.out} ({Path(args.out).stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
