"""Thread counts, chosen deliberately.

On a machine that other jobs share, too many threads cost far more than too few: torch's and the
BLAS libraries' default (one thread a core) makes an epoch of a small model 50x slower once the
cores are busy, and OpenMP barriers in BLAS/k-means calls spin on cores that are not free.
So ``eada`` decides the count once a process and applies it everywhere:

* :func:`set_threads` (``--threads N`` of ``eada run / bench / demo / train``) fixes the count;
* without it, ``OMP_NUM_THREADS`` decides when it is set;
* otherwise the model decides (:func:`threads_for_model`): a small model (fewer than
  :data:`SMALL_MODEL_PARAMS` parameters, e.g. the toy's linear head or the digits LeNet, or a
  head trained on cached features) gets ONE thread, because its steps are too short to share
  between threads; a large one (an image backbone in the training step) gets the cores this
  process may use (:func:`available_cores`);
* the BLAS/OpenMP-heavy selection code (BADGE, CoreSet, CLUE's k-means, DBAL, ...) and the
  scikit-learn statistics run under :func:`blas_limits`, limited by ``threadpoolctl`` to the
  same count.

The count a run used is recorded (``meta.json`` ``threads``, :func:`thread_record`).

The memory this process may still allocate (:func:`memory_limit`: physical memory, the
cgroup's limit, ``RLIMIT_AS``/``RLIMIT_DATA``) lives here too: sizes are checked against it
before any work (an image size whose decoded images cannot fit is refused up front).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a count is applied: `--threads` parses without it
    import torch

#: Models with fewer parameters than this train on one thread unless told otherwise.
SMALL_MODEL_PARAMS = 2_000_000

_requested: int | None = None
_applied: int | None = None
_source: str = "default"


def available_cores() -> int:
    """The number of cores this process may run on (CPU affinity, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def env_threads() -> int | None:
    """``OMP_NUM_THREADS`` as a positive integer, or ``None`` when unset or not a number."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n >= 1 else None


MAX_THREADS = 1024
"""The most threads a count for other machines may name (``eada bench --threads`` for Dask or
GPU workers): more than any machine's cores."""


def check_threads(n: int, local: bool = True) -> int:
    """``n`` if it is a valid thread count (>= 1 and at most the cores this process may use,
    :func:`available_cores`: more only contend, and a huge count makes the native thread pools
    fail: ``--threads 100000`` was a segmentation fault), else a ``ValueError`` naming it and
    the limit. ``local=False``: a count for workers that may run elsewhere (``eada bench``),
    bounded by :data:`MAX_THREADS` only."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--threads must be an integer >= 1, got {n!r}")
    if not local:
        if n > MAX_THREADS:
            raise ValueError(f"--threads {n} is more than {MAX_THREADS}; give a core count")
        return n
    cores = available_cores()
    if n > cores:
        raise ValueError(
            f"--threads {n} is more than the {cores} CPU core(s) this process may use (its CPU "
            f"affinity); give at most {cores}"
        )
    return n


def set_threads(n: int | None, local: bool = True) -> None:
    """Fix the thread count of this process (``None``: choose per model, see the module doc).

    Applies it to torch at once where torch is imported; otherwise it sets
    ``OMP_NUM_THREADS``, which torch reads when it is imported, so a command that never needs
    torch (``eada predict`` on ONNX Runtime) does not import it for this. :func:`blas_limits`
    and :func:`configure_for_model` use it. ``local``: :func:`check_threads`'s bound (``False``
    for a count its workers use, which may run elsewhere).
    """
    global _requested, _applied, _source
    if n is None:
        _requested = None
        return
    _requested = check_threads(n, local)
    _source = "--threads"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = str(n)
    _applied = n


def requested_threads() -> int | None:
    """The count given to :func:`set_threads`, or ``None``."""
    return _requested


def model_parameters(model: torch.nn.Module) -> int:
    """Number of parameters of ``model`` (frozen ones included: they still cost compute)."""
    return sum(p.numel() for p in model.parameters())


def threads_for_model(model: torch.nn.Module | None) -> tuple[int, str]:
    """The thread count for training ``model`` and why: ``(n, source)``.

    ``source`` is ``"--threads"``, ``"OMP_NUM_THREADS"``, ``"small model"`` or ``"large
    model"``.
    """
    if _requested is not None:
        return _requested, "--threads"
    env = env_threads()
    if env is not None:
        return env, "OMP_NUM_THREADS"
    if model is not None and model_parameters(model) < SMALL_MODEL_PARAMS:
        return 1, "small model"
    return available_cores(), "large model"


def configure_for_model(model: torch.nn.Module | None) -> int:
    """Choose the thread count for ``model`` (:func:`threads_for_model`), apply it to torch and
    remember it for :func:`blas_limits` and :func:`thread_record`; returns the count."""
    global _applied, _source
    import torch

    n, source = threads_for_model(model)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    _applied, _source = n, source
    return n


def selection_threads() -> int:
    """The count the BLAS/OpenMP-heavy code runs with: the one applied or requested, else
    ``OMP_NUM_THREADS``, else torch's current count."""
    if _requested is not None:
        return _requested
    if _applied is not None:
        return _applied
    n = env_threads()
    if n is not None:
        return n
    import torch

    return torch.get_num_threads()


