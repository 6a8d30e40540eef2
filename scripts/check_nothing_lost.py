"""Check that the text of README.md and BENCHMARKS.md at a git revision survives in the tree.

Issue 31 cut the README to a front page and BENCHMARKS.md to a results page, and moved the rest
to pages under ``docs/``. This script takes both files as they were at REV and looks for each of
their lines in the current README.md, BENCHMARKS.md, CONTRIBUTING.md and ``docs/**/*.md``:

* a line is **kept** if it is there, compared after normalising what a move changes: leading
  ``#`` of headings, whitespace, link targets (relative paths change with the page), and
  ``benchmarks/X.py`` -> ``benchmarks/investigations/X.py``;
* otherwise its **numbers survive** if every number in it (``98.7``, ``16,527``, ``-3.3``,
  ``1.96x`` ...) appears somewhere in the new text;
* otherwise it is **lost**, and printed.

Words changed on purpose by the move (a pointer to "this README, below") are listed in
:data:`MOVED_WORDS`.

Every table row must be kept. Usage::

    python scripts/check_nothing_lost.py cd8c4c5~3   # the revision before the README rewrite
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")
#: words changed on purpose when a text moved (old -> new), applied to the old lines
MOVED_WORDS = {"| this README, below |": "| [scaling out](scaling.md) |"}


def normalise(line: str) -> str:
    line = line.strip().lstrip("#").strip()
    line = re.sub(r"\]\([^)]*\)", "]()", line)
    line = re.sub(r"benchmarks/investigations/", "benchmarks/", line)
    return re.sub(r"\s+", " ", line)


def main(argv: list[str]) -> int:
    rev = argv[0] if argv else "HEAD"
    pages = [REPO / n for n in ("README.md", "BENCHMARKS.md", "CONTRIBUTING.md")]
    pages += sorted((REPO / "docs").rglob("*.md"))
    new_text = "\n".join(p.read_text() for p in pages)
    new_lines = {normalise(line) for line in new_text.splitlines()}
    new_numbers = set(NUMBER.findall(new_text))
    lost_any = False
    for name in ("README.md", "BENCHMARKS.md"):
        old = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout.splitlines()
        kept = numbers = 0
        rows = rows_kept = 0
        lost: list[str] = []
        for line in old:
            for before, after in MOVED_WORDS.items():
                line = line.replace(before, after)
            norm = normalise(line)
            if not norm or set(norm) <= set("|-: "):
                continue
            is_row = line.lstrip().startswith("|")
            rows += is_row
            if norm in new_lines:
                kept += 1
                rows_kept += is_row
            elif not is_row and set(NUMBER.findall(line)) <= new_numbers:
                numbers += 1
            else:
                lost.append(line)
        print(
            f"{name} at {rev}: {kept + numbers + len(lost)} lines; {kept} kept word for word, "
            f"{numbers} not but every number in them is there, {len(lost)} lost; "
            f"table rows: {rows_kept} of {rows} kept"
        )
        for line in lost:
            missing = sorted(set(NUMBER.findall(line)) - new_numbers)
            note = f"   (numbers not found: {missing})" if missing else ""
            print(f"  LOST: {line.strip()[:140]}{note}")
        lost_any |= bool(lost)
    return 1 if lost_any else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
