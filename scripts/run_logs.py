"""The raw run logs committed under ``benchmarks/results/``: compressed, archived, restored.

The raw logs (``runs.jsonl``, one JSON record a run, with every epoch's measurements) made up
184 MB of the 194 MB of tracked files. They are kept light in two ways, neither of which loses
a byte or rewrites history:

* **compressed**: ``runs.jsonl`` -> ``runs.jsonl.xz`` (xz, preset 9e, CRC64; deterministic, so
  the same log always gives the same bytes). ``eada.runs.read_jsonl`` reads the compressed form
  transparently (and a plain ``runs.jsonl`` appended beside it), and so do ``eada report``, the
  leaderboard scripts and the tests. xz rather than gzip: the standard library reads both, and
  on these logs (floating-point measurements) xz is a third smaller (33.7 MB against 48 MB),
  which is what keeps the tree under 40 MiB.
* **archived**: the logs of a few investigations whose tables are committed as summaries are
  taken out of the tree and live in git history only. ``archived_logs.json`` names each one's
  commit, blob, SHA-256 and record count, and ``restore`` writes them back byte for byte.

Usage::

    python scripts/run_logs.py compress benchmarks/results          # every plain runs.jsonl
    python scripts/run_logs.py archive benchmarks/results/two_class_20seeds
    python scripts/run_logs.py restore two_class_20seeds              # or: restore --all
    python scripts/run_logs.py check 8c9ef3c                           # nothing lost since REV

``check REV`` takes every ``runs.jsonl`` tracked at REV and finds each one now, as a plain log
with the same bytes, as an ``.xz`` that decompresses to the same bytes, or as an archived entry
whose blob is in the repository with the same SHA-256; it prints the counts and exits 1 on any
loss. A log appended to since REV counts as kept when its old bytes are a prefix of the new.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MANIFEST = RESULTS / "archived_logs.json"
LOG = "runs.jsonl"
PRESET = 9 | lzma.PRESET_EXTREME


def git(*args: str, text: bool = True) -> Any:
    """Run git in the repository and return its standard output."""
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=text
    ).stdout


def pack(data: bytes) -> bytes:
    """``data`` as a deterministic xz stream (same bytes in, same bytes out)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=PRESET)


def records(data: bytes) -> int:
    """How many JSON records a log's bytes hold (each line parsed)."""
    return sum(1 for line in data.decode().splitlines() if line.strip() and json.loads(line))


def rel(path: Path) -> str:
    return path.resolve().relative_to(REPO).as_posix()


def compress(roots: list[Path]) -> int:
    """Replace every plain ``runs.jsonl`` under ``roots`` by its ``.xz``, verified first."""
    before = after = n = 0
    for root in roots:
        for log in sorted(root.rglob(LOG)):
            data = log.read_bytes()
            packed = log.with_name(LOG + ".xz")
            if packed.exists():
                raise SystemExit(f"{rel(packed)} exists already: append to it by hand, not here")
            blob = pack(data)
            if lzma.decompress(blob) != data:  # never delete a log whose copy does not read back
                raise SystemExit(f"{rel(log)}: the compressed copy does not read back")
            packed.write_bytes(blob)
            log.unlink()
            before, after, n = before + len(data), after + len(blob), n + 1
    print(f"compressed {n} logs: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


def archive(folders: list[Path]) -> int:
    """Take the committed logs under ``folders`` out of the tree, listed in the manifest."""
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"logs": []}
    head = git("rev-parse", "HEAD").strip()
    known = {e["path"] for e in manifest["logs"]}
    n = 0
    for folder in folders:
        for log in sorted(set(folder.rglob(LOG)) | set(folder.rglob(LOG + ".xz"))):
            path = rel(log)
            if path in known:
                continue
            tracked = git("ls-files", "--error-unmatch", path).strip()
            if git("status", "--porcelain", "--", tracked).strip():
                raise SystemExit(f"{path} differs from HEAD: commit it before archiving")
            data = log.read_bytes()
            manifest["logs"].append(
                {
                    "path": path,
                    "commit": head,
                    "blob": git("rev-parse", f"HEAD:{path}").strip(),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data),
                    "records": records(lzma.decompress(data) if path.endswith(".xz") else data),
                }
            )
            log.unlink()
            n += 1
    manifest["logs"].sort(key=lambda e: e["path"])
    manifest["note"] = (
        "raw run logs kept in git history only (scripts/run_logs.py restore writes them back)"
    )
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"archived {n} logs ({rel(MANIFEST)} lists {len(manifest['logs'])})")
    return 0


