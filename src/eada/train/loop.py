"""Round-based Active DA training (paper Alg. 1) on in-memory domains.

Each step draws three batches and runs three forward passes in train mode (the reference code's
choice, so batch norm sees each stream on its own):

* a source batch -> ``delta_s * NLL`` and an update of ``Delta`` (running source free energy);
* an unlabeled-target batch -> ``gamma * mean(max(0, F(x_t) - Delta))`` (skipped when gamma = 0);
* a labeled-target batch, once labels exist -> ``delta_t * NLL`` (a batch of one is duplicated).

At the END of every epoch listed in ``active.rounds_at`` the current model scores the unlabeled
pool, the strategy picks a batch, the oracle labels it, and those samples move from the
unlabeled pool to the labeled set at once. Every round records the selection, its timing, the
error rate of the model on the selected samples, and the target accuracy reached after the
training that follows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from eada import energy as energy_ops
from eada.config import ExperimentConfig, OptimConfig
from eada.data.base import TensorDomain
from eada.data.tasks import Task
from eada.models import build_model
from eada.strategies import BudgetTooLargeError, get_strategy, resolve_budget, stage_sizes
from eada.train.evaluate import accuracy_metrics, evaluate, predict_energies, score_pool
from eada.train.oracle import Oracle, SimulatedOracle

Callback = Callable[[str, "ActiveDATrainer", dict[str, Any]], None]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def build_optimizer(cfg: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Optimiser with two parameter groups: ``model.backbone`` at ``lr * backbone_lr_mult``,
    everything else (bottleneck, head) at ``lr``. Every trainable parameter is handed over
    (unlike the reference code, the head's batch-norm affine parameters are trained)."""
    backbone = getattr(model, "backbone", None)
    bb_ids = {id(p) for p in backbone.parameters()} if isinstance(backbone, nn.Module) else set()
    bb = [p for p in model.parameters() if id(p) in bb_ids and p.requires_grad]
    rest = [p for p in model.parameters() if id(p) not in bb_ids and p.requires_grad]
    groups = [
        g
        for g in (
            {"params": bb, "lr": cfg.lr * cfg.backbone_lr_mult},
            {"params": rest, "lr": cfg.lr},
        )
        if g["params"]
    ]
    if cfg.name == "sgd":
        return torch.optim.SGD(
            groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adadelta(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


class BatchStream:
    """Endless shuffled batches of ``domain[indices]``; reshuffles after each pass.

    Full batches only (``drop_last``) when at least one full batch exists, otherwise the whole
    set as one batch; a batch of one sample is duplicated (batch norm needs two).
    """

    def __init__(
        self,
        domain: TensorDomain,
        indices: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        labels: torch.Tensor | None = None,
    ) -> None:
        self.domain = domain
        self.labels = domain.y if labels is None else labels
        self.indices = indices
        self.batch_size = batch_size
        self.generator = generator
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def set_indices(self, indices: torch.Tensor) -> None:
        """Replace the sampled set (e.g. after a round); the next batch starts a new pass."""
        self.indices = indices
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    @property
    def batches_per_pass(self) -> int:
        """Batches in one pass over the set."""
        return max(1, len(self.indices) // self.batch_size)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)`` batch."""
        n = len(self.indices)
        if n == 0:
            raise RuntimeError(f"batch stream over {self.domain.name!r} is empty")
        size = self.batch_size if n >= self.batch_size else n
        if self._pos + size > len(self._order):
            self._order = self.indices[torch.randperm(n, generator=self.generator)]
            self._pos = 0
        b = self._order[self._pos : self._pos + size]
        self._pos += size
        if len(b) == 1:
            b = b.repeat(2)
        return self.domain.x[b], self.labels[b]


@dataclass
class RunResult:
    """Everything a run measured (JSON-ready via :meth:`to_dict`)."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    labeled_indices: list[int] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for ``json.dump``."""
        return {
            "plan": self.plan,
            "rounds": self.rounds,
            "history": self.history,
            "final": self.final,
            "labeled_indices": self.labeled_indices,
            "seconds": self.seconds,
        }


class ActiveDATrainer:
    """Runs one Active DA experiment: training, selection rounds, evaluation.

    Args:
        cfg: the validated experiment config.
        task: source, target (the active pool) and optional held-out target domains.
        model: the energy network; built from ``cfg.model`` when ``None``.
        oracle: labels the selected samples; a :class:`SimulatedOracle` on the target's ground
            truth when ``None``.
        callbacks: called as ``cb(event, trainer, info)`` with events ``"before_round"``
            (model trained so far, nothing selected yet), ``"after_round"``, ``"epoch_end"``.

    Raises:
        ValueError: empty domains, class sets that differ, or a round plan the pool cannot
            serve (budget larger than the pool, alpha1 too small) -- all before any training.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        task: Task,
        model: nn.Module | None = None,
        oracle: Oracle | None = None,
        callbacks: list[Callback] | None = None,
    ) -> None:
        task.check()
        self.cfg = cfg
        self.task = task
        self.device = resolve_device(cfg.device)
        self.callbacks = list(callbacks or [])
        self.plan = self.make_plan()
        torch.manual_seed(cfg.seed)
        self.model = (
            model
            if model is not None
            else build_model(cfg.model, tuple(task.source.x.shape[1:]), task.source.num_classes)
        ).to(self.device)
        self.optimizer = build_optimizer(cfg.optim, self.model)
        self.oracle: Oracle = oracle if oracle is not None else SimulatedOracle(task.target.y)
        self.delta = energy_ops.DeltaEstimator(
            cfg.train.delta_mode, cfg.train.delta_momentum, seed=cfg.seed + 1
        )
        self.strategy_rng = np.random.default_rng(cfg.seed + 2)
        gen = torch.Generator().manual_seed(cfg.seed + 3)
        n_t = len(task.target)
        self.labeled_mask = torch.zeros(n_t, dtype=torch.bool)
        self.target_labels = torch.full((n_t,), -1, dtype=torch.long)
        bs = cfg.train.batch_size
        self.source_stream = BatchStream(task.source, torch.arange(len(task.source)), bs, gen)
        self.unlabeled_stream = BatchStream(task.target, torch.arange(n_t), bs, gen)
        self.labeled_stream = BatchStream(
            task.target, torch.empty(0, dtype=torch.long), bs, gen, labels=self.target_labels
        )

    # -- planning ---------------------------------------------------------------------------
    def make_plan(self) -> list[dict[str, Any]]:
        """The per-round budgets and pool sizes, validated before any work starts."""
        a = self.cfg.active
        if not a.enabled:
            return []
        n_target = len(self.task.target)
        budget = resolve_budget(a.budget_per_round, n_target)
        share = a.budget_per_round if isinstance(a.budget_per_round, float) else None
        pool = n_target
        plan = []
        for r, epoch in enumerate(a.rounds_at, start=1):
            try:
                if a.strategy == "eada":
                    n1, n2 = stage_sizes(pool, budget, a.alpha1, a.selection_rule, n_target, share)
                else:
                    if budget > pool:
                        raise BudgetTooLargeError(
                            f"budget {budget} is larger than the unlabeled pool ({pool} samples)"
                        )
                    n1, n2 = pool, budget
            except ValueError as err:
                raise ValueError(f"round {r} (epoch {epoch}): {err}") from None
            plan.append(
                {"round": r, "epoch": epoch, "pool_before": pool, "stage1": n1, "budget": n2}
            )
            pool -= n2
        return plan

    # -- training ---------------------------------------------------------------------------
    def _emit(self, event: str, info: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb(event, self, info)

    def train_step(self) -> dict[str, float]:
        """One optimisation step over a source, an unlabeled and a labeled-target batch."""
        t = self.cfg.train
        dev = self.device
        self.model.train()
        xs, ys = self.source_stream.next()
        e_s = self.model(xs.to(dev))
        loss_s = energy_ops.energy_nll(e_s, ys.to(dev), tau=t.tau)
        delta = self.delta.update(energy_ops.free_energy(e_s.detach(), t.tau))
        loss = t.delta_s * loss_s
        out = {"loss_source": float(loss_s.detach()), "delta": delta}
        if t.gamma > 0 and len(self.unlabeled_stream.indices):
            xu, _ = self.unlabeled_stream.next()
            e_u = self.model(xu.to(dev))
            loss_u = energy_ops.free_energy_alignment_loss(e_u, delta, tau=t.tau)
            loss = loss + t.gamma * loss_u
            out["loss_align"] = float(loss_u.detach())
        if len(self.labeled_stream.indices):
            xl, yl = self.labeled_stream.next()  # labels as the oracle gave them
            e_l = self.model(xl.to(dev))
            loss_l = energy_ops.energy_nll(e_l, yl.to(dev), tau=t.tau)
            loss = loss + t.delta_t * loss_l
            out["loss_target"] = float(loss_l.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {float(loss)}; lower the learning rate")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        out["loss"] = float(loss.detach())
        return out

    def steps_per_epoch(self) -> int:
        """``max(#source batches, #unlabeled batches)``, the reference code's epoch length."""
        return max(self.source_stream.batches_per_pass, self.unlabeled_stream.batches_per_pass)

    # -- selection --------------------------------------------------------------------------
    def select_round(self, r: int, epoch: int, budget: int) -> dict[str, Any]:
        """Score the unlabeled pool, select, ask the oracle, move samples to the labeled set."""
        a = self.cfg.active
        spec = get_strategy(a.strategy)
        pool_idx = torch.nonzero(~self.labeled_mask).squeeze(1)
        t0 = time.perf_counter()
        needs = tuple(spec.needs) + (("energies",) if "energies" not in spec.needs else ())
        outputs = score_pool(
            self.model,
            self.task.target,
            pool_idx,
            needs,
            self.cfg.train.eval_batch_size,
            self.device,
        )
        t1 = time.perf_counter()
        params = dict(a.params)
        if a.strategy == "eada":
            params.update(
                alpha1=a.alpha1,
                rule=a.selection_rule,
                budget_share=a.budget_per_round if isinstance(a.budget_per_round, float) else None,
            )
        sel = spec.fn(outputs, budget, self.strategy_rng, **params)
        t2 = time.perf_counter()
        chosen = pool_idx[torch.from_numpy(sel.indices)]
        if self.labeled_mask[chosen].any() or len(set(chosen.tolist())) != len(chosen):
            raise RuntimeError("strategy returned an already-labeled or duplicate sample")
        labels = torch.from_numpy(self.oracle.label(chosen.numpy()))
        self.labeled_mask[chosen] = True
        self.target_labels[chosen] = labels
        labeled = torch.nonzero(self.labeled_mask).squeeze(1)
        self.labeled_stream.set_indices(labeled)
        self.unlabeled_stream.set_indices(torch.nonzero(~self.labeled_mask).squeeze(1))
        assert outputs.energies is not None
        pred = torch.from_numpy(outputs.energies[sel.indices]).argmin(dim=1)
        return {
            "round": r,
            "epoch": epoch,
            "strategy": a.strategy,
            "budget": len(chosen),
            "n_labeled": int(self.labeled_mask.sum()),
            "pool_before": len(pool_idx),
            "selected": chosen.tolist(),
            "selected_labels": labels.tolist(),
            "selected_error_rate": float(100 * (pred != labels).double().mean()),
            "scoring_seconds": t1 - t0,
            "selection_seconds": t2 - t1,
            "selection_info": sel.info,
            "pool_mean_free_energy": float(outputs.get_free_energy().mean()),
        }

    # -- evaluation -------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Metrics on the whole target (transductive, as the paper) and the held-out split."""
        bs = self.cfg.train.eval_batch_size
        out: dict[str, Any] = {"target": evaluate(self.model, self.task.target, bs, self.device)}
        if self.task.heldout is not None:
            out["heldout"] = evaluate(self.model, self.task.heldout, bs, self.device)
        unl = torch.nonzero(~self.labeled_mask).squeeze(1)
        if 0 < len(unl) < len(self.task.target):
            e = predict_energies(self.model, self.task.target, unl, bs, self.device)
            out["target_unlabeled"] = accuracy_metrics(
                e, self.task.target.y[unl], self.task.target.num_classes
            )
        return out

    # -- the run ----------------------------------------------------------------------------
    def run(self, progress: Callable[[str], None] | None = None) -> RunResult:
        """Train for ``train.epochs`` epochs with the planned rounds; return the measurements."""
        cfg = self.cfg
        start = time.perf_counter()
        result = RunResult(plan=self.plan)
        rounds_by_epoch = {p["epoch"]: p for p in self.plan}
        steps = self.steps_per_epoch()
        open_round: dict[str, Any] | None = None
        best: dict[str, Any] | None = None
        for epoch in range(1, cfg.train.epochs + 1):
            sums: dict[str, float] = {}
            for _ in range(steps):
                for k, v in self.train_step().items():
                    sums[k] = sums.get(k, 0.0) + v
            record: dict[str, Any] = {"epoch": epoch, **{k: v / steps for k, v in sums.items()}}
            is_round = epoch in rounds_by_epoch
            if is_round or epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs:
                metrics = self.evaluate()
                record["metrics"] = metrics
                acc = metrics["target"]["accuracy"]
                if best is None or acc > best["target"]["accuracy"]:
                    best = {"epoch": epoch, **metrics}
                if open_round is not None and (is_round or epoch == cfg.train.epochs):
                    open_round["after_training"] = {"epoch": epoch, **metrics}
                    open_round = None
                if is_round:
                    p = rounds_by_epoch[epoch]
                    if not result.rounds:
                        result.rounds.append(
                            {
                                "round": 0,
                                "epoch": epoch,
                                "n_labeled": 0,
                                "after_training": {"epoch": epoch, **metrics},
                            }
                        )
                    self._emit("before_round", {"round": p["round"], "epoch": epoch})
                    rec = self.select_round(p["round"], epoch, p["budget"])
                    rec["at_selection"] = metrics
                    result.rounds.append(rec)
                    open_round = rec
                    self._emit("after_round", rec)
            result.history.append(record)
            self._emit("epoch_end", record)
            if progress is not None:
                acc_s = (
                    f"{record['metrics']['target']['accuracy']:.2f}%"
                    if "metrics" in record
                    else "-"
                )
                progress(
                    f"epoch {epoch}/{cfg.train.epochs} loss {record.get('loss', 0):.4f} "
                    f"target acc {acc_s} labeled {int(self.labeled_mask.sum())}"
                )
        last = result.history[-1]["metrics"]
        result.final = {
            "protocol": "whole target set (transductive), last epoch",
            "last_epoch": {"epoch": cfg.train.epochs, **last},
            "best_epoch": best,
            "delta": self.delta.value,
        }
        result.labeled_indices = torch.nonzero(self.labeled_mask).squeeze(1).tolist()
        result.seconds = time.perf_counter() - start
        return result
