"""Read given batches of sample indices from any domain.

A :class:`~eada.data.base.TensorDomain` is sliced directly (the fast in-memory path). Any other
``Dataset`` (e.g. :class:`~eada.data.datasets.ImageDomain`) is read through a ``DataLoader`` whose
batch sampler is exactly the given list of index batches, so the trainer keeps full control of
the order while decoding and augmentation run in ``domain.workers`` worker processes (pinned
memory when ``domain.pin_memory``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch.utils.data import DataLoader

from eada.data.base import TensorDomain

BatchCallback = Callable[[int, int], None]
_ON_BATCH: ContextVar[BatchCallback | None] = ContextVar("eada_on_batch", default=None)


@contextmanager
def report_batches(callback: BatchCallback) -> Iterator[None]:
    """Within the block, every :func:`iterate_inputs` pass calls ``callback(done, total)``
    after each batch (progress bars for scoring, evaluation and feature extraction).

    >>> seen = []
    >>> d = TensorDomain("d", torch.zeros(5, 1), torch.zeros(5))
    >>> with report_batches(lambda done, total: seen.append((done, total))):
    ...     _ = list(iterate_inputs(d, chunks(torch.arange(5), 2)))
    >>> seen
    [(1, 3), (2, 3), (3, 3)]
    """
    token = _ON_BATCH.set(callback)
    try:
        yield
    finally:
        _ON_BATCH.reset(token)


def iterate_inputs(domain: Any, batches: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The inputs of ``domain[b]`` for every ``b`` in ``batches``, in order.

    >>> d = TensorDomain("d", torch.arange(6.0).view(6, 1), torch.zeros(6))
    >>> [x.flatten().tolist() for x in iterate_inputs(d, [torch.tensor([4, 1])])]
    [[4.0, 1.0]]
    """
    for x, _ in iterate_items(domain, batches):
        yield x


def iterate_items(domain: Any, batches: Sequence[torch.Tensor]) -> Iterator[tuple[Any, Any]]:
    """:func:`iterate_inputs` with each batch's second field: ``(inputs, labels)`` (or what a
    ``Dataset`` returns second, e.g. :class:`~eada.data.datasets.DecodeChecked`'s reasons).

    An image domain with a decode cache (:mod:`eada.data.decoded`) is read from it, the random
    part of its view applied per batch on ``domain.device`` (no worker process at all). Any
    other ``Dataset`` is read through a ``DataLoader`` whose batch sampler is exactly
    ``batches``; with ``domain.persistent_workers`` (image domains: ``data.persistent_workers``,
    on by default) ONE loader per dataset and view serves every call (:class:`LoaderPool`):
    its ``domain.workers`` processes live as long as the domain, across passes, epochs, rounds,
    evaluations. Every call draws one integer from torch's global generator, as a new
    ``DataLoader`` iterator draws its base seed, so a run's random stream (dropout, stochastic
    depth) does not depend on which path read its images; the cached path seeds the view's
    random crops, flips and jitter from it.
    """
    on_batch = _ON_BATCH.get()
    total = len(batches)
    if isinstance(domain, TensorDomain):
        for i, b in enumerate(batches):
            yield domain.x[b], domain.y[b]
            if on_batch is not None:
                on_batch(i + 1, total)
        return
    if not batches:
        return
    if getattr(domain, "decode_cache", None) is not None:
        items: Iterator[tuple[Any, Any]] = _cached_items(domain, batches)
    elif getattr(domain, "persistent_workers", False) and int(getattr(domain, "workers", 0)) > 0:
        items = LOADERS.read(domain, batches)
    else:
        items = iter(
            DataLoader(
                domain,
                batch_sampler=[b.tolist() for b in batches],
                num_workers=int(getattr(domain, "workers", 0)),
                pin_memory=bool(getattr(domain, "pin_memory", False)),
            )
        )
    for i, (x, second) in enumerate(items):
        yield x, second
        if on_batch is not None:
            on_batch(i + 1, total)


#: Held while a reader thread works (torch ops, which may hold the allocator's or OpenMP's
#: locks): ``os.fork`` (a ``DataLoader`` starting its workers) waits for it, so no child
#: starts with a lock held by a thread it does not have.
_NO_FORK = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_NO_FORK.acquire,
        after_in_parent=_NO_FORK.release,
        after_in_child=_NO_FORK.release,
    )


