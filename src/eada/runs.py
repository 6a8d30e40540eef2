"""Run records: every run writes its resolved config, seed, versions and git commit beside its
results, and multi-run jobs append one JSON line per run (DomainBed style)."""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from eada.outputs import (  # noqa: F401 (a store's own files: re-exported from their module)
    STORE_DB_NAME,
    STORE_FILE_NAMES,
    StoreFileError,
    check_not_special,
    check_not_store,
)


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


_CODE: dict[str, Any] = {}


def code_identity() -> dict[str, Any]:
    """The code this process runs: ``{"eada": version, "commit": the git commit of the eada
    package's own source tree, "dirty"}`` (not the working folder's repository; once per
    process). A Dask grid's driver compares each worker's with its own, and each record keeps
    its worker's."""
    if not _CODE:
        try:
            version: str | None = metadata.version("eada")
        except metadata.PackageNotFoundError:
            version = None
        git = git_commit(Path(__file__).resolve().parent)
        _CODE.update(eada=version, commit=git["commit"], dirty=git["dirty"])
    return dict(_CODE)


def environment_info() -> dict[str, Any]:
    """Versions and machine facts to store beside results."""
    import numpy as np
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
    import numpy as np

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


def named(err: OSError, path: Path) -> OSError:
    """``err`` naming ``path`` when it names no file (a full disk's ``write`` names none)."""
    if err.filename is not None or err.errno is None:
        return err
    return OSError(err.errno, err.strerror or str(err), str(path))


