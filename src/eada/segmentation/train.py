"""Round-based Active DA for semantic segmentation (paper Alg. 1 over whole images).

Every iteration draws a source batch, an unlabeled-target batch and, once labels exist, a
labeled-target batch, and minimises

    loss = delta_s * NLL(source pixels) + delta_t * NLL(labeled target pixels)
           + gamma * mean_{unlabeled target pixels} max(0, F_p - Delta)

with :func:`eada.energy.energy_nll` on every labeled pixel (label 255 ignored; energies
bilinearly upsampled to the label's size), :func:`eada.energy.free_energy_alignment_loss` on every
pixel of the unlabeled batch, and ``Delta`` the running mean of the source pixels' free energy
(:class:`eada.energy.DeltaEstimator`). Free energies are taken at the head's output resolution
for source and target alike. SGD (momentum 0.9, weight decay 1e-4) with the poly schedule
``lr * (1 - i / iterations) ** 0.9``; the head at ``head_lr_mult`` times the rate.

After each iteration listed in ``active.rounds_at`` the model scores every unlabeled target
image (:func:`eada.segmentation.scoring.score_images`), the strategy picks whole images
(:func:`eada.segmentation.scoring.select_images`), and their label maps join the labeled set.
mIoU and per-class IoU on the validation split are recorded at every round and at the end.

Every ``train.log_every`` iterations (and at each evaluation) the window's means of ``Delta``,
``L_fea`` and the source NLL join ``results["history"]``, and the classification trainer's
checks run on them, one log window standing for one epoch: the ``L_fea`` scale runaway
(:func:`eada.energy.alignment_runaway`) and the slow drift of ``Delta``
(:func:`eada.energy.alignment_drift`). Each warns at most once a run, naming the iteration and
the numbers, and is kept in ``results["warnings"]`` (and so in the summary and the command's
output).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from eada import energy as energy_ops
from eada.runs import (
    collect_warnings,
    open_seed_folder,
    summarize,
)
from eada.segmentation.config import SegActiveConfig, SegExperimentConfig, SegOptimConfig
from eada.segmentation.data import (
    IGNORE_INDEX,
    ImagesOnly,
    SegDataset,
    SegTask,
    load_seg_task,
    seg_data_inputs,
)
from eada.segmentation.metrics import ConfusionMatrix
from eada.segmentation.model import build_seg_model
from eada.segmentation.scoring import flatten_pixels, score_images, select_images
from eada.strategies import BudgetTooLargeError, stage_sizes
from eada.train.loop import (
    record_alignment_drift,
    record_alignment_runaway,
    report_alignment_runaway,
    resolve_device,
)

#: the drift warning's advice here (the classification default, ``normalized``, is not offered)
DRIFT_REMEDY = (
    "Segmentation has no normalized alignment: lower train.gamma (docs/segmentation.md, "
    "'Training warnings')."
)


def poly_lr(base_lr: float, iteration: int, max_iterations: int, power: float = 0.9) -> float:
    """The 'poly' schedule ``base_lr * (1 - iteration / max_iterations) ** power``.

    Example:
        >>> poly_lr(2.5e-4, 0, 100), round(poly_lr(1.0, 50, 100), 4)
        (0.00025, 0.5359)
    """
    if not 0 <= iteration <= max_iterations:
        raise ValueError(f"iteration {iteration} outside 0..{max_iterations}")
    return base_lr * (1.0 - iteration / max_iterations) ** power


def build_seg_optimizer(cfg: SegOptimConfig, model: nn.Module) -> torch.optim.SGD:
    """SGD over two groups: ``model.backbone`` at ``lr`` and the rest at ``lr * head_lr_mult``;
    each group keeps its multiplier in ``group["lr_mult"]`` for the poly schedule. Frozen
    parameters (frozen batch norm) are left out."""
    backbone = getattr(model, "backbone", None)
    bb_ids = {id(p) for p in backbone.parameters()} if isinstance(backbone, nn.Module) else set()
    bb = [p for p in model.parameters() if id(p) in bb_ids and p.requires_grad]
    rest = [p for p in model.parameters() if id(p) not in bb_ids and p.requires_grad]
    groups = [
        {"params": ps, "lr": cfg.lr * m, "lr_mult": m}
        for ps, m in ((bb, 1.0), (rest, cfg.head_lr_mult))
        if ps
    ]
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def plan_rounds(active: SegActiveConfig, n_target: int) -> list[dict[str, Any]]:
    """Per-round image budgets: after round ``r`` of ``R``,
    ``ceil(budget_total * n_target * r / R)`` images are labeled in all; the EADA stage sizes are
    checked for every round.

    Example:
        >>> from eada.segmentation.config import SegActiveConfig
        >>> [p["budget"] for p in plan_rounds(SegActiveConfig(budget_total=0.05), 2975)]
        [30, 30, 30, 29, 30]

    Raises:
        ValueError: a round would get no image, or EADA's step 1 keeps fewer than the budget.
    """
    if not active.enabled:
        return []
    if n_target < 1:
        raise ValueError("the target pool is empty")
    total = Fraction(str(active.budget_total)) * n_target
    n_rounds = len(active.rounds_at)
    plan, done, pool = [], 0, n_target
    for r, it in enumerate(active.rounds_at, start=1):
        cumulative = math.ceil(total * r / n_rounds)
        budget = cumulative - done
        try:
            if budget < 1:
                raise ValueError(
                    f"budget_total {active.budget_total} of {n_target} target images "
                    f"({float(total):.2f}) is too small to split over {n_rounds} rounds"
                )
            if active.strategy == "eada":
                n1, _ = stage_sizes(pool, budget, active.alpha1, "paper")
            elif budget > pool:
                raise BudgetTooLargeError(
                    f"budget {budget} is larger than the unlabeled pool ({pool} images)"
                )
            else:
                n1 = pool
        except ValueError as err:
            raise ValueError(f"round {r} (iteration {it}): {err}") from None
        plan.append(
            {"round": r, "iteration": it, "pool_before": pool, "stage1": n1, "budget": budget}
        )
        done, pool = cumulative, pool - budget
    return plan


class ImageStream:
    """Endless shuffled batches of ``dataset[indices]`` through a :class:`DataLoader` (workers
    persist across passes; a new pass reshuffles)."""

    def __init__(
        self,
        dataset: SegDataset | ImagesOnly,
        indices: np.ndarray,
        batch_size: int,
        generator: torch.Generator,
        num_workers: int = 0,
    ) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.generator, self.num_workers = generator, num_workers
        self.set_indices(indices)

    def set_indices(self, indices: np.ndarray) -> None:
        """Replace the sampled set; the next batch starts a new pass."""
        self.indices = np.asarray(indices, dtype=np.int64)
        self._loader: DataLoader[Any] | None = None
        self._it: Iterator[Any] | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(images, labels)`` batch (full batches while the set has one)."""
        if len(self.indices) == 0:
            raise RuntimeError("image stream over an empty set")
        for _ in range(2):
            if self._loader is None:
                self._loader = DataLoader(
                    Subset(self.dataset, self.indices.tolist()),
                    batch_size=min(self.batch_size, len(self.indices)),
                    shuffle=True,
                    drop_last=True,
                    generator=self.generator,
                    num_workers=self.num_workers,
                    persistent_workers=self.num_workers > 0,
                )
            if self._it is None:
                self._it = iter(self._loader)
            try:
                x, y, _ = next(self._it)
                return x, y
            except StopIteration:
                self._it = None
        raise RuntimeError("data loader yielded no batch")  # pragma: no cover


