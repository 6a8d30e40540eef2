"""Read given batches of sample indices from any domain.

A :class:`~eada.data.base.TensorDomain` is sliced directly (the fast in-memory path). Any other
``Dataset`` (e.g. :class:`~eada.data.images.ImageDomain`) is read through a ``DataLoader`` whose
batch sampler is exactly the given list of index batches, so the trainer keeps full control of
the order while decoding and augmentation run in ``domain.workers`` worker processes (pinned
memory when ``domain.pin_memory``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from eada.data.base import TensorDomain


def iterate_inputs(domain: Any, batches: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The inputs of ``domain[b]`` for every ``b`` in ``batches``, in order.

    >>> d = TensorDomain("d", torch.arange(6.0).view(6, 1), torch.zeros(6))
    >>> [x.flatten().tolist() for x in iterate_inputs(d, [torch.tensor([4, 1])])]
    [[4.0, 1.0]]
    """
    if isinstance(domain, TensorDomain):
        for b in batches:
            yield domain.x[b]
        return
    if not batches:
        return
    loader = DataLoader(
        domain,
        batch_sampler=[b.tolist() for b in batches],
        num_workers=int(getattr(domain, "workers", 0)),
        pin_memory=bool(getattr(domain, "pin_memory", False)),
    )
    for x, _ in loader:
        yield x


def chunks(indices: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``indices`` cut into consecutive batches of at most ``batch_size``."""
    return [indices[s : s + batch_size] for s in range(0, len(indices), batch_size)]
