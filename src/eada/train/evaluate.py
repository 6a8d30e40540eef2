"""Scoring passes: evaluation metrics and the per-sample outputs strategies consume."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from eada import distributed as dist_ops
from eada import energy as energy_ops
from eada.data.batches import chunks, iterate_inputs
from eada.data.tasks import Domain
from eada.models.base import EnergyNet
from eada.strategies import PoolOutputs
from eada.train.base import TrainerBase


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` lives: the device of its first parameter (else buffer); the CPU for a
    model with neither.

    >>> model_device(nn.Linear(2, 2))
    device(type='cpu')
    """
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


@torch.no_grad()
def predict_energies(
    model: nn.Module,
    domain: Domain,
    indices: torch.Tensor | None = None,
    batch_size: int = 512,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Energies ``(N, C)`` of ``domain[indices]`` (all samples by default), model in eval mode,
    inputs in the domain's ``test`` view, moved to ``device`` (default: the model's,
    :func:`model_device`); the energies come back on the CPU."""
    model.eval()
    dev = model_device(model) if device is None else device
    idx = torch.arange(len(domain)) if indices is None else indices
    xs = iterate_inputs(domain.view("test"), chunks(idx, batch_size))
    out = [model(x.to(dev)).float().cpu() for x in xs]
    return torch.cat(out) if out else torch.empty(0, 0)


def accuracy_metrics(
    energies: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> dict[str, object]:
    """Overall accuracy, per-class accuracy and their mean (in percent) from energies.

    The prediction is ``argmin_y E(x, y)``. Classes absent from ``labels`` get ``None`` and are
    left out of the per-class mean.
    """
    pred = energies.argmin(dim=1)
    correct = (pred == labels).double()
    counts = torch.bincount(labels, minlength=num_classes).double()
    hits = torch.bincount(labels, weights=correct, minlength=num_classes)
    per_class = [float(100 * h / c) if c > 0 else None for h, c in zip(hits, counts, strict=True)]
    present = [p for p in per_class if p is not None]
    return {
        "accuracy": float(100 * correct.mean()) if len(labels) else float("nan"),
        "mean_class_accuracy": float(np.mean(present)) if present else float("nan"),
        "per_class_accuracy": per_class,
        "n": len(labels),
    }


def domain_metrics(
    energies: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> dict[str, object]:
    """:func:`accuracy_metrics` plus the mean free energy, from precomputed energies."""
    metrics = accuracy_metrics(energies, labels, num_classes)
    metrics["mean_free_energy"] = float(energy_ops.free_energy(energies).mean())
    return metrics


@torch.no_grad()
def score_pool(
    model: nn.Module,
    domain: Domain,
    indices: torch.Tensor,
    needs: tuple[str, ...],
    batch_size: int = 512,
    device: torch.device | str | None = None,
    free_energy_tau: float = 1.0,
) -> PoolOutputs:
    """One eval-mode pass over the pool, keeping only what the strategy ``needs``.

    ``free_energy_tau``: the reverse temperature of the free energies
    (:func:`eada.energy.free_energy`; see :attr:`ActiveDATrainer.selection_tau`).

    A strategy that needs only ``free_energy``/``mvsm`` gets two float32 a sample (plus the
    int32 predicted class, for the error rate of the selected samples), never the ``(N, C)``
    energies; ``energies`` and ``embeddings`` are kept only when asked for.
    Inputs come in the domain's ``score`` view (image domains: the scoring transform), moved
    to ``device`` (default: the model's, :func:`model_device`).
    """
    model.eval()
    device = model_device(model) if device is None else device
    keep_e = "energies" in needs
    keep_z = "embeddings" in needs
    f, u, p, es, zs = [], [], [], [], []
    for x in iterate_inputs(domain.view("score"), chunks(indices, batch_size)):
        x = x.to(device)
        if keep_z and isinstance(model, EnergyNet):
            z = model.embed(x)
            e = model.head(z).float()
            zs.append(z.float().cpu())
        else:
            e = model(x).float()
        f.append(energy_ops.free_energy(e, free_energy_tau).cpu())
        u.append(energy_ops.mvsm(e).cpu())
        p.append(e.argmin(dim=1).to(torch.int32).cpu())
        if keep_e:
            es.append(e.cpu())
    cat = (lambda xs: torch.cat(xs).numpy()) if len(indices) else (lambda xs: np.empty(0))
    return PoolOutputs(
        energies=cat(es) if keep_e else None,
        free_energy=cat(f),
        mvsm=cat(u),
        embeddings=cat(zs) if keep_z else None,
        predictions=cat(p) if len(indices) else np.empty(0, np.int32),
        n_target=len(domain),
    )


@torch.no_grad()
def embed_samples(
    model: nn.Module,
    domain: Domain,
    indices: torch.Tensor,
    batch_size: int = 512,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """Penultimate features ``(len(indices), D)`` of ``domain[indices]`` (eval mode), for
    strategies that compare the pool with the labeled target set or the source (CoreSet, DBAL).
    Needs an :class:`EnergyNet`; ``(0, D)`` for no indices. Inputs go to ``device`` (default:
    the model's, :func:`model_device`)."""
    if not isinstance(model, EnergyNet):
        raise TypeError("embeddings need an EnergyNet (a model with .embed)")
    model.eval()
    device = model_device(model) if device is None else device
    xs = iterate_inputs(domain.view("score"), chunks(indices, batch_size))
    zs = [model.embed(x.to(device)).float().cpu() for x in xs]
    if zs:
        return torch.cat(zs).numpy()
    return np.empty((0, model.head.in_features), dtype=np.float32)


class EvaluationMixin(TrainerBase):
    """Evaluation of the trainer's model (a part of :class:`~eada.train.loop.ActiveDATrainer`)."""

    def _predict(self, domain: Domain) -> torch.Tensor:
        """Energies of a whole domain (test view); sharded and gathered when distributed."""
        bs = self.cfg.train.eval_batch_size
        if self.world == 1:
            return predict_energies(self.model, domain, None, bs, self.device)
        dist_ops.sync_buffers(self.model)  # same batch-norm statistics on every rank
        part = torch.arange(len(domain))[dist_ops.shard(len(domain), self.rank, self.world)]
        local = predict_energies(self.model, domain, part, bs, self.device)
        return torch.from_numpy(dist_ops.gather_rows(local.numpy(), len(domain)))

    def evaluate(self) -> dict[str, Any]:
        """Metrics on the whole target (transductive, as the paper), on the target samples not
        labeled so far (``target_unlabeled``; at the end: never labeled) and on the held-out
        split."""
        target = self.task.target
        e = self._predict(target)  # one pass, reused below
        out: dict[str, Any] = {"target": domain_metrics(e, target.y, target.num_classes)}
        if (held := self.task.heldout) is not None:
            out["heldout"] = domain_metrics(self._predict(held), held.y, held.num_classes)
        unl = torch.nonzero(~self.labeled_mask).squeeze(1)
        if len(unl) > 0:
            out["target_unlabeled"] = accuracy_metrics(e[unl], target.y[unl], target.num_classes)
        return out
