"""Checkpoints of the trainer: everything needed to continue exactly where it stands (a part of
:class:`~eada.train.loop.ActiveDATrainer`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from eada.train.base import TrainerBase


class StateMixin(TrainerBase):
    """``state_dict`` / ``load_state_dict`` of the trainer."""

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


def _json_default(value: Any) -> Any:
    """JSON for numpy scalars and arrays found in measurements."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint's progress")
