"""The trainer's batch streams: endless shuffled batches of a domain's samples.

A :class:`BatchStream` per training stream (source, unlabeled target, labeled target) owns the
order of its samples (a seeded generator the streams share) and its position in the current pass,
so a checkpoint resumes it exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from eada import distributed as dist_ops
from eada.data.base import TensorDomain
from eada.data.batches import iterate_inputs
from eada.data.tasks import Domain


class BatchStream:
    """Endless shuffled batches of ``domain[indices]``; reshuffles after each pass.

    Full batches only (``drop_last``) when at least one full batch exists, otherwise the whole
    set as one batch; with ``drop_last=False`` a pass ends with its partial batch. A batch of
    one sample is duplicated (batch norm needs two). :meth:`restart` starts a new pass.
    A :class:`TensorDomain` is sliced in memory; any other dataset (image files) is read through
    a ``DataLoader`` over the pass's batches (``domain.workers`` processes, same order).

    With ``world > 1`` (distributed training) every rank shuffles with the same generator and
    takes its :func:`~eada.distributed.shard` of each global batch of ``world x batch_size``
    samples, so the ranks see disjoint samples; a global batch smaller than ``2 x world`` (a
    tiny labeled set) is used whole by every rank.
    """

    def __init__(
        self,
        domain: Domain,
        indices: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        labels: torch.Tensor | None = None,
        rank: int = 0,
        world: int = 1,
        drop_last: bool = True,
    ) -> None:
        self.domain = domain
        self.drop_last = drop_last
        self.labels = domain.y if labels is None else labels
        self.indices = indices
        self.batch_size = batch_size
        self.generator = generator
        self.rank, self.world = rank, world
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0
        self._loaded: tuple[torch.Tensor, int, Any] | None = None  # (order, next start, iter)

    def set_indices(self, indices: torch.Tensor) -> None:
        """Replace the sampled set (e.g. after a round); the next batch starts a new pass."""
        self.indices = indices
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def restart(self) -> None:
        """Start a new pass (new shuffle) at the next batch (``train.loaders: per_epoch``)."""
        self.set_indices(self.indices)

    @property
    def batches_per_pass(self) -> int:
        """Batches in one pass over the set."""
        full = self.batch_size * self.world
        if self.drop_last:
            return max(1, len(self.indices) // full)
        return max(1, -(-len(self.indices) // full))

    def _local(self, b: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch (a batch of one duplicated)."""
        if self.world > 1 and len(b) >= 2 * self.world:
            b = b[dist_ops.shard(len(b), self.rank, self.world)]
        return b.repeat(2) if len(b) == 1 else b

    def state_dict(self) -> dict[str, Any]:
        """The sampled set and the position in the current pass (for exact resumption)."""
        return {"indices": self.indices.clone(), "order": self._order.clone(), "pos": self._pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.indices = state["indices"].long()
        self._order = state["order"].long()
        self._pos = int(state["pos"])

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)`` batch."""
        n = len(self.indices)
        if n == 0:
            raise RuntimeError(f"batch stream over {self.domain.name!r} is empty")
        size = self._size()
        left = len(self._order) - self._pos
        if (left < size) if self.drop_last else (left <= 0):
            self._order = self.indices[torch.randperm(n, generator=self.generator)]
            self._pos = 0
        start = self._pos
        b = self._local(self._order[start : start + size])
        self._pos += min(size, len(self._order) - start)
        if isinstance(self.domain, TensorDomain):
            return self.domain.x[b], self.labels[b]
        return self._load(start), self.labels[b]

    def _size(self) -> int:
        """The global batch size: ``world x batch_size``, or the whole set when smaller."""
        full = self.batch_size * self.world
        return full if len(self.indices) >= full else len(self.indices)

    def _load(self, start: int) -> torch.Tensor:
        """Inputs of the batch at ``start`` of the current pass, from a loader that reads the
        rest of the pass ahead (rebuilt when the order or position changed)."""
        ld = self._loaded
        if ld is None or ld[0] is not self._order or ld[1] != start:
            size, n = self._size(), len(self._order)
            ends = list(range(start + size, n + 1, size))
            if not self.drop_last and (not ends or ends[-1] < n):
                ends.append(n)  # the pass's last partial batch
            starts = [start, *ends[:-1]]
            rest = [self._local(self._order[a:b]) for a, b in zip(starts, ends, strict=True)]
            ld = (self._order, start, iterate_inputs(self.domain, rest))
        x = next(ld[2])
        self._loaded = (ld[0], self._pos, ld[2])
        return x


def unlabeled_view(domain: Domain) -> Domain:
    """The view the unlabeled-target training stream reads (``data.transforms.unlabeled_view``):
    an image domain's ``unlabeled`` view where it has one, else the domain itself."""
    views = getattr(domain, "transforms", None)
    return domain.view("unlabeled") if isinstance(views, dict) and "unlabeled" in views else domain
