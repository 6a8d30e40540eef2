"""Round-based Active DA training (paper Alg. 1) on in-memory domains.

Each step draws three batches and runs three forward passes in train mode (the reference code's
choice, so batch norm sees each stream on its own):

* a source batch -> ``delta_s * NLL`` and an update of ``Delta`` (running source free energy);
* an unlabeled-target batch -> ``gamma * mean(max(0, F(x_t) - Delta))`` (skipped when gamma = 0);
* a labeled-target batch, once labels exist -> ``delta_t * NLL`` (a batch of one is duplicated).

``train.forward: fused`` runs the three batches as one pass with per-stream batch norm
(:mod:`eada.train.forward`).

Distributed (launched by ``torchrun``, :mod:`eada.distributed`): the step module is wrapped in
``DistributedDataParallel``; each rank draws its own part of every global batch (the same
shuffle everywhere, ``W x batch_size`` samples a stream and step); ``Delta`` folds in the mean
over ranks; evaluation and pool scoring are sharded and gathered; rank 0 selects and broadcasts
the choice, so every rank holds the same labeled set.

At the END of every epoch listed in ``active.rounds_at`` the current model scores the unlabeled
pool, the strategy picks a batch, the oracle labels it, and those samples move from the
unlabeled pool to the labeled set at once. Every round records the selection, its timing, the
error rate of the model on the selected samples, and the target accuracy reached after the
training that follows it.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from eada import distributed as dist_ops
from eada import energy as energy_ops
from eada.config import ActiveConfig, ExperimentConfig, OptimConfig
from eada.data.base import TensorDomain
from eada.data.batches import iterate_inputs
from eada.data.tasks import Domain, Task
from eada.models import build_model
from eada.strategies import (
    BudgetTooLargeError,
    PoolOutputs,
    Selection,
    get_strategy,
    reference_random_budget,
    resolve_budget,
    stage_sizes,
)
from eada.threads import configure_for_model
from eada.train.evaluate import (
    accuracy_metrics,
    domain_metrics,
    embed_samples,
    predict_energies,
    score_pool,
)
from eada.train.forward import StepForward
from eada.train.oracle import Oracle, SimulatedOracle

Callback = Callable[[str, "ActiveDATrainer", dict[str, Any]], None]


class TrainingComponents(Protocol):
    """What the trainer calls on the parts that train beside the classifier (the baselines'
    discriminator, committee, ...: :class:`eada.train.aux.AuxTraining`)."""

    def loss(
        self, trainer: ActiveDATrainer, xs: torch.Tensor, ys: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Their loss for one step (added to the classifier's) and values to log."""
        ...

    def parameters(self) -> Iterator[nn.Parameter]:
        """Their parameters (gradients averaged over the ranks)."""
        ...

    def zero_grad(self) -> None:
        """Clear their gradients."""
        ...

    def step(self) -> None:
        """One optimiser step on their parameters."""
        ...

    def pool_scores(self, embeddings: np.ndarray, device: torch.device) -> dict[str, np.ndarray]:
        """Per-sample scores on the pool's embeddings (``PoolOutputs.extra``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Their state, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...


ComponentsBuilder = Callable[["ActiveDATrainer"], TrainingComponents | None]

COMPONENT_BUILDERS: list[ComponentsBuilder] = []
"""Who builds a trainer's training components: the first builder that returns some wins.
:mod:`eada.train.aux` registers its :func:`~eada.train.aux.build_aux` when :mod:`eada.train` is
imported (the trainer does not import its plug-ins)."""


def register_components_builder(builder: ComponentsBuilder) -> ComponentsBuilder:
    """Add ``builder`` to :data:`COMPONENT_BUILDERS` (once)."""
    if builder not in COMPONENT_BUILDERS:
        COMPONENT_BUILDERS.append(builder)
    return builder


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def build_optimizer(cfg: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Optimiser with two parameter groups: ``model.backbone`` at ``lr * backbone_lr_mult``,
    everything else (bottleneck, head) at ``lr``. Every parameter that requires a gradient is
    handed over: the bottleneck batch norm's affine parameters too, unless
    ``model.freeze_bottleneck_bn_affine`` froze them (the authors' code, the paper configs)."""
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


