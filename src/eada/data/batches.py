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
