"""Watching a run: progress bars with ETA and TensorBoard logs, as trainer callbacks.

Both are callbacks ``cb(event, trainer, info)`` for :class:`eada.train.ActiveDATrainer`; objects
with an ``attach(trainer)`` method are attached by :func:`eada.experiment.run_once` right after
the trainer is built (progress bars wrap the trainer's steps to count them).

* :class:`ProgressBars` - a rich progress bar over all training steps (with the time left), and a
  status line while the pool is scored, the model evaluated or statistics extracted. It shows
  nothing (and wraps nothing) when its console is not a terminal, so logs and CI output stay
  clean.
* :class:`TensorBoardLogger` - scalars (losses, Delta, accuracies, mean free energies per epoch;
  per round the labeled count, the error rate of the queried samples, selection time and the
  accuracy reached) and histograms of source and target free energies at every evaluated
  epoch. Needs the ``tensorboard`` package (``pip install 'eada[tensorboard]'``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from eada import energy as energy_ops
from eada.data.batches import report_batches
from eada.train.evaluate import predict_energies

if TYPE_CHECKING:
    from eada.train.loop import ActiveDATrainer


class ProgressBars:
    """Progress bar with ETA over a run's training steps, plus status lines for scoring,
    evaluation and statistics passes.

    Args:
        console: where to draw (default: a rich console on stderr).
        description: text in front of the bar, e.g. ``"seed 0"``.
        enabled: force on/off; by default on only when ``console`` is a terminal.

    Example:
        >>> bars = ProgressBars(description="seed 0")   # run_once(cfg, callbacks=[bars])
        >>> bars.enabled                                  # doctest: +SKIP
        False
    """

    def __init__(
        self,
        console: Console | None = None,
        description: str = "train",
        enabled: bool | None = None,
    ) -> None:
        self.console = console if console is not None else Console(stderr=True)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self.description = description
        self.progress: Progress | None = None
        self._train: TaskID | None = None

    def attach(self, trainer: ActiveDATrainer) -> None:
        """Start the bar and wrap the trainer's step, scoring and evaluation methods."""
        if not self.enabled:
            return
        total = trainer.cfg.train.epochs * trainer.steps_per_epoch()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._train = self.progress.add_task(f"{self.description} epoch 1", total=total)
        self.progress.start()
        progress, task = self.progress, self._train

        step = trainer.train_step

        @functools.wraps(step)
        def counted_step() -> dict[str, float]:
            out = step()
            progress.advance(task)
            return out

        trainer.train_step = counted_step  # type: ignore[method-assign]
        trainer.select_round = self._status(trainer.select_round, "scoring the pool")  # type: ignore[method-assign]
        trainer.evaluate = self._status(trainer.evaluate, "evaluating")  # type: ignore[method-assign]

    def _status(self, fn: Callable[..., Any], what: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            assert self.progress is not None
            progress = self.progress
            task = progress.add_task(f"  {what}", total=None)

            def on_batch(done: int, total: int) -> None:  # ETA once the batch count is known
                progress.update(task, total=total, completed=done)

            try:
                with report_batches(on_batch):
                    return fn(*args, **kwargs)
            finally:
                progress.remove_task(task)

        return wrapped

    def __call__(self, event: str, trainer: ActiveDATrainer, info: dict[str, Any]) -> None:
        """Update the description per epoch; stop drawing after the last epoch."""
        if self.progress is None or self._train is None or event != "epoch_end":
            return
        epoch = info["epoch"]
        if epoch >= trainer.cfg.train.epochs:
            self.close()
        else:
            labeled = int(trainer.labeled_mask.sum())
            self.progress.update(
                self._train,
                description=f"{self.description} epoch {epoch + 1} (labeled {labeled})",
            )

    def close(self) -> None:
        """Stop drawing (idempotent)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class TensorBoardLogger:
    """Writes a run's scalars and free-energy histograms for TensorBoard.

    Tags: ``train/<loss or delta>`` and ``<split>/<accuracy|mean_class_accuracy|
    mean_free_energy>`` per epoch, ``labeled/n`` per epoch; ``round/<n_labeled|
    selected_error_rate|selection_seconds|scoring_seconds>`` and ``round/target_accuracy``
    (accuracy with the labels of ``r`` rounds) per round; histograms
    ``free_energy/source`` and ``free_energy/target`` at every evaluated epoch.

    Args:
        log_dir: the event-file folder (``tensorboard --logdir`` its parent to compare runs).
        n_histogram: samples per domain in the free-energy histograms (a fixed subsample).
        seed: seed of that subsample.

    Raises:
        ImportError: ``tensorboard`` is not installed.

    Example:
        >>> logger = TensorBoardLogger("runs/tb/seed0")   # doctest: +SKIP
        >>> run_once(cfg, callbacks=[logger])             # doctest: +SKIP
    """

    def __init__(self, log_dir: str | Path, n_histogram: int = 2000, seed: int = 0) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "TensorBoard logging needs the 'tensorboard' package: "
                "pip install 'eada[tensorboard]'"
            ) from err
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.n_histogram = n_histogram
        self.seed = seed
        self._idx: dict[str, torch.Tensor] = {}

    def _histograms(self, trainer: ActiveDATrainer, step: int) -> None:
        for name, dom in (("source", trainer.task.source), ("target", trainer.task.target)):
            if name not in self._idx:
                rng = np.random.default_rng([self.seed, len(dom), len(self._idx)])
                pick = np.sort(rng.permutation(len(dom))[: self.n_histogram])
                self._idx[name] = torch.from_numpy(pick)
            e = predict_energies(
                trainer.model,
                dom,
                self._idx[name],
                trainer.cfg.train.eval_batch_size,
                trainer.device,
            )
            f = energy_ops.free_energy(e, trainer.cfg.train.tau)
            self.writer.add_histogram(f"free_energy/{name}", f.numpy(), step)

    def __call__(self, event: str, trainer: ActiveDATrainer, info: dict[str, Any]) -> None:
        """Log the event's numbers (see the class docstring for the tags)."""
        w = self.writer
        if event == "epoch_end":
            epoch = info["epoch"]
            for k, v in info.items():
                if k != "epoch" and isinstance(v, (int, float)):
                    w.add_scalar(f"train/{k}", v, epoch)
            w.add_scalar("labeled/n", int(trainer.labeled_mask.sum()), epoch)
            metrics = info.get("metrics", {})
            for split, m in metrics.items():
                for key in ("accuracy", "mean_class_accuracy", "mean_free_energy"):
                    if isinstance(m.get(key), (int, float)):
                        w.add_scalar(f"{split}/{key}", m[key], epoch)
            if metrics:
                self._histograms(trainer, epoch)
            if epoch == trainer.cfg.train.epochs:
                n_rounds = len(trainer.plan)
                if metrics and n_rounds:
                    w.add_scalar("round/target_accuracy", metrics["target"]["accuracy"], n_rounds)
                self.close()
        elif event == "after_round":
            r = info["round"]
            for key in ("n_labeled", "selected_error_rate", "selection_seconds", "scoring_seconds"):
                w.add_scalar(f"round/{key}", info[key], r)
            at = info.get("at_selection", {}).get("target", {})
            if "accuracy" in at:
                w.add_scalar("round/target_accuracy", at["accuracy"], r - 1)
            w.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.flush()
        self.writer.close()


def run_callbacks(
    seed: int, console: Console | None = None, tensorboard: str | Path | None = None
) -> list[Any]:
    """The watching callbacks of one seed for ``eada run``: progress bars (drawn only on a
    terminal) and, when ``tensorboard`` is a folder, a :class:`TensorBoardLogger` writing to
    ``tensorboard/seed<seed>``."""
    cbs: list[Any] = [ProgressBars(console, description=f"seed {seed}")]
    if tensorboard is not None:
        cbs.append(TensorBoardLogger(Path(tensorboard) / f"seed{seed}", seed=seed))
    return cbs