def pixel_nll(energies: torch.Tensor, labels: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Mean energy NLL over the labeled pixels (label 255 ignored), energies upsampled to the
    label's size: ``mean_{p: y_p != 255} [E_p(y_p) - F_p]`` (:func:`eada.energy.energy_nll`).

    Example:
        >>> E = torch.zeros(1, 2, 2, 2)
        >>> round(float(pixel_nll(E, torch.tensor([[[0, 1], [255, 255]]]))), 4)  # log 2
        0.6931
    """
    if energies.shape[2:] != labels.shape[1:]:
        energies = F.interpolate(
            energies, size=labels.shape[1:], mode="bilinear", align_corners=False
        )
    rows = flatten_pixels(energies)
    y = labels.reshape(-1)
    keep = y != IGNORE_INDEX
    if not bool(keep.any()):
        return energies.sum() * 0.0
    return energy_ops.energy_nll(rows[keep], y[keep], tau=tau)


@torch.no_grad()
def evaluate_segmentation(
    model: nn.Module,
    dataset: SegDataset,
    device: torch.device,
    class_names: tuple[str, ...],
    batch_size: int = 1,
    num_workers: int = 0,
) -> dict[str, Any]:
    """mIoU, per-class IoU and pixel accuracy (percent) of ``model`` on every image of
    ``dataset`` (uncropped); energies are upsampled to each label's resolution."""
    full = copy.copy(dataset).with_crop(None)
    loader = DataLoader(full, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    cm = ConfusionMatrix(dataset.num_classes)
    model.eval()
    for x, y, _ in loader:
        e = model(x.to(device))
        e = F.interpolate(e, size=y.shape[1:], mode="bilinear", align_corners=False)
        cm.update(e.argmin(dim=1), y)
    return cm.summary(class_names)


class SegActiveTrainer:
    """One segmentation Active DA run: training, image-selection rounds, evaluation.

    Args:
        cfg: the validated config.
        task: source, target pool and validation split.
        model: the energy network; built from ``cfg.model`` when ``None``.

    The target pool's labels are read only for images the strategy selected (a simulated
    annotator labeling whole images); ``results["rounds"][r]["selected_ids"]`` names them.
    """

    def __init__(
        self, cfg: SegExperimentConfig, task: SegTask, model: nn.Module | None = None
    ) -> None:
        task.check()
        self.cfg, self.task = cfg, task
        self.device = resolve_device(cfg.device)
        self.plan = plan_rounds(cfg.active, len(task.target))
        torch.manual_seed(cfg.seed)
        if model is None:
            model = build_seg_model(cfg.model, task.num_classes)
        self.model = model.to(self.device)
        self.optimizer = build_seg_optimizer(cfg.optim, self.model)
        self.delta = energy_ops.DeltaEstimator(
            cfg.train.delta_mode, cfg.train.delta_momentum, seed=cfg.seed + 1
        )
        self.strategy_rng = np.random.default_rng(cfg.seed + 2)
        gen = torch.Generator().manual_seed(cfg.seed + 3)
        workers = getattr(cfg.data, "num_workers", 0)
        self.workers = workers
        n_t = len(task.target)
        self.labeled = np.zeros(n_t, dtype=bool)
        bs = cfg.train.batch_size
        self.source_stream = ImageStream(task.source, np.arange(len(task.source)), bs, gen, workers)
        self.unlabeled_stream = ImageStream(
            ImagesOnly(task.target), np.arange(n_t), bs, gen, workers
        )
        self.labeled_stream = ImageStream(task.target, np.empty(0, np.int64), bs, gen, workers)
        self.iteration = 0

    def _set_lr(self) -> float:
        o = self.cfg.optim
        lr = poly_lr(o.lr, self.iteration, self.cfg.train.iterations, o.poly_power)
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g["lr_mult"]
        return lr

    def train_step(self) -> dict[str, float]:
        """One SGD step on a source, an unlabeled-target and a labeled-target batch."""
        t, dev = self.cfg.train, self.device
        lr = self._set_lr()
        self.model.train()
        xs, ys = self.source_stream.next()
        e_s = self.model(xs.to(dev))
        loss_s = pixel_nll(e_s, ys.to(dev), t.tau)
        delta = self.delta.update(
            energy_ops.alignment_free_energy(flatten_pixels(e_s.detach()), t.alignment, t.tau)
        )
        loss = t.delta_s * loss_s
        out = {"loss_source": float(loss_s.detach()), "delta": delta, "lr": lr}
        if t.gamma > 0 and len(self.unlabeled_stream):
            xu, _ = self.unlabeled_stream.next()  # ImagesOnly: labels are never read
            e_u = self.model(xu.to(dev))
            loss_u = energy_ops.free_energy_alignment_loss(
                flatten_pixels(e_u), delta, t.tau, alignment=t.alignment
            )
            loss = loss + t.gamma * loss_u
            out["loss_align"] = float(loss_u.detach())
        if len(self.labeled_stream):
            xl, yl = self.labeled_stream.next()
            loss_l = pixel_nll(self.model(xl.to(dev)), yl.to(dev), t.tau)
            loss = loss + t.delta_t * loss_l
            out["loss_target"] = float(loss_l.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss became {float(loss)} at iteration {self.iteration}; lower the learning rate"
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.iteration += 1
        out["loss"] = float(loss.detach())
        return out

    def select_round(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Score the unlabeled images, select ``plan["budget"]`` of them, label them."""
        a, t = self.cfg.active, self.cfg.train
        pool = np.flatnonzero(~self.labeled)
        scores = score_images(
            self.model,
            self.task.target,
            pool,
            self.device,
            a.free_energy_aggregation,
            a.mvsm_aggregation,
            a.top_k_share,
            t.tau,
            t.eval_batch_size,
            self.workers,
        )
        t0 = time.perf_counter()
        sel = select_images(
            scores,
            plan["budget"],
            a.strategy,
            self.strategy_rng,
            a.alpha1,
            len(self.labeled),
            a.params,
        )
        seconds = time.perf_counter() - t0
        chosen = pool[sel.indices]
        if self.labeled[chosen].any() or len(set(chosen.tolist())) != len(chosen):
            raise RuntimeError("strategy returned an already-labeled or duplicate image")
        self.labeled[chosen] = True
        self.labeled_stream.set_indices(np.flatnonzero(self.labeled))
        self.unlabeled_stream.set_indices(np.flatnonzero(~self.labeled))
        share = scores.predicted_class_share
        return {
            "round": plan["round"],
            "iteration": self.iteration,
            "strategy": a.strategy,
            "budget": len(chosen),
            "n_labeled": int(self.labeled.sum()),
            "pool_before": len(pool),
            "selected": chosen.tolist(),
            "selected_ids": [self.task.target.ids[i] for i in chosen],
            "scoring_seconds": scores.seconds,
            "selection_seconds": seconds,
            "selection_info": {**sel.info, **scores.info},
            "selected_free_energy": scores.free_energy[sel.indices].tolist(),
            "selected_mvsm": scores.mvsm[sel.indices].tolist(),
            "pool_mean_free_energy": float(scores.free_energy.mean()),
            "selected_mean_free_energy": float(scores.free_energy[sel.indices].mean()),
            "pool_mean_mvsm": float(scores.mvsm.mean()),
            "selected_mean_mvsm": float(scores.mvsm[sel.indices].mean()),
            "pool_predicted_class_share": share.mean(axis=0).tolist(),
            "selected_predicted_class_share": share[sel.indices].mean(axis=0).tolist(),
        }

    def evaluate(self) -> dict[str, Any]:
        """mIoU and per-class IoU (percent) on the validation split."""
        return evaluate_segmentation(
            self.model,
            self.task.val,
            self.device,
            self.task.class_names,
            self.cfg.train.eval_batch_size,
            self.workers,
        )

    def run(self, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Train for ``train.iterations`` with the planned rounds; return the measurements."""
        cfg = self.cfg
        start = time.perf_counter()
        rounds_at = {p["iteration"]: p for p in self.plan}
        rounds: list[dict[str, Any]] = []
        history: list[dict[str, Any]] = []
        found: list[dict[str, Any]] = []  # training warnings (the runaway, the slow drift)
        open_round: dict[str, Any] | None = None
        sums: dict[str, float] = {}
        n_sum = 0
        total = cfg.train.iterations
        while self.iteration < total:
            for k, v in self.train_step().items():
                sums[k] = sums.get(k, 0.0) + v
            n_sum += 1
            it = self.iteration
            is_round = it in rounds_at
            evaluate = (
                is_round or it == total or (cfg.train.eval_every and it % cfg.train.eval_every == 0)
            )
            if it % cfg.train.log_every == 0 or evaluate:
                record: dict[str, Any] = {
                    "iteration": it,
                    **{k: v / n_sum for k, v in sums.items()},
                }
                sums, n_sum = {}, 0
                if evaluate:
                    record["val"] = self.evaluate()
                    if open_round is not None and (is_round or it == total):
                        open_round["after_training"] = {"iteration": it, **record["val"]}
                        open_round = None
                    if is_round:
                        if not rounds:
                            rounds.append(
                                {
                                    "round": 0,
                                    "iteration": it,
                                    "n_labeled": 0,
                                    "after_training": {"iteration": it, **record["val"]},
                                }
                            )
                        rec = self.select_round(rounds_at[it])
                        rounds.append(rec)
                        open_round = rec
                history.append(record)
                # the classification checks on the log windows' means, each once a run
                at, unit = {"iteration": it}, "log windows"
                runaway = record_alignment_runaway(history, found, at, unit=unit)
                drift = record_alignment_drift(history, found, at, unit=unit, remedy=DRIFT_REMEDY)
                new = [("alignment_runaway", runaway), ("alignment_drift", drift)]
                if progress is not None:
                    miou = f"{record['val']['miou']:.2f}" if "val" in record else "-"
                    progress(
                        f"iter {it}/{total} loss {record.get('loss', 0.0):.4f} "
                        f"val mIoU {miou} labeled {int(self.labeled.sum())}"
                    )
                for kind, message in new:
                    if message is not None:
                        report_alignment_runaway(message, f"iteration {it}", progress, kind)
        final = history[-1]["val"]
        return {
            "plan": self.plan,
            "rounds": rounds,
            "history": history,
            "final": {"protocol": "validation split, last iteration", **final},
            "delta": self.delta.value,
            "labeled_indices": np.flatnonzero(self.labeled).tolist(),
            "seconds": time.perf_counter() - start,
            "warnings": found,
        }


def run_seg_once(
    cfg: SegExperimentConfig,
    task: SegTask | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train one seed; returns ``{"seed", "config", "results"}`` (JSON-ready)."""
    task = task if task is not None else load_seg_task(cfg.data)
    result = SegActiveTrainer(cfg, task).run(progress)
    return {"seed": cfg.seed, "config": cfg.resolved(), "results": result}


def summarize_seg_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean +- std over seeds of the final mIoU, per-class IoU and the mIoU after each round;
    the runs' training warnings, each with its seed."""
    final = [r["results"]["final"] for r in runs]
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "rounds": []}
    out["final"] = {
        "miou": {"values": [f["miou"] for f in final], **summarize([f["miou"] for f in final])}
    }
    out["final"]["per_class_iou"] = {
        c: summarize([f["per_class_iou"][c] for f in final]) for c in final[0]["per_class_iou"]
    }
    n_rounds = min(len(r["results"]["rounds"]) for r in runs)
    for i in range(n_rounds):
        recs = [r["results"]["rounds"][i] for r in runs]
        row: dict[str, Any] = {"round": i, "n_labeled": [x["n_labeled"] for x in recs]}
        vals = [x["after_training"]["miou"] for x in recs if "after_training" in x]
        if len(vals) == len(recs):
            row["miou"] = {"values": vals, **summarize(vals)}
        out["rounds"].append(row)
    out["warnings"] = collect_warnings(runs)
    return out


def run_seg_seeds(
    make_config: Callable[[int], SegExperimentConfig],
    seeds: list[int],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every seed, appending each finished run to ``OUT/runs.jsonl`` (seeds already there
    are skipped, so an interrupted job resumes), and write ``config.json``, ``meta.json`` and the
    summary ``results.json`` with :mod:`eada.runs`.

    A stored run is reused only for the same resolved config (every key but the seed; a key
    the record lacks is compared with the value the code ran before it existed, else refused:
    :class:`~eada.runs.OtherConfigError`) and the same data (the digests of
    :func:`eada.segmentation.data.seg_data_inputs`, else :class:`~eada.runs.OtherDataError`
    naming each input that differs), both checked before any work. Each new record carries
    its ``inputs`` and its own ``meta`` (commit, command, time); reused runs keep theirs,
    ``progress`` is told "reused N runs made at ... by commit ...", and ``meta.json``,
    ``config.json`` and ``results.json`` are rewritten only when something was trained (the
    summary also when it is missing or differs)."""
    configs = {s: make_config(s) for s in seeds}
    threads = torch.get_num_threads()
    wanted = configs[seeds[0]].threads
    if wanted is not None:
        torch.set_num_threads(wanted)
    try:
        return _run_seg_seeds(configs, seeds, out_dir, progress)
    finally:
        torch.set_num_threads(threads)


def _run_seg_seeds(
    configs: dict[int, SegExperimentConfig],
    seeds: list[int],
    out_dir: Path,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    first = configs[seeds[0]]
    inputs = seg_data_inputs(first.data, first.model)  # the data's identity, taken once
    folder = open_seed_folder(out_dir, first.resolved(), inputs, seeds, progress)
    task = None
    for seed in folder.todo:
        if progress:
            progress(f"seed {seed}")
        task = task if task is not None else load_seg_task(configs[seed].data)
        folder.record(seed, run_seg_once(configs[seed], task, progress))
    summary = {
        "name": configs[seeds[0]].name,
        "task": "segmentation",
        "strategy": configs[seeds[0]].active.strategy,
        **summarize_seg_runs([folder.done[s] for s in seeds]),
    }
    folder.write_results(summary)
    return summary
