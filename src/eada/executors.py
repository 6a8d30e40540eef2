"""Where the runs of a grid execute: one small interface, three implementations.

An executor takes :class:`Job` objects (a picklable module-level function and its arguments)
and yields one :class:`Outcome` per job, in the order the jobs finish: ``"ok"`` with the
function's value, ``"failed"`` with the error, its type and the tail of its traceback (an
exception in the job itself is never retried), or ``"lost"`` when the worker running it died
and the job's retries were spent. Every outcome says where the job ran (``host``, the worker's
``address``, its ``device``) and when (submitted, started, finished). The grid
(:mod:`eada.bench`) builds the jobs and writes the records; an executor knows nothing of grids,
so another backend (Slurm, Ray) is one more class with the same ``run`` and ``stop``.

* :class:`InProcessExecutor`: one job after the other in this process (``eada bench`` with
  ``--jobs 1``).
* :class:`LocalProcessExecutor`: N worker processes on this machine, each with its own
  ``CUDA_VISIBLE_DEVICES`` (:func:`assign_devices`), replaced when one dies.
* :class:`DaskExecutor`: tasks on an existing Dask distributed cluster (``--dask ADDRESS``);
  ``distributed`` is imported only there, so ``import eada`` never loads it.
  :class:`LoopbackCluster` starts a small one on 127.0.0.1 (tests, benchmarks).

:meth:`Executor.stop` (the first Ctrl-C of ``eada bench``) stops submitting: the running jobs
end and are yielded, the queued ones are not started.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

#: lines of a failed job's traceback kept in its outcome (and its record)
TRACEBACK_LINES = 12

Status = Literal["ok", "failed", "lost"]


class ExecutorError(ValueError):
    """A request no executor can honour (e.g. ``--devices`` naming a GPU that is not there)."""


class WorkerEnvironmentError(OSError):
    """A job failed because of its worker, not of itself (its data are not there, eada or a
    plugin cannot be imported there): an executor that has other workers runs it elsewhere and
    gives that worker no more jobs of the same ``group``. An :class:`ImportError` raised by a
    job, and any exception with ``environment = True``, count as one too."""


class RunCancelled(Exception):
    """Raised inside a job whose task was cancelled (a second Ctrl-C of ``eada bench``), so
    that its worker is free again within one training epoch."""


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn(*args)`` returns a JSON-able dict.

    Attributes:
        key: the job's identity (unique within one :meth:`Executor.run`).
        fn: a module-level function (pickled by reference for worker processes and Dask).
        args: its arguments (picklable).
        label: a short human-readable name for progress lines.
        gpu: the job wants a GPU (Dask: ask for a ``GPU`` resource where workers declare one).
        group: what the job needs from its worker's machine (a grid run: its data set); a
            worker that lacked it for one job gets no other job of the same group.
    """

    key: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...] = ()
    label: str = ""
    gpu: bool = False
    group: str = ""


@dataclass
class Outcome:
    """What became of one job.

    Attributes:
        job: the job.
        status: ``"ok"``, ``"failed"`` (its function raised) or ``"lost"`` (its worker died,
            retries spent).
        value: the function's return value (``"ok"`` only).
        error: the error message (``"failed"``, ``"lost"``).
        error_type: the exception's class name.
        traceback: the last :data:`TRACEBACK_LINES` lines of the traceback.
        worker: ``{"host", "address", "device", "cuda_visible_devices", "pid"}`` of the worker
            that ran it (as far as known for a lost job).
        submitted: when the job was handed to a worker or the scheduler (``time.time()``).
        started: when the worker began it (the worker's clock), ``None`` if unknown.
        finished: when its result was back.
        attempts: how many times it was started (``> 1`` after a lost worker or a worker
            that lacked its data).
        tried_on: the address of the worker of every attempt, in order.
        environment: the failure was its worker's (:class:`WorkerEnvironmentError`).
    """

    job: Job
    status: Status
    value: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    worker: dict[str, Any] = field(default_factory=dict)
    submitted: float = 0.0
    started: float | None = None
    finished: float = 0.0
    attempts: int = 1
    tried_on: list[str] = field(default_factory=list)
    environment: bool = False

    @property
    def submit_to_start(self) -> float | None:
        """Seconds from submission to the worker starting the job (scheduling overhead)."""
        return None if self.started is None else self.started - self.submitted

    def timing(self) -> dict[str, float | None]:
        """``{"submit_to_start_s", "run_s"}`` rounded to milliseconds."""
        run = None if self.started is None else self.finished - self.started
        s2s = self.submit_to_start
        return {
            "submit_to_start_s": None if s2s is None else round(s2s, 4),
            "run_s": None if run is None else round(run, 4),
        }


class Executor(Protocol):
    """Runs jobs, yields one :class:`Outcome` per job as each finishes."""

    name: str

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """Run ``jobs``; yield their outcomes in order of completion."""
        ...

    def stop(self) -> None:
        """Start no more jobs; the running ones end and are yielded."""
        ...