@dataclass
class Proposal:
    """What :meth:`ActiveDATrainer.propose` chose: pool positions ``pool_idx`` (target indices
    of the unlabeled pool), the ``chosen`` target indices, the pool outputs and the strategy's
    :class:`~eada.strategies.Selection` (per-sample scores over the pool), and timings."""

    pool_idx: torch.Tensor
    chosen: torch.Tensor
    outputs: PoolOutputs
    selection: Selection
    scoring_seconds: float
    selection_seconds: float


def unlabeled_view(domain: Domain) -> Domain:
    """The view the unlabeled-target training stream reads (``data.transforms.unlabeled_view``):
    an image domain's ``unlabeled`` view where it has one, else the domain itself."""
    views = getattr(domain, "transforms", None)
    return domain.view("unlabeled") if isinstance(views, dict) and "unlabeled" in views else domain


def record_alignment_runaway(
    log: list[dict[str, Any]],
    found: list[dict[str, Any]],
    at: dict[str, int],
    unit: str = "epochs",
) -> str | None:
    """Look for the ``L_fea`` scale runaway (:func:`eada.energy.alignment_runaway`) in a
    trainer's log (records with ``delta`` and ``loss_align`` means, one per epoch or log
    window; records without ``loss_align`` are skipped). On the first find, append
    ``{"kind": "alignment_runaway", **at, "message": ...}`` to ``found`` and return the message.
    Returns ``None`` when there is none, or when ``found`` already has one (once per model).
    ``at`` says where it was found, e.g. ``{"epoch": 5}`` or ``{"iteration": 4000}``; ``unit``
    what one log record covers, for the message."""
    if any(w["kind"] == "alignment_runaway" for w in found):
        return None
    hist = [h for h in log if "loss_align" in h]
    message = energy_ops.alignment_runaway(
        [h["delta"] for h in hist], [h["loss_align"] for h in hist], unit=unit
    )
    if message is not None:
        found.append({"kind": "alignment_runaway", **at, "message": message})
    return message


def record_alignment_drift(
    log: list[dict[str, Any]],
    found: list[dict[str, Any]],
    at: dict[str, int],
    unit: str = "epochs",
    remedy: str = energy_ops.DRIFT_REMEDY,
) -> str | None:
    """Look for the slow drift of ``Delta`` (:func:`eada.energy.alignment_drift`) in a
    trainer's log (records with ``delta``, ``loss_align`` and ``loss_source`` means; records
    without ``loss_align`` or ``loss_source``, e.g. from an older checkpoint, are skipped). On
    the first find, append ``{"kind": "alignment_drift", **at, "message": ...}`` to ``found``
    and return the message; ``None`` otherwise, or when ``found`` already has one. ``remedy``:
    the message's advice (another trainer names its own options)."""
    if any(w["kind"] == "alignment_drift" for w in found):
        return None
    hist = [h for h in log if "loss_align" in h and "loss_source" in h]
    message = energy_ops.alignment_drift(
        [h["delta"] for h in hist], [h["loss_source"] for h in hist], unit=unit, remedy=remedy
    )
    if message is not None:
        found.append({"kind": "alignment_drift", **at, "message": message})
    return message


def report_alignment_runaway(
    message: str,
    where: str,
    progress: Callable[[str], None] | None,
    kind: str = "alignment_runaway",
) -> None:
    """Show an alignment warning (``kind`` ``alignment_runaway`` or ``alignment_drift``): as a
    progress line (the CLI) when ``progress`` is given, else as an
    :class:`~eada.energy.AlignmentRunawayWarning` or :class:`~eada.energy.AlignmentDriftWarning`."""
    if progress is not None:
        progress(f"warning ({where}): {message}")
    else:
        category: type[Warning] = (
            energy_ops.AlignmentDriftWarning
            if kind == "alignment_drift"
            else energy_ops.AlignmentRunawayWarning
        )
        warnings.warn(f"{where}: {message}", category, stacklevel=3)


