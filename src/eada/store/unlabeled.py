"""What a project may claim about accuracy, and the per-sample extras of its exports.

An unlabeled target has placeholder labels (class 0) that nothing may read: the store drops
every accuracy the trainer computed from them before recording metrics, and removes it from
the progress lines. Accuracy is reported only where labels exist:

* ``heldout``: a labeled held-out target split (an honest estimate);
* ``target``: the target's own labels, where the data carries them (class folders);
* ``queried``: the model's prediction AT QUERY TIME against the human label, on the queried
  samples only. It is biased (the strategy picks samples the model finds hard, and only
  those), and named so everywhere it appears.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import torch

from eada.config import ExperimentConfig
from eada.store.config import FolderData
from eada.store.targets import StoreOptions, sample_info, target_is_labeled

QUERIED_NOTE = (
    "the model's prediction at query time vs. the human label, on the queried samples only: "
    "biased (the strategy picks samples the model finds hard)"
)
HELDOUT_NOTE = "labeled held-out target split: an unbiased estimate"
TARGET_NOTE = "the target's own labels (given with the data)"
_GUESSED = ("target", "target_unlabeled")
_LINE = re.compile(r"\s*target acc \S+")


def resolve_target(
    cfg: ExperimentConfig, options: StoreOptions | None
) -> tuple[StoreOptions, bool]:
    """``options`` with ``target`` resolved to ``labeled``/``unlabeled``, and that as a bool."""
    options = options or StoreOptions()
    data: Any = cfg.data
    if isinstance(data, FolderData):
        labeled = target_is_labeled(Path(data.target), options.target)
    elif data.kind in ("images", "features"):
        labeled = target_is_labeled(Path(data.target), options.target, data.kind)
    else:
        if options.target == "unlabeled":
            raise ValueError(f"data.kind {data.kind!r} has no unlabeled-target form")
        labeled = True
    resolved = options.model_copy(update={"target": "labeled" if labeled else "unlabeled"})
    return resolved, labeled


def options_json(options: StoreOptions) -> dict[str, Any]:
    """The ``store`` section as recorded in the project config."""
    return options.model_dump(mode="json")


def hide_guessed_accuracy(value: Any) -> Any:
    """Metrics (a dict) without the target accuracies, or a progress line without
    ``target acc X%``: on an unlabeled target they come from placeholder labels."""
    if isinstance(value, str):
        return _LINE.sub("", value)
    return {k: v for k, v in value.items() if k not in _GUESSED}


def predicted_scores(trainer: Any, prop: Any) -> dict[int, float]:
    """``{pool position: probability of the predicted class}`` (``softmax(-tau E)``) for the
    selected samples only (one pass over the batch)."""
    from eada.train.evaluate import predict_energies

    if len(prop.chosen) == 0:
        return {}
    e = predict_energies(
        trainer.model,
        trainer.task.target,
        prop.chosen,
        trainer.cfg.train.eval_batch_size,
        trainer.device,
    )
    p = torch.softmax(-trainer.cfg.train.tau * e, dim=1).max(dim=1).values
    return {
        int(j): round(float(v), 6) for j, v in zip(prop.selection.indices.tolist(), p, strict=True)
    }


def round_rows_extra(conn: sqlite3.Connection) -> dict[int, dict[str, Any]]:
    """``{sample id: {"external_id", "external_path"}}`` the user gave at init."""
    return {
        sid: {"external_id": i, "external_path": p} for sid, (i, p) in sample_info(conn).items()
    }


def external_ids(conn: sqlite3.Connection) -> dict[str, int]:
    """``{the user's id: sample id}`` of the target samples that have one."""
    return {i: sid for sid, (i, _) in sample_info(conn).items() if i is not None}


def queried_accuracy(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Per round: how many queried samples carry a label in force, and how many of them the
    model predicted right when it selected them."""
    out = []
    for r in conn.execute("SELECT id, number, epoch FROM rounds ORDER BY number"):
        rows = conn.execute(
            "SELECT rs.scores, c.name FROM round_samples rs JOIN labels l ON "
            "l.sample_id = rs.sample_id AND NOT EXISTS (SELECT 1 FROM labels n WHERE "
            "n.supersedes = l.id) JOIN classes c ON c.id = l.class_id "
            "WHERE rs.round_id = ? AND rs.rank IS NOT NULL",
            (r["id"],),
        ).fetchall()
        hits = sum(json.loads(s)["predicted"] == name for s, name in rows)
        out.append(
            {
                "round": r["number"],
                "epoch": r["epoch"],
                "labeled": len(rows),
                "predicted_right": hits,
                "accuracy": 100.0 * hits / len(rows) if rows else None,
            }
        )
    return out


def accuracy_summary(project: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Every accuracy the project can measure, each with what it is measured on; ``None``
    where nothing can be measured."""
    last = next((h for h in reversed(history) if "heldout_accuracy" in h), None)
    out: dict[str, Any] = {
        "heldout": None
        if last is None
        else {"accuracy": last["heldout_accuracy"], "epoch": last["epoch"], "note": HELDOUT_NOTE},
        "target": None,
        "queried": None,
        "target_labeled": project.target_labeled,
    }
    if project.target_labeled:
        tl = next((h for h in reversed(history) if "target_accuracy" in h), None)
        if tl is not None:
            out["target"] = {
                "accuracy": tl["target_accuracy"],
                "epoch": tl["epoch"],
                "note": TARGET_NOTE,
            }
    rounds = queried_accuracy(project.store.conn)
    n = sum(r["labeled"] for r in rounds)
    if n:
        hits = sum(r["predicted_right"] for r in rounds)
        out["queried"] = {
            "accuracy": 100.0 * hits / n,
            "n": n,
            "rounds": rounds,
            "note": QUERIED_NOTE,
        }
    return out
