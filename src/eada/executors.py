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


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn(*args)`` returns a JSON-able dict.

    Attributes:
        key: the job's identity (unique within one :meth:`Executor.run`).
        fn: a module-level function (pickled by reference for worker processes and Dask).
        args: its arguments (picklable).
        label: a short human-readable name for progress lines.
        gpu: the job wants a GPU (Dask: ask for a ``GPU`` resource where workers declare one).
    """

    key: str
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...] = ()
    label: str = ""
    gpu: bool = False


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
        attempts: how many times it was started (``> 1`` after a lost worker).
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


def call_job(fn: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> dict[str, Any]:
    """Run ``fn(*args)`` on a worker; the result or the error as a plain dict, never raising
    for an ``Exception`` (``KeyboardInterrupt`` and ``SystemExit`` pass). An ``OSError`` (a
    data file missing on this worker) names the worker in its message."""
    started = time.time()
    info = worker_info()
    try:
        value = fn(*args)
    except Exception as err:  # the job failed: reported, never retried
        lines = traceback.format_exc().rstrip().splitlines()
        msg = str(err) or type(err).__name__
        if isinstance(err, OSError):
            msg += f" (on worker {info['address']}, host {info['host']})"
        return {
            "ok": False,
            "error": msg,
            "error_type": type(err).__name__,
            "traceback": "\n".join(lines[-TRACEBACK_LINES:]),
            "worker": info,
            "started": started,
            "finished": time.time(),
        }
    return {"ok": True, "value": value, "worker": info, "started": started, "finished": time.time()}


def call_pickled(blob: bytes) -> dict[str, Any]:
    """:func:`call_job` of a pickled ``(fn, args)``: a Dask task is this function (which
    imports nothing heavy) and bytes, so the scheduler, which unpickles every task it is given,
    never imports torch or the job's modules (a first task once waited ~10 s for that)."""
    import pickle

    fn, args = pickle.loads(blob)
    return call_job(fn, args)