# -- the worker side (the same in every executor) -----------------------------------------------
def worker_device() -> str:
    """The GPU this process's jobs would use: ``"cuda:<physical GPU>"`` (the first id of
    ``CUDA_VISIBLE_DEVICES``, else 0) where CUDA is available, else ``"cpu"``."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = (cvd or "0").split(",")[0].strip() or "0"
    return f"cuda:{first}"


def worker_info() -> dict[str, Any]:
    """Where this process is: ``host``, ``address`` (a Dask worker's address, else
    ``local:<pid>``), ``device`` (:func:`worker_device`), ``cuda_visible_devices``, ``pid``."""
    address = f"local:{os.getpid()}"
    if "distributed" in sys.modules:  # inside a Dask worker (never imported otherwise)
        try:
            from distributed import get_worker

            address = get_worker().address
        except ValueError:  # not in a worker
            pass
    return {
        "host": socket.gethostname(),
        "address": address,
        "device": worker_device(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }


def code_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs between two code identities (``eada`` version, git ``commit``; see
    :func:`eada.runs.code_identity`).

    >>> code_differences({"eada": "1.0", "commit": "ab"}, {"eada": "1.0", "commit": "cd"})
    ['commit ab -> cd']
    """
    return [
        f"{k} {mine.get(k)} -> {theirs.get(k)}"
        for k in ("eada", "commit")
        if mine.get(k) != theirs.get(k)
    ]


def task_cancelled() -> bool:
    """Inside a Dask worker's task: whether the task was cancelled (the client released or
    cancelled it); ``False`` anywhere else. Cheap: no network."""
    if "distributed" not in sys.modules:
        return False
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        key = getattr(thread_state, "key", None)
        if key is None:
            return False
        ts = get_worker().state.tasks.get(key)
    except (ValueError, AttributeError):  # not in a worker
        return False
    return ts is None or ts.state in ("cancelled", "released", "forgotten")