def write_bytes_atomic(path: Path, data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` through :func:`tmp_name` (fsynced, then ``os.replace``):
    ``path`` is the old file or the new one, never a part; a failed write (a full disk) leaves
    no temporary file and raises an ``OSError`` naming ``path``. The temporary files of
    killed writers of ``path`` are removed first (:func:`remove_stale_staging`). A device,
    FIFO, socket or symbolic link at ``path`` is refused (the rename would replace it).
    ``mode`` (e.g. ``0o600`` for a report holding annotator names): the file's permissions
    whatever the umask; ``None``: the umask's default."""
    path = Path(path)
    check_not_store(path, "the output")
    check_not_special(path, "the output")
    if path.is_symlink():
        raise OSError(
            errno.EEXIST,
            f"is a symbolic link (to {os.readlink(path)}); the write would replace the link, "
            "not the file it names: name the file itself",
            str(path),
        )
    if path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR, "is a folder; name the file to write (e.g. FOLDER/report.html)", str(path)
        )
    blocked = next((p for p in path.absolute().parents if p.exists()), None)
    if blocked is not None and not blocked.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR, f"its parent {blocked} is a file, not a folder", str(path)
        )
    remove_stale_staging(path)
    tmp = tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)  # the umask only ever removes bits; mode is exact
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise named(err, path) from None
        raise
    return path


class _WriteRecorder:
    """A binary file's ``write``/``flush`` that remembers the ``OSError`` a write raised."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self.fh.write(data))
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as err:
            self.error = err
            raise


def write_through(path: Path, writer: Callable[[Any], None], mode: int = 0o666) -> None:
    """Create ``path`` (``mode``, less the umask) and let ``writer`` write it
    (``lambda fh: torch.save(obj, fh)``), then flush and fsync it. A write that fails (a full
    disk) raises its ``OSError`` naming ``path``, even where ``writer`` turned it into another
    exception (``torch.save``'s zip writer reports ``RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos``)."""
    rec: _WriteRecorder | None = None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            rec = _WriteRecorder(fh)
            writer(rec)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise named(err, path) from None
    except Exception:
        if rec is not None and rec.error is not None:
            raise named(rec.error, path) from None
        raise


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically (:func:`write_bytes_atomic`): a crash never
    leaves a half-written file behind, and concurrent writers never a mixed one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes_atomic(path, (json.dumps(_clean(obj), indent=1) + "\n").encode())


def write_json_if_changed(path: Path, obj: Any) -> bool:
    """:func:`write_json` unless ``path`` already holds the same JSON (a summary of runs that
    were all reused keeps its file untouched); returns whether it wrote."""
    try:
        same = json.loads(path.read_text()) == json.loads(json.dumps(_clean(obj)))
    except (OSError, ValueError):
        same = False
    if not same:
        write_json(path, obj)
    return not same


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False``
    where the system or file system cannot."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_tree(folder: Path) -> None:
    for f in folder.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder
    finally:
        os.close(fd)


def remove_stale_staging(out: Path) -> list[Path]:
    """Delete the temporary files and staging folders of ``out`` (``.NAME.PID.tmp`` beside it)
    that killed processes left; those of a live process stay."""
    removed: list[Path] = []
    if not out.parent.is_dir():
        return removed
    import glob

    for d in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        pid = d.name[len(out.name) + 2 : -len(".tmp")]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
        else:
            d.unlink(missing_ok=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Build a folder at a temporary name beside ``out`` (same file system: ``.NAME.PID.tmp``)
    and move it into place when the block ends without an error: ``out`` is the previous
    folder or the complete new one, never a mix. An existing ``out`` is swapped in one step
    (``renameat2``; elsewhere: moved aside to ``.NAME.PID.previous``, then removed) and
    deleted: the caller decides whether it may be replaced. On an error (a full disk) or a
    kill the staging folder goes (a killed process's at the next call) and ``out`` stays as
    it was. Errors name the file they concern."""
    out = Path(out)
    check_not_store(out, "the output folder")
    if out.is_symlink():  # a link to a folder: the folder's content is replaced, not the link
        out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    tmp = tmp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as err:
        raise named(err, tmp) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        if out.exists() and _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)  # now the previous folder
        elif out.exists():
            aside = out.with_name(f".{out.name}.{os.getpid()}.previous")
            os.rename(out, aside)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(aside, out)  # the previous folder back in place
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, out)
        _fsync_dir(out.parent)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise named(err, out) from None
        raise


class FolderInUseError(ValueError):
    """A run folder another process holds (:func:`folder_lock`)."""


#: the lock file of a folder a grid writes into (``eada bench --out``)
LOCK_NAME = ".eada.lock"


@contextmanager
def folder_lock(folder: Path, what: str = "eada bench") -> Iterator[None]:
    """Hold ``folder``'s lock (an OS file lock on ``folder/.eada.lock``, ``flock``) while the
    block runs, so that one process at a time writes a grid's ``runs.jsonl``. The lock goes
    with its process (a killed one leaves nothing to clean up); the file names its holder's
    host, PID and start time, for the message a second process gets. Where the OS has no
    ``flock`` (Windows) nothing is locked.

    Raises:
        FolderInUseError: another process holds the lock (its host and PID named).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    import socket

    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise named(err, path) from None
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            try:
                info = json.loads(holder)
                who = f"{info['what']} on host {info['host']}, PID {info['pid']}, since "
                who += str(info["since"])
            except (ValueError, KeyError, TypeError):
                who = "another process"
            raise FolderInUseError(
                f"{folder} is in use by {who}: one grid at a time writes a folder; wait for "
                "it to end, or use another --out"
            ) from None
        stamp = {
            "what": what,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(stamp).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one JSON line (fsynced) to ``path``; safe for concurrent writers.

    The line goes out in ONE ``write`` on an ``O_APPEND`` descriptor under an exclusive
    ``flock``, so processes appending to the same file (``eada bench --jobs N``, two
    invocations on one ``--out``) never interleave. A torn last line left by a killed writer is
    cut off first, so it cannot end up in the middle of the file.
    """
    import fcntl

    check_not_store(path, "the output")
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


#: the suffix of a compressed JSON-lines log (xz: the standard library's ``lzma`` reads it)
COMPRESSED_SUFFIX = ".xz"


def compressed_log(path: Path) -> Path:
    """The compressed twin of a JSON-lines log: ``runs.jsonl`` -> ``runs.jsonl.xz``."""
    return path.with_name(path.name + COMPRESSED_SUFFIX)


def jsonl_exists(path: Path) -> bool:
    """Whether the log ``path`` exists plain, compressed (``path`` + ``.xz``) or both."""
    return path.is_file() or compressed_log(path).is_file()


def find_jsonl(root: Path, pattern: str = "**/runs.jsonl") -> list[Path]:
    """The logs under ``root`` matching ``pattern``, plain or compressed, each named by its
    plain path (``.../runs.jsonl``) once, sorted; :func:`read_jsonl` reads either form.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> for name in ("a/runs.jsonl.xz", "b/runs.jsonl", "b/runs.jsonl.xz"):
        ...     (root / name).parent.mkdir(exist_ok=True)
        ...     (root / name).touch()
        >>> [str(p.relative_to(root)) for p in find_jsonl(root)]
        ['a/runs.jsonl', 'b/runs.jsonl']
    """
    root = Path(root)
    found = set(root.glob(pattern))
    found |= {p.with_name(p.name[: -len(COMPRESSED_SUFFIX)]) for p in root.glob(pattern + ".xz")}
    return sorted(found)


#: The ``status`` of a line of ``eada bench`` for a run that did not finish: it raised
#: (``"failed"``) or its worker died (``"lost"``). Such a line holds no results.
UNFINISHED = ("failed", "lost")


def is_finished(record: dict[str, Any]) -> bool:
    """Whether a run record holds a finished run (no ``status`` of :data:`UNFINISHED`).

    >>> is_finished({"key": "k", "final": {}}), is_finished({"key": "k", "status": "failed"})
    (True, False)
    """
    return record.get("status") not in UNFINISHED


def read_jsonl(path: Path, unfinished: bool = False) -> list[dict[str, Any]]:
    """All records of a JSON-lines log; a torn last line (a killed writer) is skipped with one
    warning on stderr naming the file and line.

    A log may be stored compressed: ``runs.jsonl.xz`` (the committed results under
    ``benchmarks/results/`` are, to keep the repository light) is read first, then any plain
    ``runs.jsonl`` beside it (runs appended since, e.g. a resumed grid), so both forms read as
    one log.

    Args:
        path: the log (``runs.jsonl``; neither form there: no records).
        unfinished: also return the lines of runs that failed or were lost
            (:func:`is_finished`); every table, report and resume reads finished runs only.

    Example:
        >>> import lzma, tempfile
        >>> log = Path(tempfile.mkdtemp()) / "runs.jsonl"
        >>> _ = compressed_log(log).write_bytes(lzma.compress(b'{"seed": 0}\\n'))
        >>> _ = log.write_text('{"seed": 1}\\n')
        >>> [r["seed"] for r in read_jsonl(log)]
        [0, 1]
    """
    path = Path(path)
    packed = compressed_log(path)
    out: list[dict[str, Any]] = []
    if packed.is_file():
        import lzma

        try:
            text = lzma.decompress(packed.read_bytes()).decode()
        except lzma.LZMAError as err:
            raise ValueError(f"{packed}: not a readable xz file ({err})") from None
        out += _parse_jsonl(packed, text.splitlines(), False, unfinished)
    if path.exists():
        out += _parse_jsonl(path, path.read_text().splitlines(), True, unfinished)
    return out


_WARNED_TORN: set[tuple[str, int]] = set()
"""The torn last lines warned about in this process (one warning a line, however often read)."""


def _parse_jsonl(
    path: Path, lines: list[str], torn_ok: bool, unfinished: bool
) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if torn_ok and i == len(lines) - 1:  # a killed writer: its run is run again
                if (str(path), i + 1) not in _WARNED_TORN:
                    _WARNED_TORN.add((str(path), i + 1))
                    sys.stderr.write(
                        f"warning: {path}: line {i + 1} is torn (a writer was killed while "
                        "writing it); skipped, its run counts as not run\n"
                    )
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        if unfinished or not isinstance(rec, dict) or is_finished(rec):
            out.append(rec)
    return out


def summarize(values: list[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
    import numpy as np

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


#: Keys added to the config schema since the first runs were recorded, with the value the code
#: ran before the key existed: a stored config without such a key is compared as if it held
#: that value. (Most defaults reproduce the earlier behaviour; ``train.alignment`` and
#: ``train.amp`` do not.) A stored config that lacks any OTHER key of the current config is
#: refused: what it ran cannot be told (e.g. a key removed from a record by hand, or an
#: ``active.params`` entry it never had).
LEGACY_VALUES: dict[str, Any] = {
    "train.alignment": "paper",
    "train.amp": False,  # added in eabc524: before, no autocast (fp32)
    "train.forward": "separate",  # 4555a9b: one forward pass per stream before
    "train.channels_last": False,  # 4555a9b
    "train.loaders": "continuous",  # b1a37a9
    "data.transforms.unlabeled_view": "train",  # b1a37a9
    "data.allow_outside_root": False,  # 2643c25: list paths outside root were refused before
    "model.backbone": "resnet50",  # eabc524 (image backbones)
    "model.weights": "pretrained",  # eabc524
    "model.factory": None,  # eabc524
    "model.bottleneck_dim": None,  # eabc524: no bottleneck before
    "model.freeze_backbone": False,  # eabc524
    # every class was kept before data.keep_classes existed: a subset is another task
    "data.keep_classes": None,
    # 89cd03c: the bottleneck BatchNorm's affine parameters were always trained before
    "model.freeze_bottleneck_bn_affine": False,
    # L_fea had no gate (weight 1 throughout) before train.fea_gate existed
    "train.fea_gate": "none",
    # cuDNN's default (no benchmark) and compile's one mode before these keys existed
    "train.cudnn_benchmark": False,
    "train.compile_mode": None,
}


def config_differences(
    stored: dict[str, Any], current: dict[str, Any], where: str = ""
) -> list[str]:
    """``key: old -> new`` for every key of the resolved configs whose value differs.

    A key of ``current`` that ``stored`` lacks (added to the config schema since the run was
    stored) is compared with the value the code ran before it existed
    (:data:`LEGACY_VALUES`); a missing key not listed there is a difference itself (the
    value the run was made with is unknown).

    >>> config_differences({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}})
    ['b.c: 2 -> 3']
    >>> config_differences({"train": {}}, {"train": {"alignment": "balanced"}})
    ["train.alignment: 'paper' (before the key existed) -> 'balanced'"]
    >>> config_differences({"train": {}}, {"train": {"forward": "separate"}})
    []
    >>> config_differences({"train": {}}, {"train": {"new_key": 1}})
    ['train.new_key: not in the stored record (made before the key existed?) -> 1']
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
        if path in LEGACY_VALUES:
            if current[k] != LEGACY_VALUES[path]:
                old = LEGACY_VALUES[path]
                out.append(f"{path}: {old!r} (before the key existed) -> {current[k]!r}")
        elif isinstance(current[k], dict) and not current[k]:
            continue  # an empty section (e.g. active.params) adds nothing
        elif isinstance(current[k], dict):
            out += config_differences({}, current[k], path + ".")
        else:
            out.append(
                f"{path}: not in the stored record (made before the key existed?) -> {current[k]!r}"
            )
    return sorted(out)


def input_differences(stored: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between the data a run was stored with (its record's ``inputs``, see
    :func:`eada.data.identity.data_inputs`) and the data at hand: one line an input whose
    digest differs, appeared or went, naming its path. A record without ``inputs`` (written
    before runs recorded their data) matches only a config without input files (toy data).

    >>> a = {"target": {"path": "/d/t.npz", "digest": "sha256:aa"}}
    >>> input_differences(a, a)
    []
    >>> input_differences(a, {"target": {"path": "/e/t.npz", "digest": "sha256:bb"}})
    ['target: /d/t.npz (sha256:aa) -> /e/t.npz (sha256:bb)']
    >>> input_differences(a, {"target": {"path": "/d/t.npz", "digest": "sha256:bb"}})
    ['target /d/t.npz: sha256:aa -> sha256:bb (content changed)']
    >>> input_differences(None, a)
    ['inputs: not recorded (a run made before runs recorded their data) -> target /d/t.npz']
    """
    if stored is None:
        if not current:
            return []
        roles = ", ".join(f"{r} {v['path']}" for r, v in sorted(current.items()))
        return [f"inputs: not recorded (a run made before runs recorded their data) -> {roles}"]
    out = []
    for role in sorted(stored.keys() | current.keys()):
        a, b = stored.get(role), current.get(role)
        if a is None or b is None or a.get("digest") != b.get("digest"):
            if a and b and a["path"] == b["path"]:
                out.append(f"{role} {a['path']}: {_short(a)} -> {_short(b)} (content changed)")
                continue
            was = f"{a['path']} ({_short(a)})" if a else "none"
            now = f"{b['path']} ({_short(b)})" if b else "none"
            out.append(f"{role}: {was} -> {now}")
    return out


def _short(entry: dict[str, Any]) -> str:
    """A digest shortened for a message: ``sha256:`` and 12 hex digits."""
    kind, _, hexd = str(entry.get("digest", "?:?")).partition(":")
    return f"{kind}:{hexd[:12]}"


def run_meta(env: dict[str, Any] | None = None) -> dict[str, Any]:
    """What made a run, stored in its own record: git commit (and dirty flag), eada version,
    command and time (``env``: an :func:`environment_info` already taken)."""
    env = env if env is not None else environment_info()
    return {k: env.get(k) for k in ("git", "eada", "command", "time_utc")}


def describe_reused(records: list[dict[str, Any]]) -> str:
    """``reused N runs made at T by commit C`` for the stored records a command reuses
    (times and commits of every distinct maker; ``unknown`` where a record has no ``meta``).

    >>> describe_reused([{"meta": {"time_utc": "2026-01-01T00:00:00+00:00",
    ...     "git": {"commit": "abcdef0123456", "dirty": False}}}])
    'reused 1 run made at 2026-01-01T00:00:00+00:00 by commit abcdef012345'
    """
    times, commits = [], []
    for rec in records:
        meta = rec.get("meta") or {}
        git = meta.get("git") or rec.get("code", {}).get("git") or {}
        t = meta.get("time_utc") or rec.get("time_utc") or "an unknown time"
        c = (git.get("commit") or "unknown")[:12] + (" (dirty)" if git.get("dirty") else "")
        times.append(t)
        commits.append(c)
    n = len(records)
    when = min(times) if len(set(times)) == 1 else f"{min(times)} .. {max(times)}"
    who = ", ".join(dict.fromkeys(commits))
    plural = "s" if len(set(commits)) > 1 else ""
    return f"reused {n} run{'s' if n != 1 else ''} made at {when} by commit{plural} {who}"


#: how to start afresh where a run folder's stored runs cannot be reused
START_AFRESH = "use another --out to start afresh (or remove that folder)"


class OtherDataError(OtherConfigError):
    """A run folder holds runs of the same config made on other data (or on data whose
    identity was not recorded): reusing them would report numbers of other data."""


def check_same_data(
    records: list[dict[str, Any]], current: dict[str, Any], where: Path, fresh: str
) -> None:
    """Refuse to reuse stored runs whose input data (``inputs``) differ from ``current``.

    ``fresh`` names the way to start afresh (e.g. ``use another --out``).

    Raises:
        OtherDataError: naming the folder, the run and every input that differs.
    """
    for rec in records:
        diff = input_differences(rec.get("inputs"), current)
        if diff:
            who = rec.get("key") or f"seed {rec.get('seed')}"
            raise OtherDataError(
                f"{where} holds a run ({who}) made on other data: {'; '.join(diff[:6])}; "
                f"its result would be reported for data it never saw: {fresh}"
            )


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


@dataclass
class SeedFolder:
    """A run folder opened for a list of seeds (:func:`open_seed_folder`): the stored runs it
    reuses (``done``), the seeds left to train (``todo``), the data identity and the meta every
    new record carries."""

    out_dir: Path
    done: dict[int, dict[str, Any]]
    todo: list[int]
    inputs: dict[str, Any]
    meta: dict[str, Any]

    def record(self, seed: int, run: dict[str, Any]) -> None:
        """Stamp a finished run with the data identity and its own meta; append it to
        ``runs.jsonl`` (one line, so a killed command keeps every finished seed)."""
        run["inputs"] = self.inputs
        run["meta"] = run_meta(self.meta)
        append_jsonl(self.out_dir / "runs.jsonl", run)
        self.done[seed] = run

    def write_results(self, summary: dict[str, Any]) -> None:
        """Write ``results.json`` (left untouched when every run was reused and nothing
        changed, so a reusing command never restamps it)."""
        write_json_if_changed(self.out_dir / "results.json", summary)


def open_seed_folder(
    out_dir: Path,
    resolved: dict[str, Any],
    inputs: dict[str, Any],
    seeds: list[int],
    progress: Callable[[str], None] | None = None,
    meta_extra: dict[str, Any] | None = None,
) -> SeedFolder:
    """Open ``out_dir`` to run ``seeds`` of the config ``resolved`` on the data ``inputs``
    (the shared start of ``eada run`` and ``eada seg run``).

    Stored runs are reused only when made with the same config (every key but the seed) on the
    same data; they keep their own meta, and ``progress`` is told "reused N runs made at ... by
    commit ...". When seeds remain, ``config.json`` and ``meta.json`` (this command's
    :func:`environment_info` plus ``meta_extra``) are written before any training.

    Raises:
        OtherConfigError: the folder holds runs of another config.
        OtherDataError: the folder holds runs made on other data (or of unrecorded data).
    """
    check_not_store(out_dir)  # never runs into a project store's folder
    log = out_dir / "runs.jsonl"
    records = read_jsonl(log)
    check_same_config(records, resolved, out_dir)  # never mix configs
    check_same_data(records, inputs, out_dir, START_AFRESH)  # nor data
    done = {r["seed"]: r for r in records}
    todo = [s for s in seeds if s not in done]
    reused = [done[s] for s in seeds if s in done]
    if reused and progress:  # stored runs keep their own meta (commit, command, time)
        progress(f"{describe_reused(reused)} ({log})")
    meta: dict[str, Any] = {}
    if todo:  # the folder's meta describes the last command that trained in it
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "config.json", resolved)
        meta = {**environment_info(), **(meta_extra or {})}
        write_json(out_dir / "meta.json", meta)
    return SeedFolder(out_dir, done, todo, inputs, meta)


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