def _outcome(job: Job, res: dict[str, Any], submitted: float, attempts: int) -> Outcome:
    if res["ok"]:
        return Outcome(
            job, "ok", value=res["value"], worker=res["worker"], submitted=submitted,
            started=res["started"], finished=time.time(), attempts=attempts,
        )  # fmt: skip
    return Outcome(
        job, "failed", error=res["error"], error_type=res["error_type"],
        traceback=res["traceback"], worker=res["worker"], submitted=submitted,
        started=res["started"], finished=time.time(), attempts=attempts,
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
            yield _outcome(job, call_job(job.fn, job.args), submitted, 1)


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
        ExecutorError: ``devices`` names a GPU that is not visible, or more workers than
            ``len(devices) x runs_per_device``.
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

    set_threads(threads)
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
                        yield _outcome(job, res, slot.submitted, attempts[job.key])
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
                                attempts=attempts[job.key],
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


class DaskExecutor:
    """Jobs as tasks on an existing Dask distributed cluster (``address``: its scheduler,
    e.g. ``tcp://127.0.0.1:8786``). At most as many tasks are submitted as the workers have
    threads, so a task starts when it is submitted (and :meth:`stop` leaves nothing queued).
    Results come back to this process. A worker lost mid-task is survived by Dask itself (the
    scheduler reschedules the task on another worker; one result); a task Dask gives up on
    (``KilledWorker``) is submitted again up to ``retries`` times, then yielded as ``"lost"``.
    A job with ``gpu=True`` asks for one ``GPU`` resource where the workers declare one
    (``dask worker --resources GPU=1``, dask-cuda)."""

    name = "dask"

    def __init__(self, address: str, retries: int = 0, timeout: float = 30.0) -> None:
        self.address = address
        self.retries = retries
        self.timeout = timeout
        self._stopped = False
        self.workers: list[str] = []

    def stop(self) -> None:
        """Submit no more tasks; the running ones end."""
        self._stopped = True

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        """Submit ``jobs`` to the cluster; yield each outcome as it finishes."""
        try:
            from distributed import Client, as_completed
        except ImportError as err:  # pragma: no cover - the cluster extra is not installed
            raise ExecutorError(
                "--dask needs the distributed package: pip install 'eada[cluster]'"
            ) from err
        import pickle

        from distributed.scheduler import KilledWorker

        if not jobs:
            return
        try:
            client = Client(self.address, timeout=self.timeout, set_as_default=False)
        except OSError as err:
            raise ExecutorError(f"--dask {self.address}: no scheduler answered ({err})") from err
        try:
            info = client.scheduler_info()
            self.workers = sorted(info.get("workers", {}))
            workers = info.get("workers", {})
            slots = max(1, sum(client.nthreads().values()))
            queue = deque(jobs)
            attempts: dict[str, int] = {}
            inflight: dict[Any, tuple[Job, float]] = {}
            done = as_completed(loop=client.loop)

            def submit_more() -> None:
                while queue and len(inflight) < slots and not self._stopped:
                    job = queue.popleft()
                    attempts[job.key] = attempts.get(job.key, 0) + 1
                    resources = task_resources(job, workers)
                    blob = pickle.dumps((job.fn, job.args))
                    fut = client.submit(call_pickled, blob, pure=False, resources=resources)
                    inflight[fut.key] = (job, time.time())
                    done.add(fut)

            submit_more()
            for fut in done:
                job, submitted = inflight.pop(fut.key)
                try:
                    res = fut.result()
                except KilledWorker as err:
                    if attempts[job.key] <= self.retries:
                        queue.appendleft(job)
                    else:
                        yield Outcome(
                            job, "lost", error=f"Dask gave the task up: {err}",
                            error_type="KilledWorker", submitted=submitted,
                            finished=time.time(), attempts=attempts[job.key],
                        )  # fmt: skip
                except Exception as err:  # the task never ran its function (e.g. unpickling)
                    yield Outcome(
                        job, "failed", error=str(err) or type(err).__name__,
                        error_type=type(err).__name__, submitted=submitted,
                        finished=time.time(), attempts=attempts[job.key],
                    )  # fmt: skip
                else:
                    yield _outcome(job, res, submitted, attempts[job.key])
                fut.release()
                submit_more()
        finally:
            client.close()


class LoopbackCluster:
    """A Dask cluster on this machine for tests and benchmarks: ``dask scheduler`` and
    ``workers`` x ``dask worker --no-nanny`` as separate processes, every port on 127.0.0.1
    (free ports chosen by the system, no dashboard), stopped by their process ids.
    ``preload``: modules each worker imports before it joins (``dask worker --preload``), so
    the first task does not pay for them.

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
    ) -> None:
        self.n_workers, self.threads, self.timeout = workers, threads, timeout
        self.preload = tuple(preload)
        self.folder = folder
        self.address = ""
        self.scheduler: Any = None
        self.workers: dict[str, Any] = {}
        self._procs: list[Any] = []

    def start(self) -> LoopbackCluster:
        """Start the scheduler and the workers; return when every worker has joined."""
        import json
        import subprocess
        import tempfile

        folder = self.folder or tempfile.mkdtemp(prefix="eada-dask-")
        os.makedirs(folder, exist_ok=True)
        self._tmp = None if self.folder else folder
        sched_file = os.path.join(folder, "scheduler.json")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            "OPENBLAS_NUM_THREADS": str(self.threads),
            "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
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
        worker = [sys.executable, "-m", "dask", "worker"]
        procs = []
        for i in range(self.n_workers):
            wlog = open(os.path.join(folder, f"worker{i}.log"), "wb")
            p = subprocess.Popen(
                [*worker, self.address, "--host", "127.0.0.1", "--no-nanny", "--nthreads",
                 str(self.threads), "--no-dashboard", "--memory-limit", "0",
                 "--name", f"w{i}", *(a for m in self.preload for a in ("--preload", m))],
                env=env, stdout=wlog, stderr=subprocess.STDOUT, cwd=os.getcwd(),
            )  # fmt: skip
            self._procs.append((p, wlog))
            procs.append(p)
        from distributed import Client

        with Client(self.address, timeout=self.timeout, set_as_default=False) as client:
            client.wait_for_workers(self.n_workers, timeout=self.timeout)
            info = client.scheduler_info()["workers"]
            pids = {w["pid"]: addr for addr, w in info.items() if "pid" in w}
            if len(pids) != self.n_workers:  # older schedulers: ask the workers
                pids = {v: k for k, v in client.run(os.getpid).items()}
        self.workers = {pids[p.pid]: p for p in procs}
        return self

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
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    def __enter__(self) -> LoopbackCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