def call_job(fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> dict[str, Any]:
    """Run ``fn(*args)`` on a worker; the result or the error as a plain dict, never raising
    for an ``Exception`` (``KeyboardInterrupt`` and ``SystemExit`` pass). An ``OSError`` (a
    data file missing on this worker) names the worker in its message."""
    started = time.time()
    info = worker_info()
    try:
        value = fn(*args)
    except Exception as err:  # the job failed: reported, never retried
        return _failure(err, info, started)
    return {"ok": True, "value": value, "worker": info, "started": started, "finished": time.time()}


def _failure(
    err: BaseException, info: dict[str, Any], started: float, any_group: bool = False
) -> dict[str, Any]:
    """The result dict of a job that raised ``err`` on the worker ``info``: an environment
    failure (the worker's fault) for a :class:`WorkerEnvironmentError`, an
    :class:`ImportError` or an exception marked ``environment = True`` (a plugin this worker
    lacks); ``any_group``: the worker can run no job at all (the job could not be unpickled)."""
    lines = traceback.format_exc().rstrip().splitlines()
    msg = str(err) or type(err).__name__
    if isinstance(err, OSError | ImportError):
        msg += f" (on worker {info['address']}, host {info['host']})"
    return {
        "ok": False,
        "error": msg,
        "error_type": type(err).__name__,
        "traceback": "\n".join(lines[-TRACEBACK_LINES:]),
        "worker": info,
        "started": started,
        "finished": time.time(),
        "environment": isinstance(err, WorkerEnvironmentError | ImportError)
        or bool(getattr(err, "environment", False)),
        "any_group": any_group,
    }


def call_pickled(blob: bytes, key: str = "") -> dict[str, Any]:
    """:func:`call_job` of a pickled ``(fn, args)``: a Dask task is this function (which
    imports nothing heavy) and bytes, so the scheduler, which unpickles every task it is given,
    never imports torch or the job's modules (a first task once waited ~10 s for that).

    A worker that cannot unpickle the job (eada or a plugin not importable there) returns an
    environment failure. Inside a Dask worker, the start of each attempt is logged as an
    ``eada-start`` event (``key``, the worker's address) for the driver's bookkeeping."""
    import pickle

    started = time.time()
    try:
        from distributed import get_worker

        worker = get_worker()
        worker.log_event("eada-start", {"key": key, "worker": worker.address})
    except (ImportError, ValueError):  # not a Dask worker
        pass
    try:
        fn, args = pickle.loads(blob)
    except Exception as err:  # eada, a plugin or a module of the job not importable here
        return _failure(err, worker_info(), started, any_group=True)
    return call_job(fn, args)


def _outcome(
    job: Job, res: dict[str, Any], submitted: float, attempts: int, tried_on: list[str]
) -> Outcome:
    tried = tried_on or [res["worker"].get("address", "")]
    if res["ok"]:
        return Outcome(
            job, "ok", value=res["value"], worker=res["worker"], submitted=submitted,
            started=res["started"], finished=time.time(), attempts=attempts, tried_on=tried,
        )  # fmt: skip
    return Outcome(
        job, "failed", error=res["error"], error_type=res["error_type"],
        traceback=res["traceback"], worker=res["worker"], submitted=submitted,
        started=res["started"], finished=time.time(), attempts=attempts, tried_on=tried,
        environment=bool(res.get("environment")),
    )  # fmt: skip


# -- in-process ----------------------------------------------------------------------------------
class InProcessExecutor:
    """One job after the other in this process."""

    name = "in-process"

    def __init__(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        """Start no more jobs (the running one ends)."""
        self._stopped = True

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """Run ``jobs`` in order; yield each outcome."""
        for job in jobs:
            if self._stopped:
                return
            submitted = time.time()
            yield _outcome(job, call_job(job.fn, job.args), submitted, 1, [])


# -- local worker processes ----------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """The physical ids of the GPUs this process may use: its ``CUDA_VISIBLE_DEVICES`` (the
    first ``torch.cuda.device_count()`` of them) when set, else ``0 .. count - 1``."""
    import torch

    count = torch.cuda.device_count()
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent is not None:
        return [d.strip() for d in parent.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def assign_devices(
    workers: int, devices: Sequence[int] | None = None, runs_per_device: int | None = None
) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` of each of ``workers`` local workers: round-robin over the
    visible GPUs (:func:`visible_gpus`; ``devices`` picks some by their index among them, as
    ``cuda:N`` counts them), ``None`` for every worker on a machine without GPUs.

    Args:
        workers: number of worker processes.
        devices: indices of the visible GPUs to use (``--devices 0,2,3``); ``None``: all.
        runs_per_device: the most workers one GPU may hold (``--runs-per-device``).

    Raises:
        ExecutorError: ``devices`` names a GPU that is not visible, more workers than GPUs
            without ``runs_per_device``, or more than ``len(devices) x runs_per_device``.
    """
    gpus = visible_gpus()
    if devices is not None:
        bad = [d for d in devices if not 0 <= d < len(gpus)]
        if bad:
            raise ExecutorError(
                f"--devices {','.join(map(str, devices))}: no GPU {bad[0]} here ("
                f"{len(gpus)} visible{': ' + ','.join(gpus) if gpus else ''})"
            )
        if len(set(devices)) != len(devices):
            raise ExecutorError(f"--devices {','.join(map(str, devices))} names a GPU twice")
        gpus = [gpus[d] for d in devices]
    if not gpus:
        return [None] * workers
    if runs_per_device is None and workers > len(gpus):
        raise ExecutorError(
            f"--jobs {workers} is more than the {len(gpus)} GPU(s) "
            f"{'of --devices' if devices is not None else 'here'} ({','.join(gpus)}): "
            f"{-(-workers // len(gpus))} workers would share a GPU; give --runs-per-device "
            f"{-(-workers // len(gpus))} to allow that, or lower --jobs to {len(gpus)}"
        )
    if runs_per_device is not None and workers > len(gpus) * runs_per_device:
        raise ExecutorError(
            f"--jobs {workers} needs more than {runs_per_device} run(s) a device on "
            f"{len(gpus)} GPU(s): raise --runs-per-device or lower --jobs"
        )
    return [gpus[i % len(gpus)] for i in range(workers)]


def worker_start_method(threads: int) -> str:
    """How local workers start: ``"fork"`` on Linux without CUDA when each worker runs one
    thread, else ``"spawn"``.

    A forked worker starts in milliseconds with the parent's imports; a spawned one imports
    torch and eada again (~2-4 s a worker, against runs of ~1 s in a grid of small runs). With
    one thread a worker never enters an OpenMP parallel region, so an OpenMP pool of the parent
    (which does not survive a fork) is never used. With more threads, with CUDA (a CUDA context
    does not survive a fork either) and where fork is not the platform's safe default (macOS,
    Windows), the workers are spawned. :class:`LocalProcessExecutor` also checks
    :func:`fork_is_safe` before it forks."""
    import multiprocessing

    import torch

    if threads == 1 and sys.platform.startswith("linux") and not torch.cuda.is_available():
        if "fork" in multiprocessing.get_all_start_methods():
            return "fork"
    return "spawn"


def _probe_backward() -> None:  # pragma: no cover - runs in a forked child
    try:
        import torch

        x = torch.ones(1, requires_grad=True)
        (x * 2).sum().backward()
    except BaseException:
        os._exit(1)
    os._exit(0)


def fork_is_safe(timeout: float = 60.0) -> bool:
    """Whether a child forked now can run a backward pass.

    Once autograd's device threads have started in this process (a backward after
    ``torch.export`` ran, for one), every forked child fails its first backward ("Unable to
    handle autograd's threading in combination with fork-based multiprocessing"). The probe
    forks a child that runs a one-element backward (milliseconds) and reports its exit code."""
    import multiprocessing

    proc = multiprocessing.get_context("fork").Process(target=_probe_backward)
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        return False
    return proc.exitcode == 0


def _die_with_parent() -> None:
    """On Linux, a worker ends when its parent is killed (``SIGKILL`` included) instead of
    living on as an orphan."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if not sys.platform.startswith("linux") or parent is None:
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl here: an orphan may live on
        return
    if os.getppid() != parent.pid:  # the parent died before prctl
        os._exit(1)


def _worker_main(conn: Any, threads: int, device: str | None) -> None:  # pragma: no cover
    """A local worker: its own ``CUDA_VISIBLE_DEVICES`` before anything touches CUDA, Ctrl-C
    left to the parent (which lets the running job end), then job after job from ``conn``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    _die_with_parent()
    from threadpoolctl import threadpool_limits

    from eada.threads import set_threads

    set_threads(threads, local=False)  # the count the grid was given, on this worker
    threadpool_limits(limits=threads)  # BLAS pools a forked worker inherits from the parent
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        conn.send(call_job(fn, args))


@dataclass
class _Slot:
    index: int
    device: str | None
    proc: Any = None
    conn: Any = None
    job: Job | None = None
    submitted: float = 0.0


class LocalProcessExecutor:
    """``workers`` processes on this machine, each with ``threads`` threads and its own
    ``CUDA_VISIBLE_DEVICES`` (``devices[i]``, set before CUDA starts in it), each taking job
    after job. A worker that dies takes its job with it: the job is started again up to
    ``retries`` times (on a fresh worker with the same device), then yielded as ``"lost"``.

    Workers are forked where :func:`worker_start_method` allows it and :func:`fork_is_safe`
    says a forked child can still run a backward pass, else spawned. ``preload``: modules the
    parent imports once before forking (instead of once a worker)."""

    name = "local processes"

    def __init__(
        self,
        workers: int,
        threads: int = 1,
        devices: Sequence[str | None] | None = None,
        retries: int = 0,
        preload: Sequence[str] = (),
        start_method: str | None = None,
    ) -> None:
        if workers < 1:
            raise ExecutorError(f"--jobs must be >= 1, got {workers}")
        self.workers = workers
        self.threads = threads
        self.devices = list(devices) if devices is not None else [None] * workers
        if len(self.devices) != workers:
            raise ExecutorError(f"{len(self.devices)} devices for {workers} workers")
        self.retries = retries
        self.preload = tuple(preload)
        self.start_method = start_method
        self._stopped = False

    def stop(self) -> None:
        """Start no more jobs; the running ones end."""
        self._stopped = True

    def resolve_start_method(self) -> str:
        """``"fork"`` or ``"spawn"`` (see the class docstring)."""
        method = self.start_method or worker_start_method(self.threads)
        if method == "fork" and not fork_is_safe():
            method = "spawn"
        return method

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """Run ``jobs`` on the workers; yield each outcome as it finishes."""
        import importlib
        import multiprocessing
        import warnings
        from multiprocessing.connection import wait

        if not jobs:
            return
        self.method = method = self.resolve_start_method()
        if method == "fork":
            for name in self.preload:
                importlib.import_module(name)
        ctx: Any = multiprocessing.get_context(method)
        names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
        saved = {k: os.environ.get(k) for k in names}
        os.environ.update({k: str(self.threads) for k in names})  # inherited by spawned ones
        slots = [_Slot(i, self.devices[i]) for i in range(min(self.workers, len(jobs)))]

        def start(slot: _Slot) -> None:
            parent, child = ctx.Pipe()
            with warnings.catch_warnings():  # Python >= 3.12 warns of any thread (BLAS pools)
                warnings.filterwarnings("ignore", ".* use of fork", DeprecationWarning)
                slot.proc = ctx.Process(
                    target=_worker_main, args=(child, self.threads, slot.device), daemon=True
                )
                slot.proc.start()
            child.close()
            slot.conn = parent

        queue = deque(jobs)
        attempts: dict[str, int] = {}
        tried: dict[str, list[str]] = {}
        try:
            for slot in slots:
                start(slot)
            while True:
                for slot in slots:  # hand out work
                    if slot.job is None and queue and not self._stopped:
                        job = queue.popleft()
                        attempts[job.key] = attempts.get(job.key, 0) + 1
                        if not slot.proc.is_alive():  # it died while idle: a fresh one
                            slot.proc.join()
                            slot.conn.close()
                            start(slot)
                        slot.job, slot.submitted = job, time.time()
                        tried.setdefault(job.key, []).append(f"local:{slot.proc.pid}")
                        slot.conn.send((job.fn, job.args))
                busy = [s for s in slots if s.job is not None]
                if not busy:
                    return
                ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy])
                for slot in busy:
                    assert slot.job is not None
                    job = slot.job
                    res = None
                    if slot.conn in ready or slot.proc.sentinel in ready:
                        try:
                            if slot.conn.poll():
                                res = slot.conn.recv()
                        except (EOFError, OSError):
                            res = None
                    if res is not None:
                        slot.job = None
                        yield _outcome(job, res, slot.submitted, attempts[job.key], tried[job.key])
                    elif slot.proc.sentinel in ready or not slot.proc.is_alive():
                        slot.proc.join()
                        slot.job = None
                        code = slot.proc.exitcode
                        where = {
                            "host": socket.gethostname(),
                            "address": f"local:{slot.proc.pid}",
                            "device": f"cuda:{slot.device}" if slot.device else None,
                            "cuda_visible_devices": slot.device,
                            "pid": slot.proc.pid,
                        }
                        if attempts[job.key] <= self.retries:
                            queue.appendleft(job)
                        else:
                            yield Outcome(
                                job, "lost",
                                error=f"worker {where['address']} died (exit code {code}) "
                                f"while running it ({attempts[job.key]} attempt(s))",
                                error_type="WorkerLost", worker=where,
                                submitted=slot.submitted, finished=time.time(),
                                attempts=attempts[job.key], tried_on=tried[job.key],
                            )  # fmt: skip
                        if queue and not self._stopped:
                            start(slot)  # a fresh worker on the same device
        finally:
            for slot in slots:
                if slot.proc is None:
                    continue
                if slot.proc.is_alive():
                    try:
                        slot.conn.send(None)
                    except OSError:
                        pass
                slot.proc.join(timeout=5 if slot.job is None else 0)
                if slot.proc.is_alive():  # a job still running: interrupted for good
                    slot.proc.terminate()
                    slot.proc.join()
                slot.conn.close()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- Dask distributed ----------------------------------------------------------------------------
