"""One optimisation step of the trainer (paper Alg. 1's inner loop), its optimiser and device,
the epoch length, the gate of ``L_fea``, and the watch on ``Delta`` and ``L_fea`` (the runaway
and drift warnings)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eada import distributed as dist_ops
from eada import energy as energy_ops
from eada.config import OptimConfig
from eada.train.base import TrainerBase


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def compile_mode_on(mode: str | None, device: torch.device) -> str | None:
    """The mode ``torch.compile`` gets for ``train.compile_mode`` ``mode`` (already resolved:
    ``None`` = not compiled) on ``device``: ``reduce-overhead`` replays CUDA graphs, a CUDA
    feature, so on any other device it compiles as ``default``.

    >>> compile_mode_on("reduce-overhead", torch.device("cpu"))
    'default'
    >>> compile_mode_on("reduce-overhead", torch.device("cuda"))
    'reduce-overhead'
    >>> compile_mode_on(None, torch.device("cuda")) is None
    True
    """
    if mode == "reduce-overhead" and device.type != "cuda":
        return "default"
    return mode


def set_cudnn_benchmark(enabled: bool, device: torch.device) -> bool | None:
    """``torch.backends.cudnn.benchmark = enabled`` for a run on CUDA (set either way, so an
    earlier run in the process does not leak its choice); nothing on another device. Returns
    the value set, ``None`` where nothing was set.

    >>> set_cudnn_benchmark(True, torch.device("cpu")) is None
    True
    """
    if device.type != "cuda":
        return None
    torch.backends.cudnn.benchmark = bool(enabled)
    return bool(enabled)


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
    if cfg.schedule != "constant":
        for g in groups:  # kept in the optimiser's state (checkpoints): lr_0 and the step
            g["initial_lr"], g["schedule_step"] = g["lr"], 0
    if cfg.name == "sgd":
        return torch.optim.SGD(
            groups,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            nesterov=cfg.nesterov,
        )
    if cfg.name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adadelta(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


def apply_lr_schedule(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> None:
    """Set every parameter group's learning rate for the coming step by ``cfg.schedule``
    (:class:`~eada.config.OptimConfig`) and count the step; nothing for ``constant``.

    ``inv``: ``lr_i = lr_0 (1 + gamma i) ^ -power``, ``i`` the group's ``schedule_step`` (0 for
    the first step, kept in the optimiser's state, so a resumed run goes on where it stopped).

    Example:
        >>> from eada.config import OptimConfig
        >>> cfg = OptimConfig(name="sgd", lr=0.01, schedule="inv")
        >>> opt = build_optimizer(cfg, nn.Linear(2, 2))
        >>> lrs = []
        >>> for _ in range(3):
        ...     apply_lr_schedule(opt, cfg)
        ...     lrs.append(round(opt.param_groups[0]["lr"], 8))
        >>> lrs  # 0.01 (1 + 0.001 i) ^ -0.75
        [0.01, 0.00999251, 0.00998503]
    """
    if cfg.schedule == "constant":
        return
    for g in optimizer.param_groups:
        i = int(g.get("schedule_step", 0))
        base = float(g.setdefault("initial_lr", g["lr"]))
        g["lr"] = base * (1.0 + cfg.schedule_gamma * i) ** (-cfg.schedule_power)
        g["schedule_step"] = i + 1


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


#: the key of :meth:`StepMixin._train_step`'s lazy output counting the batches' energy rows
#: that are not finite (summed on the device; :meth:`StepMixin.check_finite` reads and drops it)
NONFINITE_ROWS = "_nonfinite_energy_rows"


class StepMixin(TrainerBase):
    """The training step and what counts it (a part of
    :class:`~eada.train.loop.ActiveDATrainer`)."""

    def train_step(self) -> dict[str, float]:
        """One optimisation step over a source, an unlabeled and a labeled-target batch; its
        losses read back (and checked finite before the update)."""
        return {k: float(v) for k, v in self._train_step(lazy=False).items()}

    @property
    def sync_every(self) -> int:
        """Steps between reading the losses back from the device (``train.sync_every``; 0 =
        1 on the CPU, 25 on CUDA; 1 under ``torchrun``, whose ranks stop together)."""
        n = self.cfg.train.sync_every
        if self.world > 1:
            return 1
        return n if n > 0 else (25 if self.device.type == "cuda" else 1)

    def _train_step(self, lazy: bool) -> dict[str, Any]:
        """:meth:`train_step`; with ``lazy`` nothing is read back from the device: the losses
        and ``Delta`` are returned as 0-dim float64 tensors on it (the caller sums them and
        checks them finite, :meth:`check_finite`), the update done without a finite check."""
        if not lazy:
            return self._step_body(False)
        with energy_ops.deferred_finite_checks():
            return self._step_body(True)

    def _step_body(self, lazy: bool) -> dict[str, Any]:
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
        if self.cuda_graphs:  # the outputs of the last step's graph replays are dead now
            torch.compiler.cudagraph_mark_step_begin()
        energies = self._step([x.to(dev, non_blocking=True) for x in batches])
        e_s = energies[0]
        loss_s = energy_ops.energy_nll(e_s, ys.to(dev), tau=t.tau)
        scale = None
        if t.alignment == "normalized":  # the joint scale of the source and unlabeled batches
            scale = energy_ops.alignment_scale(e_s, *energies[1:2] if use_u else [])
        f_s = energy_ops.alignment_free_energy(
            e_s.detach(), t.alignment, t.tau, None if scale is None else scale.detach()
        )
        delta: Any
        if lazy:
            delta = self.delta.update_on_device(f_s)
        else:
            delta = self.delta.update(dist_ops.all_mean(f_s.mean()) if self.world > 1 else f_s)

        def read(v: torch.Tensor) -> Any:  # a logged value: a float, or kept on the device
            return v.detach().double() if lazy else float(v.detach())

        loss = t.delta_s * loss_s
        out: dict[str, Any] = {"loss_source": read(loss_s), "delta": delta}
        if lazy:  # the energy functions' own check, deferred: counted here, read back later
            out[NONFINITE_ROWS] = torch.stack(
                [(~torch.isfinite(e)).any(dim=1).sum() for e in energies]
            ).sum()
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
            out["loss_align"] = read(loss_u)
            if t.fea_gate != "none":
                out["fea_weight"] = self.fea_weight
        if use_l:
            loss_l = energy_ops.energy_nll(energies[-1], yl.to(dev), tau=t.tau)
            loss = loss + t.delta_t * loss_l
            out["loss_target"] = read(loss_l)
        if self.aux is not None:  # discriminator / committee / MME entropy / critic losses
            loss_aux, aux_logs = self.aux.loss(self, xs, ys)
            loss = loss + loss_aux
            out.update(aux_logs)
        if not lazy:
            finite = bool(torch.isfinite(loss))
            if self.world > 1:  # every rank stops together (a lone raise would hang the others)
                finite = float(dist_ops.all_mean(torch.tensor(float(finite)))) == 1.0
            if not finite:
                raise FloatingPointError(f"loss became {float(loss)}; lower the learning rate")
        self.optimizer.zero_grad(set_to_none=True)
        if self.aux is not None:
            self.aux.zero_grad()
        loss.backward()  # DDP averages the model's gradients over the ranks here
        apply_lr_schedule(self.optimizer, self.cfg.optim)
        self.optimizer.step()
        if self.aux is not None:
            if self.world > 1:
                dist_ops.average_gradients(self.aux.parameters())
            self.aux.step()
            out.update(self.aux.after_step(self))  # LADA's MME: the entropy's own step
        out["loss"] = read(loss)
        return out

    @staticmethod
    def check_finite(sums: dict[str, Any], steps: str) -> None:
        """Check the device tensors :meth:`_train_step` with ``lazy`` summed over some steps
        (``steps`` names them in the message) with ONE read-back, and take their count of
        non-finite energy rows (:data:`NONFINITE_ROWS`) out of ``sums``.

        Raises:
            eada.energy.NonFiniteEnergiesError: an energy was NaN or infinite in those steps:
                the error a step read back at once (``sync_every`` 1, the CPU's default) raises.
            FloatingPointError: the energies were finite but a summed loss or ``Delta`` is not.
        """
        rows = sums.pop(NONFINITE_ROWS, None)
        keys = [k for k, v in sums.items() if isinstance(v, torch.Tensor)]
        parts = [sums[k].double().reshape(()) for k in keys]
        if rows is not None:
            parts.append(rows.double().reshape(()))
        if not parts:
            return
        host = torch.stack(parts).cpu()  # the one read-back
        n_bad = int(host[-1]) if rows is not None else 0
        if n_bad > 0:
            raise energy_ops.NonFiniteEnergiesError(
                f"energies contain NaN or infinite values ({n_bad} rows within {steps})"
            )
        if not bool(torch.isfinite(host[: len(keys)]).all()):
            bad = {k: float(v) for k, v in zip(keys, host.tolist(), strict=False)}
            raise FloatingPointError(
                f"loss became non-finite within {steps} (sums {bad}); lower the learning rate"
            )

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
        pool; ``per_epoch`` at the start of every epoch); ``train.epoch_length`` ``source``:
        the source batches (LADA's ft, RAA, LAA), ``min``: the smaller (LADA's MME, DANN),
        ``labeled``: the labeled-target batches (LADA's ft_tgt; one step while none is
        labeled)."""
        s, u = self.source_stream.batches_per_pass, self.unlabeled_stream.batches_per_pass
        how = self.cfg.train.epoch_length
        if how == "labeled":
            return max(1, self.labeled_stream.batches_per_pass)
        return s if how == "source" else max(1, min(s, u)) if how == "min" else max(s, u)

    def train_source_epochs(self) -> None:
        """``train.source_epochs`` epochs of source-only NLL (LADA's source stage), one
        source pass each, with an optimiser of their own (built like the main one); the
        source stream goes on from where they leave it."""
        t = self.cfg.train
        if t.source_epochs < 1:
            return
        opt = build_optimizer(self.cfg.optim, self.model)
        self._step.train()
        for _ in range(t.source_epochs * self.source_stream.batches_per_pass):
            xs, ys = self.source_stream.next()
            (e_s,) = self._step([xs.to(self.device, non_blocking=True)])
            loss = energy_ops.energy_nll(e_s, ys.to(self.device), tau=t.tau)
            if not bool(torch.isfinite(loss)):
                raise FloatingPointError(f"source loss became {float(loss)}; lower the lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            apply_lr_schedule(opt, self.cfg.optim)
            opt.step()

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