def round_plan(a: ActiveConfig, n_target: int) -> list[dict[str, Any]]:
    """The rounds of ``a`` on a target of ``n_target`` samples: per round ``round``,
    ``epoch``, ``pool_before``, ``stage1`` and ``budget``, validated before any work starts
    (a function of the config alone: no model is built).

    Raises:
        BudgetTooLargeError: a round's budget exceeds the pool left.
        ValueError: a round's stage sizes are impossible (its round and epoch named).
    """
    if not a.enabled:
        return []
    budget = resolve_budget(a.budget_per_round, n_target)
    share = a.budget_per_round if isinstance(a.budget_per_round, float) else None
    if a.strategy == "random" and a.selection_rule == "reference" and share is not None:
        budget = reference_random_budget(share, n_target)  # the authors' round(N share)
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
        plan.append({"round": r, "epoch": epoch, "pool_before": pool, "stage1": n1, "budget": n2})
        pool -= n2
    return plan


@dataclass(frozen=True)
class GateSchedule:
    """Where a trainer run sits in a longer schedule, for ``train.fea_gate``'s ``dann`` and
    ``labels`` weights: a project store trains its schedule in segments (one
    :class:`ActiveDATrainer` run each, with no rounds of its own), and the gates must count
    against the whole schedule, as one simulated run does.

    Attributes:
        epochs_before: epochs of the schedule trained before this run.
        epochs: the schedule's epochs (``train.epochs`` of the project's config).
        planned_labels: the target labels its rounds plan in all.
    """

    epochs_before: int
    epochs: int
    planned_labels: int