@contextlib.contextmanager
def blas_limits(n: int | None = None) -> Iterator[int]:
    """Limit BLAS and OpenMP thread pools (numpy, scikit-learn, ...) to ``n`` threads
    (default :func:`selection_threads`) inside the block, with ``threadpoolctl``.

    Example:
        >>> with blas_limits(1) as n:
        ...     n
        1
    """
    count = check_threads(n) if n is not None else selection_threads()
    with _controller().limit(limits=count):
        yield count


_pools: tuple[int, Any] | None = None


def _controller() -> Any:
    """A cached ``threadpoolctl.ThreadpoolController`` (finding the loaded libraries costs
    ~2 ms, more than a cheap strategy's whole call), renewed when modules were imported since
    (a newly imported extension may bring its own BLAS or OpenMP)."""
    global _pools
    from threadpoolctl import ThreadpoolController

    if _pools is None or _pools[0] != len(sys.modules):
        _pools = (len(sys.modules), ThreadpoolController())
    return _pools[1]


def thread_record() -> dict[str, Any]:
    """What to store in ``meta.json``: the torch count, the selection (BLAS/OpenMP) count, where
    the count came from, and the cores available."""
    import torch

    return {
        "torch": torch.get_num_threads(),
        "selection": selection_threads(),
        "source": _source if _applied is not None or _requested is not None else "default",
        "requested": _requested,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "available_cores": available_cores(),
    }


def add_threads_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--threads N``: the thread count of torch and of the BLAS/OpenMP selection code
    (:mod:`eada.threads`; default: OMP_NUM_THREADS, else 1 for a small model); ``help``
    replaces the help text."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help=help
        or "threads for torch and the selection code (default: OMP_NUM_THREADS if set, else "
        "1 for a small model and all cores for a large one); recorded in meta.json",
    )


def _cgroup_limit() -> tuple[int, str] | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), ``None`` when there is none or it cannot be read."""
    candidates = []
    try:
        for line in open("/proc/self/cgroup", encoding="utf-8").read().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and (parts[1] == "" or "memory" in parts[1].split(",")):
                sub = parts[2].lstrip("/")
                candidates += [
                    f"/sys/fs/cgroup/{sub}/memory.max",
                    f"/sys/fs/cgroup/memory/{sub}/memory.limit_in_bytes",
                ]
    except OSError:
        pass
    candidates += ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    for path in candidates:
        try:
            text = open(path, encoding="utf-8").read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes a huge number for "no limit"
            return int(text), f"the cgroup memory limit ({path})"
    return None


def _proc_kib(field: str, path: str = "/proc/self/status") -> int | None:
    try:
        for line in open(path, encoding="utf-8"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit() -> tuple[int, str]:
    """Bytes this process may still allocate, and which limit decides: the smallest of
    physical RAM, the cgroup's memory limit (less this process's resident memory),
    ``RLIMIT_AS`` (less its address space in use) and ``RLIMIT_DATA`` (less its data
    segment), each as far as the system reports it.

    >>> n, why = memory_limit()
    >>> n > 0 and isinstance(why, str)
    True
    """
    import resource

    rss = _proc_kib("VmRSS") or 0
    found: list[tuple[int, str]] = []
    ram = _proc_kib("MemTotal", "/proc/meminfo")
    if ram is None:
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            ram = None
    if ram:
        found.append((ram - rss, f"physical memory ({ram / 2**30:.1f} GiB)"))
    cg = _cgroup_limit()
    if cg is not None:
        found.append((cg[0] - rss, f"{cg[1]}: {cg[0] / 2**30:.1f} GiB"))
    for name, used_field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            used = _proc_kib(used_field) or 0
            found.append((soft - used, f"{name} ({soft / 2**30:.1f} GiB, ulimit)"))
    if not found:
        return 2**62, "no limit found"
    n, why = min(found)
    return max(n, 0), why
