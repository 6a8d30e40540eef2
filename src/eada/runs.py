"""Run records: every run writes its resolved config, seed, versions and git commit beside its
results, and multi-run jobs append one JSON line per run (DomainBed style)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np


def git_commit(path: Path | None = None) -> dict[str, Any]:
    """The commit (and whether the tree is dirty) of the git repository holding ``path``.

    Looks at the current directory first, then at the package's own source tree; ``None``
    values when neither is inside a git repository.
    """

    def git(where: Path, *args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    for where in (path or Path.cwd(), Path(__file__).resolve().parent):
        try:
            commit = git(where, "rev-parse", "HEAD")
            dirty = git(where, "status", "--porcelain", "--untracked-files=no")
            return {"commit": commit, "dirty": bool(dirty)}
        except (OSError, subprocess.SubprocessError):
            continue
    return {"commit": None, "dirty": None}


def environment_info() -> dict[str, Any]:
    """Versions and machine facts to store beside results."""
    import torch

    from eada.threads import thread_record

    def ver(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "eada": ver("eada"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads": thread_record(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git": git_commit(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else None,
    }


def _clean(obj: Any) -> Any:
    """Make numpy scalars/arrays and non-finite floats JSON-safe."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def tmp_name(path: Path) -> Path:
    """The temporary file a write of ``path`` goes through: ``.NAME.PID.tmp`` beside it (one a
    process, so concurrent writers of ``path`` never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically (:func:`tmp_name` + rename): a crash never
    leaves a half-written file behind, and concurrent writers never a mixed one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    tmp.write_text(json.dumps(_clean(obj), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one JSON line (fsynced) to ``path``; safe for concurrent writers.

    The line goes out in ONE ``write`` on an ``O_APPEND`` descriptor under an exclusive
    ``flock``, so processes appending to the same file (``eada bench --jobs N``, two
    invocations on one ``--out``) never interleave. A torn last line left by a killed writer is
    cut off first, so it cannot end up in the middle of the file.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(_clean(obj)) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            tail = path.read_bytes()
            os.ftruncate(fd, tail.rfind(b"\n") + 1)  # drop the torn line (0: no full line)
        view = memoryview(data)
        while view:  # one write in practice; a short write (full disk) is finished or raises
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSON-lines file; a torn last line (a killed writer) is ignored."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return out


def summarize(values: list[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    if not values:
        return {"mean": None, "std": None}
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0}


def collect_warnings(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training warnings of run records (``{"seed", "results": {"warnings": [...]}}``),
    each with its seed, for a multi-seed summary."""
    return [{"seed": r["seed"], **w} for r in runs for w in r["results"].get("warnings", [])]


def format_warning(w: dict[str, Any]) -> str:
    """One line for a training warning of a run summary, e.g.
    ``warning (seed 0, epoch 5): Delta fell ...``.

    >>> format_warning({"seed": 1, "kind": "alignment_runaway", "iteration": 400, "message": "m"})
    'warning (seed 1, iteration 400): m'
    """
    where = ", ".join(f"{k} {w[k]}" for k in ("seed", "epoch", "iteration") if k in w)
    return f"warning ({where}): {w['message']}"


class OtherConfigError(ValueError):
    """A run folder already holds runs of another config (resuming there would mix results)."""


#: Keys added to the config schema whose default does NOT reproduce what the code did before
#: the key existed, with the value that does: a stored config without such a key was run with
#: that value. (Every other added key defaults to the earlier behaviour.)
LEGACY_VALUES: dict[str, Any] = {
    "train.alignment": "paper",
    # every class was kept before data.keep_classes existed: a subset is another task
    "data.keep_classes": None,
}


def config_differences(
    stored: dict[str, Any], current: dict[str, Any], where: str = ""
) -> list[str]:
    """``key: old -> new`` for every key of the resolved configs whose value differs.

    A key added to the config schema since a run was stored does not count, unless it is in
    :data:`LEGACY_VALUES` and ``current`` differs from the value the run was made with.

    >>> config_differences({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}})
    ['b.c: 2 -> 3']
    >>> config_differences({"train": {}}, {"train": {"alignment": "balanced"}})
    ["train.alignment: 'paper' (before the key existed) -> 'balanced'"]
    """
    out = []
    for k in stored.keys() & current.keys():
        a, b, path = stored[k], current[k], f"{where}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, path + ".")
        elif a != b:
            out.append(f"{path}: {a!r} -> {b!r}")
    for k in current.keys() - stored.keys():
        path = f"{where}{k}"
        if path in LEGACY_VALUES and current[k] != LEGACY_VALUES[path]:
            old = LEGACY_VALUES[path]
            out.append(f"{path}: {old!r} (before the key existed) -> {current[k]!r}")
    return sorted(out)


def check_same_config(records: list[dict[str, Any]], current: dict[str, Any], where: Path) -> None:
    """Refuse to resume in a folder whose finished runs (``records``, each with its resolved
    ``config``) were made with another config than ``current``: every key but the seed must
    agree, so that a summary never mixes two configs' results.

    Raises:
        OtherConfigError: naming the folder, the seed of the first differing run and the keys
            that differ (stored -> current).
    """
    mine = {k: v for k, v in current.items() if k != "seed"}
    for rec in records:
        stored = {k: v for k, v in rec.get("config", {}).items() if k != "seed"}
        diff = config_differences(stored, mine)
        if diff:
            shown = "; ".join(diff[:8]) + (f"; ... ({len(diff)} keys)" if len(diff) > 8 else "")
            raise OtherConfigError(
                f"{where} holds runs of another config (seed {rec.get('seed')}: {shown}); "
                "results would be mixed: use another --out (or remove that folder)"
            )


def parse_seeds(spec: str) -> list[int]:
    """``"0-4"`` -> [0..4]; ``"0,2,5"`` -> [0, 2, 5]; ``"3"`` -> [3]."""
    seeds: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(p) for p in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise ValueError(f"bad seed list {spec!r}: use e.g. 0-4 or 0,1,2") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"bad seed list {spec!r}: seeds must be distinct and >= 0")
    return seeds


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file (image list checksums, the identity of a weights file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
