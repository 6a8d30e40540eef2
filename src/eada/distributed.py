"""Distributed pool scoring and selection on ``torch.distributed`` (gloo on CPU, nccl on GPU),
plus streaming scoring for pools too large to hold ``N x C`` outputs.

Why plain ``torch.distributed`` (launched by ``torchrun``) and not a trainer framework: the
core must not depend on one, DDP is what Lightning Fabric would wrap anyway, and the parts that
are specific to active learning (shard the pool, gather per-sample scores in pool order, select
ONCE, broadcast the choice) are collective calls that a framework does not provide.

Distributed training (``torchrun --nproc-per-node W -m eada.cli run CONFIG``): the CLI calls
:func:`setup`; :class:`eada.train.ActiveDATrainer` then wraps its step module in
``DistributedDataParallel``, shards the batches, evaluation and pool scoring, and selects on
rank 0 only (see :mod:`eada.train.loop`); rank 0 alone writes the run records.

Protocol of a distributed round (every rank calls the same functions):

1. :func:`shard` gives each rank a contiguous slice of the unlabeled pool;
2. each rank scores its slice (two floats a sample for EADA, see :func:`stream_scores`);
3. :func:`gather_rows` all-gathers the per-sample scores back into pool order;
4. rank 0 runs the strategy; :func:`broadcast_indices` sends the chosen positions to all ranks,
   so every rank holds the same labeled set.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch


def is_distributed() -> bool:
    """Whether a process group is initialised (never where ``torch.distributed`` was not even
    imported: asking imports no torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` without a process group."""
    import torch.distributed as dist

    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


class DeviceCountError(ValueError):
    """More ``torchrun`` processes on a machine than CUDA devices under ``nccl``."""


def check_nccl_devices() -> None:
    """Under ``nccl`` every process of a machine needs its own GPU: raise
    :class:`DeviceCountError`, naming both counts, when ``torchrun`` started more processes on
    this machine (``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``) than CUDA devices are visible."""
    import torch

    procs = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpus = torch.cuda.device_count()
    if procs > gpus:
        raise DeviceCountError(
            f"torchrun started {procs} processes on this machine but it has {gpus} CUDA "
            f"device(s); nccl needs one GPU a process: run --nproc-per-node {gpus} (or fewer), "
            "or train on the CPU with gloo (--set device=cpu)"
        )


def setup(backend: str | None = None, timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the process group described by ``torchrun``'s environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). ``backend`` defaults to ``nccl`` when CUDA
    is available, else ``gloo``. Returns ``(rank, world_size)``.

    Raises:
        DeviceCountError: ``nccl`` with more processes on this machine than GPUs
            (:func:`check_nccl_devices`), before joining the group."""
    import torch
    import torch.distributed as dist

    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f"distributed setup needs {', '.join(missing)} in the environment: launch with torchrun"
        )
    if not is_distributed():
        # DistributedDataParallel imports torch._dynamo; imported after the group exists, that
        # import keeps references to the group for the rest of the process (torch 2.14), so the
        # group's threads outlive destroy_process_group and may abort the interpreter's exit
        # ("terminate called without an active exception"). Imported first, it holds none.
        import torch._dynamo

        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            check_nccl_devices()
        if backend == "gloo" and os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
            # single node: keep gloo on the loopback device; otherwise it resolves the host name
            # to pick an interface, which stalls for seconds on machines without DNS
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return rank_world()


def backend_name() -> str:
    """The process group's backend (``gloo``/``nccl``), or ``none``."""
    import torch.distributed as dist

    return str(dist.get_backend()) if is_distributed() else "none"


#: The live objects that hold the process group (a trainer with a ``DistributedDataParallel``
#: wrapper), released by :func:`teardown`; weak, so a trainer that is gone is not kept for it.
_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def on_teardown(holder: Any) -> None:
    """Have :func:`teardown` call ``holder.release_group()`` if ``holder`` is still alive then:
    it must drop every reference ``holder`` keeps to the process group (e.g. unwrap a
    ``DistributedDataParallel``)."""
    if not callable(getattr(holder, "release_group", None)):
        raise TypeError(f"{type(holder).__name__} has no release_group() method")
    _HOLDERS.add(holder)


def teardown() -> None:
    """Wait for every rank, then leave the process group (no-op without one).

    First the objects registered with :func:`on_teardown` let go of the group (a trainer's DDP
    wrapper: :meth:`eada.train.ActiveDATrainer.release_group`) and garbage is collected, so
    that destroying the group really ends it and its threads: a group kept alive past this
    point keeps gloo's threads running into the interpreter's exit, which can abort it (exit
    code -6, "terminate called without an active exception") after a run that succeeded."""
    import torch.distributed as dist

    if is_distributed():
        for holder in list(_HOLDERS):
            holder.release_group()
        _HOLDERS.clear()
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def shard(n: int, rank: int, world: int) -> slice:
    """The contiguous slice of ``range(n)`` that ``rank`` scores (sizes differ by at most one)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"bad rank {rank} for world size {world}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def stream_scores(
    energy_chunks: Iterable[torch.Tensor], n: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Free energy and MvSM of a stream of ``(b, C)`` energy chunks, keeping two float32 a sample.

    The ``(N, C)`` outputs are never held: each chunk is reduced to ``F`` and ``U`` and dropped.
    Gives exactly the values :func:`eada.energy.free_energy` / :func:`eada.energy.mvsm` give on
    the concatenated energies (same float32 arithmetic per row). The stream is read without
    autograd.

    Args:
        energy_chunks: energies chunk by chunk, in pool order.
        n: the total number of rows when known (preallocates; otherwise the lists grow).
    """
    import torch

    with torch.no_grad():
        return _stream_scores(energy_chunks, n)


def _stream_scores(
    energy_chunks: Iterable[torch.Tensor], n: int | None
) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    from eada import energy as energy_ops

    if n is not None:
        f = np.empty(n, dtype=np.float32)
        u = np.empty(n, dtype=np.float32)
        pos = 0
        for e in energy_chunks:
            b = e.shape[0]
            if pos + b > n:
                raise ValueError(f"stream yielded more than the announced {n} rows")
            f[pos : pos + b] = energy_ops.free_energy(e.float()).numpy()
            u[pos : pos + b] = energy_ops.mvsm(e.float()).numpy()
            pos += b
        if pos != n:
            raise ValueError(f"stream yielded {pos} rows, announced {n}")
        return f, u
    fs, us = [], []
    for e in energy_chunks:
        fs.append(energy_ops.free_energy(e.float()).numpy())
        us.append(energy_ops.mvsm(e.float()).numpy())
    if not fs:
        return np.empty(0, np.float32), np.empty(0, np.float32)
    return np.concatenate(fs), np.concatenate(us)


def _device() -> torch.device:
    """Where the backend's tensors live: the current CUDA device for nccl, else the CPU."""
    import torch
    import torch.distributed as dist

    return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_rows(local: np.ndarray, n_total: int) -> np.ndarray:
    """All-gather each rank's contiguous shard (see :func:`shard`) of a per-sample array
    ``(n_r, ...)`` into pool order ``(n_total, ...)``; every rank gets the whole array.

    Keeps the dtype (float32 energies, int32 predictions, ...). Works with gloo and nccl: the
    shards are padded to the largest one and moved to the backend's device. Shapes and dtypes
    are exchanged first, so a rank with an empty shard still agrees with the others."""
    import numpy as np
    import torch
    import torch.distributed as dist

    rank, world = rank_world()
    local = np.ascontiguousarray(local)
    if world == 1:
        if len(local) != n_total:
            raise ValueError(f"local rows: {len(local)}, expected {n_total}")
        return local
    sizes = [shard(n_total, r, world).stop - shard(n_total, r, world).start for r in range(world)]
    if len(local) != sizes[rank]:
        raise ValueError(f"rank {rank} holds {len(local)} rows, its shard has {sizes[rank]}")
    metas: list[Any] = [None] * world
    dist.all_gather_object(metas, (local.shape[1:], local.dtype.str, len(local)))
    ref = next((m for m in metas if m[2] > 0), metas[0])
    trailing, dtype = tuple(ref[0]), np.dtype(ref[1])
    if any(m[2] > 0 and (tuple(m[0]), m[1]) != (trailing, ref[1]) for m in metas):
        raise ValueError(f"ranks disagree on the row shape or dtype: {metas}")
    if len(local) == 0:
        local = np.empty((0, *trailing), dtype=dtype)
    device = _device()
    buf = torch.zeros((max(sizes), *trailing), dtype=torch.from_numpy(local).dtype, device=device)
    buf[: len(local)] = torch.from_numpy(local).to(device)
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]).cpu().numpy()


def all_mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar tensor over all ranks (itself without a process group)."""
    import torch
    import torch.distributed as dist

    if not is_distributed():
        return value
    t = value.detach().reshape(1).to(_device(), torch.float64)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).to(value.device, value.dtype).reshape(value.shape)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Average the gradients of ``params`` over all ranks in place (for parameters outside the
    DDP-wrapped model, e.g. a baseline's domain discriminator). A parameter without a gradient
    counts as zero; every rank must pass the same parameters in the same order."""
    import torch
    import torch.distributed as dist

    if not is_distributed():
        return
    world = dist.get_world_size()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad.div_(world)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (``obj`` itself without a process group)."""
    import torch.distributed as dist

    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]


def sync_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s buffers (batch-norm running statistics) to every rank. DDP does this
    at the start of each training forward; call it before an eval-mode pass so that every rank
    scores its shard with the same statistics."""
    import torch.distributed as dist

    if not is_distributed():
        return
    device = _device()
    for b in module.buffers():
        t = b.data.to(device)
        dist.broadcast(t, src)
        if t.data_ptr() != b.data.data_ptr():
            b.data.copy_(t)


def launched_distributed() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def broadcast_indices(indices: np.ndarray | None, src: int = 0) -> np.ndarray:
    """Send rank ``src``'s selected positions to every rank (others pass ``None``)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    rank, world = rank_world()
    if world == 1:
        if indices is None:
            raise ValueError("single process: indices must be given")
        return np.asarray(indices, dtype=np.int64)
    device = _device()
    n = torch.tensor([len(indices) if rank == src and indices is not None else 0], device=device)
    dist.broadcast(n, src)
    buf = torch.empty(int(n.item()), dtype=torch.int64, device=device)
    if rank == src:
        if indices is None:
            raise ValueError(f"rank {src} must provide the indices to broadcast")
        buf.copy_(torch.from_numpy(np.asarray(indices, dtype=np.int64)))
    dist.broadcast(buf, src)
    return buf.cpu().numpy()