def task_resources(job: Job, workers: dict[str, Any]) -> dict[str, int] | None:
    """The Dask resources a job asks for: one ``GPU`` for a GPU job when any worker declares
    ``GPU`` resources (``workers``: the scheduler's ``{address: info}``), else none.

    >>> task_resources(Job("k", dict, gpu=True), {"tcp://a:1": {"resources": {"GPU": 1}}})
    {'GPU': 1}
    >>> task_resources(Job("k", dict, gpu=True), {"tcp://a:1": {"resources": {}}}) is None
    True
    """
    declared = any("GPU" in (w.get("resources") or {}) for w in workers.values())
    return {"GPU": 1} if job.gpu and declared else None


def _worker_code(
    code: Callable[[], dict[str, Any]] | None, dask_worker: Any = None
) -> dict[str, Any]:
    """What a Dask worker reports before it gets runs: ``code()`` (its code's identity), its
    host and its resources (``client.run`` passes ``dask_worker``)."""
    state = getattr(dask_worker, "state", None)
    resources = dict(getattr(state, "total_resources", None) or {})
    return {**(code() if code else {}), "host": socket.gethostname(), "resources": resources}


class DaskExecutor:
    """Jobs as tasks on a Dask distributed cluster (``address``: its scheduler, e.g.
    ``tcp://127.0.0.1:8786``).

    * **Slots now, and more as workers join.** As many tasks are in flight as the usable
      workers have threads at that moment; the driver looks again whenever a task ends and
      every ``poll`` seconds, so a worker joining after the start (dask-jobqueue, adaptive
      scaling) gets runs at once, and :meth:`stop` leaves nothing queued.
    * **Workers lost.** A worker lost mid-task is survived by Dask itself (the scheduler runs
      the task again on another worker; one result) and :attr:`note` is told; a task Dask gives
      up on (``KilledWorker``) is submitted again up to ``retries`` times, then yielded as
      ``"lost"``. Every outcome carries its attempts and the workers they ran on (each
      attempt's start is an ``eada-start`` event of the worker).
    * **A bad node is avoided.** A job that fails for its worker's sake
      (:class:`WorkerEnvironmentError`: its data are not there; eada or a plugin cannot be
      imported there) is submitted again, restricted to the other workers, and that worker
      gets no more jobs of the same :attr:`Job.group` (of any group when the job could not
      even be unpickled there);
      :attr:`avoided` lists them for the summary.
    * **One code.** Every worker's eada version and git commit (``code``, a module-level
      function run on each worker and here, e.g. :func:`eada.runs.code_identity`) are
      compared with this process's: a worker with other code present at the start is an
      :class:`ExecutorError` naming it, one joining later gets no jobs; with
      ``allow_mixed_code`` both are used and listed in :attr:`mixed`.
    * **Interrupted.** When the run ends early (a second Ctrl-C) the tasks in flight are
      cancelled; a job checks :func:`task_cancelled` between epochs, so its worker is free
      again within an epoch.

    A job with ``gpu=True`` asks for one ``GPU`` resource where the workers declare one
    (``dask worker --resources GPU=1``, dask-cuda). ``wait_workers``: seconds to wait for a
    first worker when there is none yet (``None``: fail at once).
    """

    name = "dask"

    def __init__(
        self,
        address: str,
        retries: int = 0,
        timeout: float = 30.0,
        *,
        allow_mixed_code: bool = False,
        wait_workers: float | None = None,
        poll: float = 0.5,
        note: Callable[[str], None] | None = None,
        code: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.address = address
        self.retries = retries
        self.timeout = timeout
        self.allow_mixed_code = allow_mixed_code
        self.wait_workers = wait_workers
        self.poll = poll
        self.note = note
        self.code = code
        self._stopped = False
        self.workers: list[str] = []
        self.avoided: list[dict[str, Any]] = []
        self.mixed: dict[str, dict[str, Any]] = {}
        self.refused: dict[str, list[str]] = {}
        self.lost: list[str] = []

    def stop(self) -> None:
        """Submit no more tasks; the running ones end."""
        self._stopped = True

    def _say(self, line: str) -> None:
        if self.note is not None:
            self.note(line)

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """Submit ``jobs`` to the cluster; yield each outcome as it finishes."""
        try:
            from distributed import Client
        except ImportError as err:  # pragma: no cover - the cluster extra is not installed
            raise ExecutorError(
                "--dask needs the distributed package: pip install 'eada[cluster]'"
            ) from err
        import pickle
        from queue import Empty, SimpleQueue

        from distributed.scheduler import KilledWorker

        if not jobs:
            return
        try:
            client = Client(self.address, timeout=self.timeout, set_as_default=False)
        except OSError as err:
            raise ExecutorError(f"--dask {self.address}: no scheduler answered ({err})") from err
        inflight: dict[Any, tuple[Job, float, Any]] = {}
        try:
            mine = self.code() if self.code else {}
            codes: dict[str, dict[str, Any]] = {}
            banned: dict[str, set[str]] = {"*": set()}
            starts: dict[str, list[str]] = {}
            known: dict[str, int] = {}
            env_failed: dict[str, dict[str, Any]] = {}

            def on_start(event: Any) -> None:  # on the client's event loop
                msg = event[1]
                starts.setdefault(msg["key"], []).append(msg["worker"])

            client.subscribe_topic("eada-start", on_start)

            def refresh(first: bool = False) -> dict[str, int]:
                nthreads = dict(client.nthreads())
                new = [a for a in nthreads if a not in codes]
                got = (
                    client.run(_worker_code, self.code, workers=new, on_error="return")
                    if new
                    else {}
                )
                for a in new:
                    c = got.get(a)
                    if not isinstance(c, dict):  # it left before answering
                        nthreads.pop(a, None)
                        continue
                    codes[a] = c
                    diff = code_differences(mine, c)
                    who = f"worker {a} (host {c['host']})"
                    if diff and self.allow_mixed_code:
                        self.mixed[a] = c
                        self._say(f"{who} runs other code ({', '.join(diff)}): used, recorded")
                    elif diff and first:
                        raise ExecutorError(
                            f"{who} runs other code than this driver ({', '.join(diff)}): "
                            "install the same eada there, or pass --allow-mixed-code"
                        )
                    elif diff:
                        banned["*"].add(a)
                        self.refused[a] = diff
                        self._say(f"{who} joined with other code ({', '.join(diff)}): no runs")
                    elif not first:
                        self._say(f"{who} joined: {nthreads[a]} more slot(s)")
                for a in [a for a in known if a not in nthreads]:
                    self.lost.append(a)
                    hit = [j.label or j.key for j, _, _ in inflight.values()
                           if starts.get(j.key, [None])[-1] == a]  # fmt: skip
                    host = codes.get(a, {}).get("host", "?")
                    self._say(
                        f"worker {a} (host {host}) lost"
                        + (f" while running {'; '.join(hit)}: Dask runs it again" if hit else "")
                    )
                known.clear()
                known.update(nthreads)
                self.workers = sorted(nthreads)
                return nthreads

            if not client.nthreads() and self.wait_workers:
                self._say(f"waiting up to {self.wait_workers:.0f} s for a first Dask worker")
                try:
                    client.wait_for_workers(1, timeout=self.wait_workers)
                except TimeoutError as err:
                    raise ExecutorError(
                        f"--dask {self.address}: no worker joined in {self.wait_workers:.0f} s"
                    ) from err
            nthreads = refresh(first=True)
            queue = deque(jobs)
            attempts: dict[str, int] = {}
            finished: SimpleQueue[Any] = SimpleQueue()  # futures as they end

            def allowed(job: Job) -> list[str] | None:
                bad = banned["*"] | banned.get(job.group, set())
                return None if not bad else [a for a in nthreads if a not in bad]

            def lost_or_failed(job: Job, submitted: float) -> Outcome | None:
                """The outcome of a job no usable worker is left for (else ``None``)."""
                res = env_failed.get(job.key)
                if res is None:
                    return Outcome(
                        job, "failed", error="no worker with this driver's code to run it",
                        error_type="NoWorker", submitted=submitted, finished=time.time(),
                        attempts=attempts.get(job.key, 0), tried_on=starts.get(job.key, []),
                    )  # fmt: skip
                out = _outcome(job, res, submitted, attempts[job.key], starts.get(job.key, []))
                out.error = f"{out.error}; no other worker to run it"
                return out

            while True:
                slots = sum(n for a, n in nthreads.items() if a not in banned["*"])
                while queue and len(inflight) < slots and not self._stopped:
                    job = queue.popleft()
                    where = allowed(job)
                    if where is not None and not where:
                        dead = lost_or_failed(job, time.time())
                        if dead is not None:
                            yield dead
                        continue
                    attempts[job.key] = attempts.get(job.key, 0) + 1
                    blob = pickle.dumps((job.fn, job.args))
                    fut = client.submit(
                        call_pickled, blob, job.key, pure=False,
                        resources=task_resources(job, codes),
                        workers=where, allow_other_workers=False,
                    )  # fmt: skip
                    inflight[fut.key] = (job, time.time(), fut)
                    fut.add_done_callback(finished.put)
                if not inflight:
                    if not queue or self._stopped:
                        return
                    time.sleep(self.poll)  # no usable slot now: wait for a worker
                    nthreads = refresh()
                    continue
                try:
                    ended = [finished.get(timeout=self.poll)]
                    while not finished.empty():
                        ended.append(finished.get_nowait())
                except Empty:
                    ended = []
                for fut in ended:
                    job, submitted, _ = inflight.pop(fut.key)
                    tried = starts.get(job.key, [])
                    n = max(attempts[job.key], len(tried))
                    try:
                        res = fut.result()
                    except KilledWorker as err:
                        if attempts[job.key] <= self.retries:
                            queue.appendleft(job)
                        else:
                            yield Outcome(
                                job, "lost", error=f"Dask gave the task up: {err}",
                                error_type="KilledWorker", submitted=submitted,
                                finished=time.time(), attempts=n, tried_on=tried,
                            )  # fmt: skip
                    except Exception as err:  # the task never ran its function
                        yield Outcome(
                            job, "failed", error=str(err) or type(err).__name__,
                            error_type=type(err).__name__, submitted=submitted,
                            finished=time.time(), attempts=n, tried_on=tried,
                        )  # fmt: skip
                    else:
                        if not res["ok"] and res.get("environment"):
                            w = res["worker"]
                            group = "*" if res.get("any_group") else job.group
                            banned.setdefault(group, set()).add(w["address"])
                            self.avoided.append(
                                {"worker": w["address"], "host": w["host"],
                                 "group": job.group if group != "*" else "*",
                                 "error": res["error"]}
                            )  # fmt: skip
                            self._say(
                                f"worker {w['address']} (host {w['host']}) cannot run "
                                f"{job.label or job.key}: {res['error']}; it gets no more runs"
                                + (" of that data set" if group != "*" else "")
                            )
                            env_failed[job.key] = res
                            queue.appendleft(job)  # elsewhere (or failed when nowhere)
                        else:
                            yield _outcome(job, res, submitted, n, tried)
                    fut.release()
                nthreads = refresh()
        finally:
            if inflight:  # interrupted: free the workers (a job stops at its next epoch)
                try:
                    client.cancel([f for _, _, f in inflight.values()], force=True)
                except Exception:  # the client may be gone already
                    pass
            client.close()


@dataclass
class SlurmOptions:
    """The Slurm jobs of ``eada bench --slurm`` (each job: one Dask worker).

    Attributes:
        partition: ``sbatch -p`` (``None``: the site's default).
        account: ``sbatch -A``.
        gpus: GPUs a job (``--gres=gpu:N``; the worker declares ``GPU=N``, one GPU run at a
            time a GPU).
        cpus: CPU cores a job (``--cpus-per-task``); the worker runs ``max(1, gpus)`` runs at
            a time, each with ``cpus // runs`` threads.
        memory: memory a job, e.g. ``"32GB"``.
        walltime: ``sbatch -t``, e.g. ``"04:00:00"``.
        jobs: jobs started at once (``cluster.scale(jobs=N)``).
        adapt: ``(min, max)`` jobs for Dask's adaptive scaling instead of a fixed count.
        interface: the network interface the scheduler (in this process) and the workers
            listen on (e.g. ``ib0``; ``lo`` on one machine); ``None``: dask-jobqueue's default.
        wait: seconds to wait for the first worker (a job still queued).
        python: the worker's Python (default: this one's, for a shared file system).
        prologue: shell lines a job runs before its worker (``module load ...``).
    """

    partition: str | None = None
    account: str | None = None
    gpus: int = 0
    cpus: int = 1
    memory: str = "8GB"
    walltime: str = "01:00:00"
    jobs: int = 1
    adapt: tuple[int, int] | None = None
    interface: str | None = None
    wait: float = 3600.0
    python: str | None = None
    prologue: tuple[str, ...] = ()

    def check(self) -> None:
        """Raise :class:`ExecutorError` for a count that cannot be."""
        if self.gpus < 0 or self.cpus < 1 or self.jobs < 1:
            raise ExecutorError(
                f"--slurm-gpus {self.gpus}, --slurm-cpus {self.cpus}, --slurm-jobs {self.jobs}: "
                "give GPUs >= 0, CPUs >= 1, jobs >= 1"
            )
        if self.adapt is not None and not 0 <= self.adapt[0] <= self.adapt[1]:
            raise ExecutorError(f"--slurm-adapt {self.adapt[0]}:{self.adapt[1]}: need MIN <= MAX")


def parse_adapt(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` -> ``(min, max)`` (``--slurm-adapt 0:16``).

    >>> parse_adapt("1:8")
    (1, 8)
    """
    lo, sep, hi = text.partition(":")
    try:
        out = (int(lo), int(hi))
    except ValueError:
        out = (-1, -1)
    if not sep or not 0 <= out[0] <= out[1] or out[1] < 1:
        raise ExecutorError(f"--slurm-adapt {text!r}: give MIN:MAX jobs, e.g. 0:16")
    return out


def slurm_cluster(opts: SlurmOptions) -> Any:
    """A dask-jobqueue ``SLURMCluster`` of ``opts`` (its scheduler in this process), its jobs
    submitted (``scale`` or ``adapt``). ``cluster.close()`` cancels them (``scancel``).

    The scheduler's HTTP server (dashboard, metrics) listens on 127.0.0.1 only, the workers
    open no dashboard, and Dask's sampling profiler is off on them (:data:`WORKER_ENV`).

    Raises:
        ExecutorError: dask-jobqueue is not installed, or a count that cannot be.
    """
    opts.check()
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as err:  # pragma: no cover - the cluster extra is not installed
        raise ExecutorError("--slurm needs dask-jobqueue: pip install 'eada[cluster]'") from err
    runs = max(1, opts.gpus)
    threads = max(1, opts.cpus // runs)
    prologue = [
        *opts.prologue,
        *(f"export {k}={v}" for k, v in WORKER_ENV.items()),
        *(f"export {k}={threads}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")),
    ]
    extra = ["--no-dashboard"]
    if opts.gpus:
        extra += ["--resources", f"GPU={opts.gpus}"]
    cluster = SLURMCluster(
        queue=opts.partition,
        account=opts.account,
        cores=runs,
        job_cpu=opts.cpus,
        processes=1,
        memory=opts.memory,
        walltime=opts.walltime,
        interface=opts.interface,
        python=opts.python or sys.executable,
        job_extra_directives=[f"--gres=gpu:{opts.gpus}"] if opts.gpus else [],
        worker_extra_args=extra,
        job_script_prologue=prologue,
        scheduler_options={"dashboard_address": "127.0.0.1:0", "dashboard": False},
        silence_logs="error",
    )
    try:
        if opts.adapt is not None:
            cluster.adapt(minimum_jobs=opts.adapt[0], maximum_jobs=opts.adapt[1])
        else:
            cluster.scale(jobs=opts.jobs)
    except BaseException:
        cluster.close()
        raise
    return cluster


#: what the workers of :class:`LoopbackCluster` (and of ``--slurm``) get in their environment:
#: no daemonic task threads, and Dask's sampling profiler off (it samples every thread's stack
#: every 10 ms: a quarter of a core a worker on a busy machine, for a flame graph no grid needs;
#: a lab's own workers: ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``)
WORKER_ENV = {
    "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
}


class LoopbackCluster:
    """A Dask cluster on this machine for tests and benchmarks: ``dask scheduler`` and
    ``workers`` x ``dask worker --no-nanny`` as separate processes, every port on 127.0.0.1
    (free ports chosen by the system, no dashboard, Dask's sampling profiler off: see
    :data:`WORKER_ENV`), stopped by their process ids. ``preload``: modules each worker imports
    before it joins (``dask worker --preload``), so the first task does not pay for them.
    ``worker_folders``: each worker's working folder (default: this process's), as workers on
    other machines start where their user is. :meth:`add_worker` starts one more later.

    Example::

        with LoopbackCluster(2) as cluster:
            run_grid(runs, out, executor=DaskExecutor(cluster.address))

    Attributes:
        address: the scheduler's address (``tcp://127.0.0.1:PORT``).
        workers: worker address -> its ``subprocess.Popen``.
    """

    def __init__(
        self,
        workers: int = 2,
        threads: int = 1,
        folder: str | None = None,
        timeout: float = 120,
        preload: Sequence[str] = (),
        worker_folders: Sequence[str] | None = None,
    ) -> None:
        self.n_workers, self.threads, self.timeout = workers, threads, timeout
        self.preload = tuple(preload)
        self.folder = folder
        self.worker_folders = list(worker_folders or [])
        self.address = ""
        self.scheduler: Any = None
        self.workers: dict[str, Any] = {}
        self._procs: list[Any] = []
        self._env: dict[str, str] = {}
        self._count = 0
        self._own_folder = False

    def start(self) -> LoopbackCluster:
        """Start the scheduler and the workers; return when every worker has joined."""
        import json
        import subprocess
        import tempfile

        self._own_folder = self.folder is None
        folder = self.folder or tempfile.mkdtemp(prefix="eada-dask-")
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        sched_file = os.path.join(folder, "scheduler.json")
        self._env = env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            "OPENBLAS_NUM_THREADS": str(self.threads),
            **WORKER_ENV,
        }
        dask = [sys.executable, "-m", "dask", "scheduler"]  # the `dask scheduler` command
        log = open(os.path.join(folder, "scheduler.log"), "wb")
        self.scheduler = subprocess.Popen(
            [*dask, "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", sched_file],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
        )  # fmt: skip
        self._procs.append((self.scheduler, log))
        deadline = time.time() + self.timeout
        while not os.path.exists(sched_file):
            if self.scheduler.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"dask scheduler did not start (see {folder}/scheduler.log)")
            time.sleep(0.05)
        time.sleep(0.05)
        self.address = json.loads(open(sched_file).read())["address"]
        procs = [
            self._spawn(self.worker_folders[i] if i < len(self.worker_folders) else None)
            for i in range(self.n_workers)
        ]
        try:
            self._register(procs)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, cwd: str | None, env: dict[str, str] | None = None) -> Any:
        import subprocess

        assert self.folder is not None
        i = self._count
        self._count += 1
        wlog = open(os.path.join(self.folder, f"worker{i}.log"), "wb")
        p = subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", self.address, "--host", "127.0.0.1",
             "--no-nanny", "--nthreads", str(self.threads), "--no-dashboard",
             "--memory-limit", "0", "--name", f"w{i}",
             *(a for m in self.preload for a in ("--preload", m))],
            env={**self._env, **(env or {})}, stdout=wlog, stderr=subprocess.STDOUT,
            cwd=cwd or os.getcwd(),
        )  # fmt: skip
        self._procs.append((p, wlog))
        return p

    def _register(self, procs: list[Any]) -> list[str]:
        """Wait until each of ``procs`` has joined the scheduler; their addresses."""
        from distributed import Client

        deadline = time.time() + self.timeout
        with Client(self.address, timeout=self.timeout, set_as_default=False) as client:
            while True:
                info = client.scheduler_info(n_workers=-1)["workers"]
                pids = {w.get("pid"): addr for addr, w in info.items()}
                if not all(p.pid in pids for p in procs) and info:  # not in the info: ask
                    pids = {v: k for k, v in client.run(os.getpid, on_error="ignore").items()}
                if all(p.pid in pids for p in procs):
                    break
                dead = [p for p in procs if p.poll() is not None]
                if dead or time.time() > deadline:
                    logs = f"{self.folder}/worker*.log"
                    raise RuntimeError(
                        f"a dask worker did not join in {self.timeout:.0f} s (see {logs}; "
                        f"exit codes {[p.poll() for p in procs]})"
                    )
                time.sleep(0.05)
        added = [pids[p.pid] for p in procs]
        self.workers.update(zip(added, procs, strict=True))
        return added

    def add_worker(self, folder: str | None = None, env: dict[str, str] | None = None) -> str:
        """Start one more worker (in ``folder``, with ``env`` added to its environment); its
        address once it has joined."""
        proc = self._spawn(folder, env)
        return self._register([proc])[0]

    def kill_worker(self, address: str) -> None:
        """SIGKILL one worker (a worker lost mid-run)."""
        proc = self.workers.pop(address)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """Stop every process this cluster started, by its id (workers first)."""
        import shutil
        import subprocess

        for proc, log in reversed(self._procs):  # workers hold nothing to save: SIGKILL
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM if proc is self.scheduler else signal.SIGKILL)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
            log.close()
        self._procs.clear()
        if self._own_folder and self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LoopbackCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