def pass_seed() -> int:
    """One int64 from torch's global generator: what a new ``DataLoader`` iterator draws."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def _cached_items(domain: Any, batches: Sequence[torch.Tensor]) -> Iterator[tuple[Any, Any]]:
    """Batches of an image domain with a decode cache: the random part of the view drawn in
    batch order from a generator seeded by :func:`pass_seed`, the crops gathered (and pinned,
    for a GPU) by a thread up to ``domain.prefetch`` batches ahead, the rest of the view
    (:func:`~eada.data.transforms.batch_view`) on ``domain.device``."""
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    from eada.data.decoded import base_of, gather_crops
    from eada.data.transforms import batch_view, draw_batch_params

    gen = torch.Generator().manual_seed(pass_seed())
    cache, spec = domain.decode_cache, domain.spec
    kind = domain.kinds[domain.current]
    base = base_of(kind, spec)
    shapes = torch.from_numpy(cache.shapes[base])
    device = torch.device(getattr(domain, "device", "cpu"))
    cuda = device.type == "cuda"

    def gather(b: torch.Tensor, params: Any) -> torch.Tensor:
        with _NO_FORK:  # a process forked meanwhile (a DataLoader's workers) waits for it
            crops = torch.from_numpy(
                gather_crops(cache, base, b.tolist(), params.top, params.left, spec.crop)
            )
            if cuda:
                return crops.pin_memory()
            return batch_view(crops, params, domain.norm, device)  # in this thread on a CPU

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eada-batches")
    pending: deque[tuple[Future[torch.Tensor], Any, torch.Tensor]] = deque()
    todo = iter(batches)

    def submit() -> None:
        b = next(todo, None)
        if b is not None:
            params = draw_batch_params(kind, spec, shapes[b, 0], shapes[b, 1], gen)
            pending.append((pool.submit(gather, b, params), params, b))

    try:
        for _ in range(max(1, int(getattr(domain, "prefetch", 2)))):
            submit()
        while pending:
            fut, params, b = pending.popleft()
            submit()
            x = fut.result()
            if cuda:
                x = batch_view(x, params, domain.norm, device)
            yield x, domain.y[b]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Feed:
    """The batch sampler of a persistent loader: the batches of the current call."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _Loader:
    def __init__(self, domain: Any) -> None:
        self.feed = _Feed()
        workers = int(domain.workers)
        self.loader = DataLoader(
            domain,
            batch_sampler=self.feed,
            num_workers=workers,
            pin_memory=bool(getattr(domain, "pin_memory", False)),
            persistent_workers=True,
            prefetch_factor=max(1, int(getattr(domain, "prefetch", 2))),
        )
        self.busy = False
        self.calls = 0


class LoaderPool:
    """Persistent ``DataLoader`` s, one a dataset and view: each keeps its worker processes
    for the life of the dataset (closed when its image list is collected, or by
    :meth:`close`). A loader serves one pass at a time; a pass that starts while another of
    the same view is still being read gets a second loader (kept too), so the count grows
    with the passes read AT ONCE, never with the passes read one after another.
    ``pools_started`` counts the loaders (each one worker pool) made so far."""

    def __init__(self) -> None:
        self._loaders: dict[tuple[int, str], list[_Loader]] = {}
        self.pools_started = 0

    def read(self, domain: Any, batches: Sequence[torch.Tensor]) -> Iterator[tuple[Any, Any]]:
        """The items of ``batches`` of ``domain`` (its current view)."""
        import weakref

        images = getattr(domain, "images", domain)
        key = (id(images), str(getattr(domain, "current", "")))
        loaders = self._loaders.get(key)
        if loaders is None:
            loaders = self._loaders[key] = []
            weakref.finalize(images, self._drop, key)
        ld = next((x for x in loaders if not x.busy), None)
        if ld is None:
            ld = _Loader(domain)
            loaders.append(ld)
            self.pools_started += 1
        return self._run(ld, batches)

    @staticmethod
    def _run(ld: _Loader, batches: Sequence[torch.Tensor]) -> Iterator[tuple[Any, Any]]:
        ld.busy = True
        try:
            ld.feed.batches = [b.tolist() for b in batches]
            if ld.calls:  # a new iterator would draw its base seed: draw it as the first did
                pass_seed()
            ld.calls += 1
            n = len(batches)
            for i, item in enumerate(ld.loader):
                if i == n - 1:  # all read: free for the next pass before this one resumes
                    ld.busy = False
                yield item
        finally:
            ld.busy = False

    def _drop(self, key: tuple[int, str]) -> None:
        for ld in self._loaders.pop(key, []):
            ld.loader._iterator = None  # its __del__ shuts the workers down

    def close(self) -> None:
        """Shut every loader's workers down."""
        for key in list(self._loaders):
            self._drop(key)


#: The process's persistent loaders (:func:`iterate_items`).
LOADERS = LoaderPool()


def chunks(indices: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``indices`` cut into consecutive batches of at most ``batch_size``."""
    return [indices[s : s + batch_size] for s in range(0, len(indices), batch_size)]


def iterate_items_threaded(
    domain: Any,
    batches: Sequence[torch.Tensor],
    threads: int = 1,
    on_batch: BatchCallback | None = None,
    ahead: int = 2,
) -> Iterator[tuple[Any, Any]]:
    """:func:`iterate_items` with each sample read (an image decoded and transformed) in a pool
    of ``threads`` threads, up to ``ahead`` batches before the one the caller works on, so the
    main thread only collates and runs the model (PIL and torch release the GIL while they
    decode, resize and normalise). ``on_batch(done, total)`` after each batch. A
    :class:`~eada.data.base.TensorDomain` is sliced as by :func:`iterate_items`. An error of a
    sample's read is raised here, in batch order.

    >>> d = TensorDomain("d", torch.arange(6.0).view(6, 1), torch.zeros(6))
    >>> [x.flatten().tolist() for x, _ in iterate_items_threaded(d, chunks(torch.arange(5), 3))]
    [[0.0, 1.0, 2.0], [3.0, 4.0]]
    """
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    from torch.utils.data import default_collate

    total = len(batches)
    if isinstance(domain, TensorDomain):
        for i, b in enumerate(batches):
            yield domain.x[b], domain.y[b]
            if on_batch is not None:
                on_batch(i + 1, total)
        return
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="eada-decode")
    pending: deque[list[Future[Any]]] = deque()
    todo = iter(batches)

    def submit() -> None:
        b = next(todo, None)
        if b is not None:
            pending.append([pool.submit(domain.__getitem__, int(i)) for i in b])

    try:
        for _ in range(max(1, ahead)):
            submit()
        done = 0
        while pending:
            futures = pending.popleft()
            submit()
            x, second = default_collate([f.result() for f in futures])
            yield x, second
            done += 1
            if on_batch is not None:
                on_batch(done, total)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
