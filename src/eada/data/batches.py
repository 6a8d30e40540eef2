"""Read given batches of sample indices from any domain.

A :class:`~eada.data.base.TensorDomain` is sliced directly (the fast in-memory path). Any other
``Dataset`` (e.g. :class:`~eada.data.images.ImageDomain`) is read through a ``DataLoader`` whose
batch sampler is exactly the given list of index batches, so the trainer keeps full control of
the order while decoding and augmentation run in ``domain.workers`` worker processes (pinned
memory when ``domain.pin_memory``).
"""

from __future__ import annotations

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
    ``Dataset`` returns second, e.g. :class:`~eada.data.images.DecodeChecked`'s reasons)."""
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
    loader = DataLoader(
        domain,
        batch_sampler=[b.tolist() for b in batches],
        num_workers=int(getattr(domain, "workers", 0)),
        pin_memory=bool(getattr(domain, "pin_memory", False)),
    )
    for i, (x, second) in enumerate(loader):
        yield x, second
        if on_batch is not None:
            on_batch(i + 1, total)


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
