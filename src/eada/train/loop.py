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

The trainer is put together from its parts, one module a seam: :mod:`eada.train.streams` (batch
streams), :mod:`eada.train.step` (the optimisation step, optimiser, epoch length, the gate of
``L_fea``), :mod:`eada.train.plan` (the round plan), :mod:`eada.train.selection` (pool scoring and
rounds), :mod:`eada.train.evaluate` (evaluation), :mod:`eada.train.state` (checkpoints and resume)
and :mod:`eada.train.base` (the attributes they share, the training-components interface, the run's
records). This module builds the trainer and runs the schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from eada import distributed as dist_ops
from eada import energy as energy_ops
from eada.config import ExperimentConfig
from eada.data.tasks import Task
from eada.models import build_model
from eada.threads import configure_for_model
from eada.train.base import (
    COMPONENT_BUILDERS,
    ComponentsBuilder,
    Proposal,
    RunResult,
    TrainingComponents,
    register_components_builder,
)
from eada.train.evaluate import EvaluationMixin
from eada.train.forward import StepForward
from eada.train.oracle import Oracle, SimulatedOracle
from eada.train.plan import GateSchedule, round_plan
from eada.train.selection import SelectionMixin
from eada.train.state import StateMixin
from eada.train.step import (
    StepMixin,
    build_optimizer,
    compile_mode_on,
    record_alignment_drift,
    record_alignment_runaway,
    report_alignment_runaway,
    resolve_device,
    set_cudnn_benchmark,
)
from eada.train.streams import BatchStream, unlabeled_view

__all__ = [  # the names that lived here before the split stay importable from here
    "COMPONENT_BUILDERS",
    "ActiveDATrainer",
    "BatchStream",
    "Callback",
    "ComponentsBuilder",
    "GateSchedule",
    "Proposal",
    "RunResult",
    "TrainingComponents",
    "build_optimizer",
    "record_alignment_drift",
    "record_alignment_runaway",
    "register_components_builder",
    "report_alignment_runaway",
    "resolve_device",
    "round_plan",
    "unlabeled_view",
]

Callback = Callable[[str, "ActiveDATrainer", dict[str, Any]], None]


class ActiveDATrainer(StepMixin, SelectionMixin, EvaluationMixin, StateMixin):
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
        # the step's forward passes through torch.compile (train.compile, train.compile_mode)
        mode = compile_mode_on(cfg.train.effective_compile_mode, self.device)
        if mode is not None:
            self._step = torch.compile(self._step, mode=mode)  # type: ignore[assignment]
        self.cuda_graphs = mode == "reduce-overhead"  # a step begins a new CUDA-graph replay
        #: what the step runs with on this device (the run's results record it)
        self.step_setup: dict[str, Any] = {
            "device": str(self.device),
            "forward": cfg.train.forward,
            "amp": "bfloat16" if amp else None,
            "channels_last": cfg.train.channels_last,
            "compile_mode": mode,
            "cudnn_benchmark": set_cudnn_benchmark(cfg.train.cudnn_benchmark, self.device),
        }
        if self.world > 1:  # one DDP forward call a step, whichever forward mode runs inside
            from torch.nn.parallel import DistributedDataParallel

            cuda = self.device.type == "cuda"
            ids = [self.device.index or torch.cuda.current_device()] if cuda else None
            self._step = DistributedDataParallel(self._step, device_ids=ids)
            dist_ops.on_teardown(self)  # teardown() calls release_group()
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

    def release_group(self) -> None:
        """Drop the ``DistributedDataParallel`` wrapper of the step, and with it this trainer's
        reference to the process group (:func:`eada.distributed.teardown` calls it before it
        destroys the group). Call it when no distributed work follows: a later step would no
        longer average gradients over the ranks."""
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(self._step, DistributedDataParallel):
            self._step = self._step.module

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
        first_epoch = 1
        if self._resume is not None:  # continue after the epoch a checkpoint ended with
            first_epoch, best = self._resume["epoch"] + 1, self._resume["best"]
            result = RunResult(**{**self._resume["result"], "plan": self.plan})
            open_round = result.rounds[-1] if self._resume["open_round"] else None
            self._resume = None
        else:
            gs = self.gate_schedule  # a project store's later segment: its source stage is done
            if gs is None or gs.epochs_before == 0:
                self.train_source_epochs()  # LADA's source stage (train.source_epochs)
            if 0 in rounds_by_epoch:  # a round before the first epoch (LADA's VisDA-2017)
                metrics = self.evaluate()
                result.rounds.append(
                    {
                        "round": 0,
                        "epoch": 0,
                        "n_labeled": 0,
                        "after_training": {"epoch": 0, **metrics},
                    }
                )
                p = rounds_by_epoch[0]
                self._emit("before_round", {"round": p["round"], "epoch": 0})
                rec = self.select_round(p["round"], 0, p["budget"])
                rec["at_selection"] = metrics
                result.rounds.append(rec)
                open_round = rec
                self._emit("after_round", rec)
                steps = self.steps_per_epoch()
        for epoch in range(first_epoch, cfg.train.epochs + 1):
            if cfg.train.loaders == "per_epoch":  # the authors' code: every loader restarts
                for stream in (self.source_stream, self.unlabeled_stream, self.labeled_stream):
                    stream.restart()
                steps = self.steps_per_epoch()  # over the current unlabeled pool
            sums: dict[str, Any] = {}
            every = self.sync_every  # 1: each step read back and checked before its update
            window: dict[str, Any] = {}
            for i in range(steps):
                self.fea_weight = self.fea_gate_weight(epoch - 1 + i / steps)
                for k, v in self._train_step(lazy=every > 1).items():
                    window[k] = window.get(k, 0.0) + v  # device tensors: no read-back
                if (i + 1) % every == 0 or i + 1 == steps:  # one read-back a window
                    if every > 1:
                        first = i + 1 - ((i % every) + 1)
                        self.check_finite(window, f"steps {first + 1}-{i + 1} of epoch {epoch}")
                    for k, v in window.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
                    window = {}
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