def restore(names: list[str], everything: bool) -> int:
    """Write archived logs back from history (by path prefix, or ``--all``), verified."""
    entries = json.loads(MANIFEST.read_text())["logs"]
    chosen = [
        e
        for e in entries
        if everything
        or any(e["path"].startswith(f"benchmarks/results/{x}") for x in names)
        or any(e["path"].startswith(x) for x in names)
    ]
    if not chosen:
        raise SystemExit(f"no archived log matches {names}: see {rel(MANIFEST)}")
    for e in chosen:
        data = git("cat-file", "blob", e["blob"], text=False)
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise SystemExit(f"{e['path']}: the blob in history does not match its SHA-256")
        out = REPO / e["path"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    print(f"restored {len(chosen)} logs")
    return 0


def check(rev: str) -> int:
    """Every ``runs.jsonl`` tracked at ``rev`` is still here (plain, compressed or archived)."""
    old = [p for p in git("ls-tree", "-r", "--name-only", rev, "--", "benchmarks").split("\n")]
    old = [p for p in old if p.endswith("/" + LOG)]
    archived = (
        {e["path"]: e for e in json.loads(MANIFEST.read_text())["logs"]}
        if MANIFEST.exists()
        else {}
    )
    counts = {"plain": 0, "compressed": 0, "archived": 0}
    n_records = 0
    lost: list[str] = []
    for path in old:
        data = git("show", f"{rev}:{path}", text=False)
        n_records += records(data)
        plain, packed = REPO / path, REPO / (path + ".xz")
        if plain.is_file() and plain.read_bytes().startswith(data):
            counts["plain"] += 1
        elif packed.is_file() and lzma.decompress(packed.read_bytes()).startswith(data):
            counts["compressed"] += 1
        elif path in archived or path + ".xz" in archived:
            e = archived.get(path) or archived[path + ".xz"]
            blob = git("cat-file", "blob", e["blob"], text=False)
            if e["path"].endswith(".xz"):
                blob = lzma.decompress(blob)
            if blob.startswith(data):
                counts["archived"] += 1
            else:
                lost.append(path)
        else:
            lost.append(path)
    print(
        f"{len(old)} logs with {n_records} records at {rev}: {counts['plain']} plain, "
        f"{counts['compressed']} compressed, {counts['archived']} archived; {len(lost)} lost"
    )
    for path in lost:
        print(f"  lost: {path}")
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compress", help="plain runs.jsonl -> runs.jsonl.xz")
    c.add_argument("roots", nargs="*", type=Path, default=[RESULTS])
    a = sub.add_parser("archive", help="logs under FOLDERs -> git history + manifest")
    a.add_argument("folders", nargs="+", type=Path)
    r = sub.add_parser("restore", help="archived logs back into the tree")
    r.add_argument("names", nargs="*", help="results folders (e.g. two_class_20seeds) or paths")
    r.add_argument("--all", action="store_true")
    k = sub.add_parser("check", help="every log tracked at REV is still here")
    k.add_argument("rev")
    args = p.parse_args(argv)
    if args.cmd == "compress":
        return compress(args.roots)
    if args.cmd == "archive":
        return archive(args.folders)
    if args.cmd == "restore":
        return restore(args.names, args.all)
    return check(args.rev)


if __name__ == "__main__":
    sys.exit(main())