@dataclass
class RunResult:
    """Everything a run measured (JSON-ready via :meth:`to_dict`)."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    labeled_indices: list[int] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for ``json.dump``."""
        return {
            "plan": self.plan,
            "rounds": self.rounds,
            "history": self.history,
            "final": self.final,
            "labeled_indices": self.labeled_indices,
            "seconds": self.seconds,
            "warnings": self.warnings,
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
            else build_model(cfg.model, task.source.input_shape, task.source.num_classes)
        ).to(self.device)
        if cfg.train.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.threads = configure_for_model(self.model)  # eada.threads: --threads, env, model size
        self.optimizer = build_optimizer(cfg.optim, self.model)
        self.rank, self.world = dist_ops.rank_world()
        amp = self.device.type == "cuda" and cfg.train.amp
        self._step: nn.Module = StepForward(
            self.model, cfg.train.forward, torch.bfloat16 if amp else None, cfg.train.channels_last
        )
        if self.world > 1:  # one DDP forward call a step, whichever forward mode runs inside
            from torch.nn.parallel import DistributedDataParallel

            cuda = self.device.type == "cuda"
            ids = [self.device.index or torch.cuda.current_device()] if cuda else None
            self._step = DistributedDataParallel(self._step, device_ids=ids)
        self.oracle: Oracle = oracle if oracle is not None else SimulatedOracle(task.target.y)
        self.delta = energy_ops.DeltaEstimator(
            cfg.train.delta_mode, cfg.train.delta_momentum, seed=cfg.seed + 1
        )
        # per-epoch Delta / L_fea means and the runaway warnings found in them (model lifetime)
        self.alignment_log: list[dict[str, float]] = []
        self.alignment_warnings: list[dict[str, Any]] = []
        # the weight of L_fea under train.fea_gate (eada.energy.fea_gate_weight), set by run()
        # before every step; outside run() 0 under the gate "zero", else 1 (no gate)
        self.fea_weight = 0.0 if cfg.train.fea_gate == "zero" else 1.0
        # the longer schedule this run is a segment of (a project store's), for the gates
        self.gate_schedule: GateSchedule | None = None
        self.strategy_rng = np.random.default_rng(cfg.seed + 2)
        gen = torch.Generator().manual_seed(cfg.seed + 3)
        n_t = len(task.target)
        self.labeled_mask = torch.zeros(n_t, dtype=torch.bool)
        self.target_labels = torch.full((n_t,), -1, dtype=torch.long)
        bs, rk, w = cfg.train.batch_size, self.rank, self.world
        self.source_stream = BatchStream(
            task.source, torch.arange(len(task.source)), bs, gen, None, rk, w
        )
        self.unlabeled_stream = BatchStream(
            unlabeled_view(task.target), torch.arange(n_t), bs, gen, None, rk, w
        )
        per_epoch = cfg.train.loaders == "per_epoch"  # the labeled loader keeps its last batch
        self.labeled_stream = BatchStream(
            task.target,
            torch.empty(0, dtype=torch.long),
            bs,
            gen,
            self.target_labels,
            rk,
            w,
            drop_last=not per_epoch,
        )
        self.generator = gen
        self.last_proposal: Proposal | None = None
        self._run_state: dict[str, Any] | None = None  # progress inside run(), for checkpoints
        self._resume: dict[str, Any] | None = None  # progress restored by load_state_dict
        self.aux = self._build_components()  # some baselines' own (eada.train.aux)

    def _build_components(self) -> TrainingComponents | None:
        for builder in COMPONENT_BUILDERS:
            made = builder(self)
            if made is not None:
                return made
        return None

    # -- planning ---------------------------------------------------------------------------
    def make_plan(self) -> list[dict[str, Any]]:
        """The per-round budgets and pool sizes, validated before any work starts
        (:func:`round_plan` of this config and target)."""
        return round_plan(self.cfg.active, len(self.task.target))

    # -- training ---------------------------------------------------------------------------
    def _emit(self, event: str, info: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb(event, self, info)

    def train_step(self) -> dict[str, float]:
        """One optimisation step over a source, an unlabeled and a labeled-target batch."""
        t = self.cfg.train
        dev = self.device
        self._step.train()
        xs, ys = self.source_stream.next()
        batches = [xs]
        use_u = t.gamma > 0 and len(self.unlabeled_stream.indices) > 0
        if use_u:
            batches.append(self.unlabeled_stream.next()[0])
        use_l = len(self.labeled_stream.indices) > 0
        if use_l:
            xl, yl = self.labeled_stream.next()  # labels as the oracle gave them
            batches.append(xl)
        energies = self._step([x.to(dev, non_blocking=True) for x in batches])
        e_s = energies[0]
        loss_s = energy_ops.energy_nll(e_s, ys.to(dev), tau=t.tau)
        scale = None
        if t.alignment == "normalized":  # the joint scale of the source and unlabeled batches
            scale = energy_ops.alignment_scale(e_s, *energies[1:2] if use_u else [])
        f_s = energy_ops.alignment_free_energy(
            e_s.detach(), t.alignment, t.tau, None if scale is None else scale.detach()
        )
        delta = self.delta.update(dist_ops.all_mean(f_s.mean()) if self.world > 1 else f_s)
        loss = t.delta_s * loss_s
        out = {"loss_source": float(loss_s.detach()), "delta": delta}
        if use_u:
            e_u = energies[1]
            if t.fea_gate == "confidence":  # per-sample weights (eada.energy.fea_sample_weights)
                per_sample = energy_ops.free_energy_alignment_loss(
                    e_u, delta, tau=t.tau, alignment=t.alignment, scale=scale, reduction="none"
                )
                loss_u = (energy_ops.fea_sample_weights(e_u, t.tau) * per_sample).mean()
            else:
                loss_u = energy_ops.free_energy_alignment_loss(
                    e_u, delta, tau=t.tau, alignment=t.alignment, scale=scale
                )
            if self.fea_weight != 0.0:  # 0 (gate zero, dann at the start): no term, not 0 * it
                loss = loss + t.gamma * self.fea_weight * loss_u
            out["loss_align"] = float(loss_u.detach())
            if t.fea_gate != "none":
                out["fea_weight"] = self.fea_weight
        if use_l:
            loss_l = energy_ops.energy_nll(energies[-1], yl.to(dev), tau=t.tau)
            loss = loss + t.delta_t * loss_l
            out["loss_target"] = float(loss_l.detach())
        if self.aux is not None:  # discriminator / committee / MME entropy / critic losses
            loss_aux, aux_logs = self.aux.loss(self, xs, ys)
            loss = loss + loss_aux
            out.update(aux_logs)
        finite = bool(torch.isfinite(loss))
        if self.world > 1:  # every rank stops together (a lone raise would hang the others)
            finite = float(dist_ops.all_mean(torch.tensor(float(finite)))) == 1.0
        if not finite:
            raise FloatingPointError(f"loss became {float(loss)}; lower the learning rate")
        self.optimizer.zero_grad(set_to_none=True)
        if self.aux is not None:
            self.aux.zero_grad()
        loss.backward()  # DDP averages the model's gradients over the ranks here
        self.optimizer.step()
        if self.aux is not None:
            if self.world > 1:
                dist_ops.average_gradients(self.aux.parameters())
            self.aux.step()
        out["loss"] = float(loss.detach())
        return out

    def _watch_alignment(self, record: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        """Add an epoch's ``Delta``, ``L_fea`` and source NLL means to :attr:`alignment_log`
        (kept in the checkpoints, so the log spans every schedule a model is trained under,
        e.g. the segments of ``eada train``) and return the warnings found for the first time
        (the runaway, the slow drift; each at most once a model)."""
        if "loss_align" in record:
            entry = {"delta": record["delta"], "loss_align": record["loss_align"]}
            if "loss_source" in record:
                entry["loss_source"] = record["loss_source"]
            self.alignment_log.append(entry)
        new = []
        for check in (record_alignment_runaway, record_alignment_drift):
            if check(self.alignment_log, self.alignment_warnings, {"epoch": epoch}) is not None:
                new.append(self.alignment_warnings[-1])
        return new

    def steps_per_epoch(self) -> int:
        """``max(#source batches, #unlabeled batches)`` over the current pool, the reference
        code's epoch length (``train.loaders: continuous`` takes it once, from the initial
        pool; ``per_epoch`` at the start of every epoch)."""
        return max(self.source_stream.batches_per_pass, self.unlabeled_stream.batches_per_pass)

    # -- selection --------------------------------------------------------------------------
    def propose(self, budget: int, exclude: torch.Tensor | None = None) -> Proposal:
        """Score the unlabeled pool with the current model and let the strategy choose
        ``budget`` samples; asks no labels. The one selection path: simulated rounds
        (:meth:`select_round`) and human rounds (``eada query``) both call it. ``exclude``: a
        boolean mask over the target of unlabeled samples kept out of the pool (a project's
        audit samples, samples a human marked unusable, files that vanished); they still train
        as unlabeled data."""
        a = self.cfg.active
        spec = get_strategy(a.strategy)
        free = ~self.labeled_mask if exclude is None else ~self.labeled_mask & ~exclude
        pool_idx = torch.nonzero(free).squeeze(1)
        t0 = time.perf_counter()
        needs = tuple(spec.needs)
        if self.aux is not None and "embeddings" not in needs:
            needs += ("embeddings",)  # the training components score the pool's embeddings
        outputs = self._score(pool_idx, needs)
        if self.rank == 0:  # labeled/source embeddings, training components' scores
            outputs = self.complete_pool_outputs(outputs, needs)
        t1 = time.perf_counter()
        params = dict(a.params)
        if a.strategy == "eada":
            params.update(
                alpha1=a.alpha1,
                rule=a.selection_rule,
                budget_share=a.budget_per_round if isinstance(a.budget_per_round, float) else None,
            )
        if self.world == 1:
            sel = spec.fn(outputs, budget, self.strategy_rng, **params)
        else:  # rank 0 selects ONCE; every rank receives the same positions
            mine = spec.fn(outputs, budget, self.strategy_rng, **params) if self.rank == 0 else None
            idx = dist_ops.broadcast_indices(mine.indices if mine is not None else None)
            sel = mine if mine is not None else Selection(idx, info={"from_rank": 0})
        t2 = time.perf_counter()
        chosen = pool_idx[torch.from_numpy(sel.indices)]
        if self.labeled_mask[chosen].any() or len(set(chosen.tolist())) != len(chosen):
            raise RuntimeError("strategy returned an already-labeled or duplicate sample")
        return Proposal(pool_idx, chosen, outputs, sel, t1 - t0, t2 - t1)

    def complete_pool_outputs(self, outputs: PoolOutputs, needs: tuple[str, ...]) -> PoolOutputs:
        """Add what some strategies need beyond :func:`~eada.train.evaluate.score_pool`:
        embeddings of the labeled target set and of the source (``labeled_embeddings`` /
        ``source_embeddings`` in ``needs``) and the training components' pool scores
        (``outputs.extra``)."""
        bs, dev = self.cfg.train.eval_batch_size, self.device
        if "labeled_embeddings" in needs:
            lab = torch.nonzero(self.labeled_mask).squeeze(1)
            outputs.labeled_embeddings = embed_samples(self.model, self.task.target, lab, bs, dev)
        if "source_embeddings" in needs:
            src = self.task.source
            outputs.source_embeddings = embed_samples(
                self.model, src, torch.arange(len(src)), bs, dev
            )
        if self.aux is not None and len(outputs):
            outputs.extra.update(
                self.aux.pool_scores(outputs.require_embeddings("training components"), dev)
            )
        return outputs

    @property
    def selection_tau(self) -> float:
        """The reverse temperature of the pool's free energies at selection. ``train.tau != 1``
        tempers them as training does: the paper's ``F_tau = -(1/tau) logsumexp(-tau E)``, or
        under ``active.selection_rule: reference`` the authors' selection placement
        ``-tau logsumexp(-E / tau)`` (i.e. ``F`` at reverse temperature ``1/tau``). Both are the
        plain ``F`` at ``tau = 1``."""
        tau = self.cfg.train.tau
        return 1.0 / tau if self.cfg.active.selection_rule == "reference" else tau

    def _score(self, pool_idx: torch.Tensor, needs: tuple[str, ...]) -> PoolOutputs:
        """:func:`~eada.train.evaluate.score_pool` over the pool; distributed, every rank scores
        its shard and the per-sample outputs are gathered back into pool order on every rank."""
        bs = self.cfg.train.eval_batch_size
        if self.world == 1:
            return score_pool(
                self.model, self.task.target, pool_idx, needs, bs, self.device, self.selection_tau
            )
        dist_ops.sync_buffers(self.model)  # same batch-norm statistics on every rank
        n = len(pool_idx)
        part = pool_idx[dist_ops.shard(n, self.rank, self.world)]
        local = score_pool(
            self.model, self.task.target, part, needs, bs, self.device, self.selection_tau
        )

        def gather(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else dist_ops.gather_rows(a, n)

        return PoolOutputs(
            energies=gather(local.energies),
            free_energy=gather(local.free_energy),
            mvsm=gather(local.mvsm),
            embeddings=gather(local.embeddings),
            predictions=gather(local.predictions),
            n_target=local.n_target,
        )

    def _predict(self, domain: Domain) -> torch.Tensor:
        """Energies of a whole domain (test view); sharded and gathered when distributed."""
        bs = self.cfg.train.eval_batch_size
        if self.world == 1:
            return predict_energies(self.model, domain, None, bs, self.device)
        dist_ops.sync_buffers(self.model)  # same batch-norm statistics on every rank
        part = torch.arange(len(domain))[dist_ops.shard(len(domain), self.rank, self.world)]
        local = predict_energies(self.model, domain, part, bs, self.device)
        return torch.from_numpy(dist_ops.gather_rows(local.numpy(), len(domain)))

    def set_labels(self, indices: torch.Tensor, labels: torch.Tensor) -> None:
        """Replace the labeled target set by ``indices`` with class ids ``labels`` (e.g. labels
        that exist before training starts); the streams start a new pass."""
        indices, labels = torch.as_tensor(indices).long(), torch.as_tensor(labels).long()
        if len(indices) and (labels.min() < 0 or labels.max() >= self.task.target.num_classes):
            raise ValueError(f"labels must lie in [0, {self.task.target.num_classes})")
        self.labeled_mask.zero_()
        self.target_labels.fill_(-1)
        self.labeled_mask[indices] = True
        self.target_labels[indices] = labels
        self.labeled_stream.set_indices(torch.nonzero(self.labeled_mask).squeeze(1))
        self.unlabeled_stream.set_indices(torch.nonzero(~self.labeled_mask).squeeze(1))

    def select_round(self, r: int, epoch: int, budget: int) -> dict[str, Any]:
        """Score the unlabeled pool, select, ask the oracle, move samples to the labeled set."""
        a = self.cfg.active
        prop = self.last_proposal = self.propose(budget)
        chosen, outputs, sel = prop.chosen, prop.outputs, prop.selection
        pool_idx = prop.pool_idx
        labels = torch.from_numpy(self.oracle.label(chosen.numpy()))
        self.labeled_mask[chosen] = True
        self.target_labels[chosen] = labels
        labeled = torch.nonzero(self.labeled_mask).squeeze(1)
        self.labeled_stream.set_indices(labeled)
        self.unlabeled_stream.set_indices(torch.nonzero(~self.labeled_mask).squeeze(1))
        pred = torch.from_numpy(outputs.get_predictions()[sel.indices]).long()
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
            "scoring_seconds": prop.scoring_seconds,
            "selection_seconds": prop.selection_seconds,
            "selection_info": sel.info,
            "pool_mean_free_energy": float(outputs.get_free_energy().mean()),
        }

    # -- evaluation -------------------------------------------------------------------------
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

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where the trainer stands: model, optimiser,
        ``Delta`` estimator, the strategy's and the batch streams' random states, the global
        torch CPU random state, the streams' positions, the labeled set and (when called from an
        ``epoch_end`` callback inside :meth:`run`) the progress: last finished epoch and the
        measurements so far. Only tensors and plain values (random states and measurements as
        JSON text), so ``torch.load(path, weights_only=True)`` reads a saved copy back."""
        prog = self._run_state
        progress = None
        if prog is not None:
            progress = json.dumps(
                {**prog, "result": prog["result"].to_dict()}, default=_json_default
            )
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "delta": json.dumps(self.delta.state_dict()),
            "alignment": json.dumps(
                {"log": self.alignment_log, "warnings": self.alignment_warnings}
            ),
            "strategy_rng": json.dumps(self.strategy_rng.bit_generator.state),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "streams": {
                "source": self.source_stream.state_dict(),
                "unlabeled": self.unlabeled_stream.state_dict(),
                "labeled": self.labeled_stream.state_dict(),
            },
            "labeled_mask": self.labeled_mask.clone(),
            "target_labels": self.target_labels.clone(),
            "progress": progress,
            "aux": self.aux.state_dict() if self.aux is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], progress: bool = True) -> None:
        """Restore what :meth:`state_dict` returned. With ``progress`` (and progress saved), the
        next :meth:`run` continues after the saved epoch with the saved measurements; without,
        it starts a new schedule from the restored model, optimiser and random states."""
        if state["labeled_mask"].shape != self.labeled_mask.shape:
            raise ValueError(
                f"checkpoint holds a target set of {state['labeled_mask'].shape[0]} samples, "
                f"this task has {self.labeled_mask.shape[0]}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.delta.load_state_dict(json.loads(state["delta"]))
        alignment = json.loads(state.get("alignment", '{"log": [], "warnings": []}'))
        self.alignment_log, self.alignment_warnings = alignment["log"], alignment["warnings"]
        self.strategy_rng.bit_generator.state = json.loads(state["strategy_rng"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.source_stream.load_state_dict(state["streams"]["source"])
        self.unlabeled_stream.load_state_dict(state["streams"]["unlabeled"])
        self.labeled_stream.load_state_dict(state["streams"]["labeled"])
        self.labeled_mask.copy_(state["labeled_mask"])
        self.target_labels.copy_(state["target_labels"])  # in place: the stream shares it
        self._resume = json.loads(state["progress"]) if progress and state["progress"] else None
        if self.aux is not None and state.get("aux") is not None:
            self.aux.load_state_dict(state["aux"])

    # -- the run ----------------------------------------------------------------------------
    def fea_gate_weight(self, epochs_done: float) -> float:
        """The weight of ``L_fea`` (``train.fea_gate``, :func:`eada.energy.fea_gate_weight`)
        after ``epochs_done`` epochs of this run (fractional inside an epoch), given the target
        labels so far against the plan's total; both counted over :attr:`gate_schedule` when
        this run is a segment of one (a project store's ``eada train``)."""
        t = self.cfg.train
        sched = self.gate_schedule
        share = 1.0  # counted only for the gate that reads it: this runs before every step
        planned = 0
        if t.fea_gate == "labels":
            planned = sched.planned_labels if sched else sum(p["budget"] for p in self.plan)
        if planned:  # the labeled stream holds every labeled sample: a count without an O(N) sum
            share = min(1.0, len(self.labeled_stream.indices) / planned)
        before, total = (sched.epochs_before, sched.epochs) if sched else (0, t.epochs)
        progress = min(1.0, max(0.0, (before + epochs_done) / total))
        return energy_ops.fea_gate_weight(t.fea_gate, progress, share)

    def run(self, progress: Callable[[str], None] | None = None) -> RunResult:
        """Train for ``train.epochs`` epochs with the planned rounds; return the measurements."""
        cfg = self.cfg
        start = time.perf_counter()
        result = RunResult(plan=self.plan)
        rounds_by_epoch = {p["epoch"]: p for p in self.plan}
        steps = self.steps_per_epoch()
        open_round: dict[str, Any] | None = None
        best: dict[str, Any] | None = None
        first_epoch = 1
        if self._resume is not None:  # continue after the epoch a checkpoint ended with
            first_epoch, best = self._resume["epoch"] + 1, self._resume["best"]
            result = RunResult(**{**self._resume["result"], "plan": self.plan})
            open_round = result.rounds[-1] if self._resume["open_round"] else None
            self._resume = None
        for epoch in range(first_epoch, cfg.train.epochs + 1):
            if cfg.train.loaders == "per_epoch":  # the authors' code: every loader restarts
                for stream in (self.source_stream, self.unlabeled_stream, self.labeled_stream):
                    stream.restart()
                steps = self.steps_per_epoch()  # over the current unlabeled pool
            sums: dict[str, float] = {}
            for i in range(steps):
                self.fea_weight = self.fea_gate_weight(epoch - 1 + i / steps)
                for k, v in self.train_step().items():
                    sums[k] = sums.get(k, 0.0) + v
            if self.world > 1:  # losses averaged over the ranks (each saw its own batches)
                sums = {k: float(dist_ops.all_mean(torch.tensor(v))) for k, v in sums.items()}
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
            found = self._watch_alignment(record, epoch)
            result.warnings.extend(found)
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
            for w in found if self.rank == 0 else []:  # shown before the checkpoint below
                report_alignment_runaway(w["message"], f"epoch {epoch}", progress, w["kind"])
            self._run_state = {
                "epoch": epoch,
                "result": result,
                "best": best,
                "open_round": open_round is not None,
            }
            self._emit("epoch_end", record)
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


def _json_default(value: Any) -> Any:
    """JSON for numpy scalars and arrays found in measurements."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint's progress")
