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

from eada.config import ExperimentConfig
from eada.store.config import FolderData
from eada.store.db import AUDIT
from eada.store.targets import StoreOptions, sample_info, target_is_labeled

QUERIED_NOTE = (
    "the model's prediction at query time vs. the human label, on the queried samples only: "
    "biased (the strategy picks samples the model finds hard)"
)
AUDIT_NOTE = (
    "audit round: samples drawn uniformly at random from the unlabeled pool, the model's "
    "prediction at the draw vs. the human label: an unbiased estimate of THAT model's accuracy "
    "on the pool it was drawn from, with a 95% Wilson interval; audit labels are never trained on"
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
    import torch

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


def _labeled_and_right(conn: sqlite3.Connection, round_id: int) -> tuple[list[Any], int]:
    """A round's selected samples with a class label in force, as ``(scores JSON, class
    name)`` rows, and how many of them the model predicted right when the round was drawn."""
    rows = conn.execute(
        "SELECT rs.scores, c.name FROM round_samples rs JOIN labels l ON "
        "l.sample_id = rs.sample_id AND NOT EXISTS (SELECT 1 FROM labels n WHERE "
        "n.supersedes = l.id) JOIN classes c ON c.id = l.class_id "
        "WHERE rs.round_id = ? AND rs.rank IS NOT NULL",
        (round_id,),
    ).fetchall()
    return rows, sum(json.loads(s)["predicted"] == name for s, name in rows)


def queried_accuracy(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Per round: how many queried samples carry a label in force, and how many of them the
    model predicted right when it selected them."""
    out = []
    for r in conn.execute(
        "SELECT id, number, epoch FROM rounds WHERE strategy != ? ORDER BY number", (AUDIT,)
    ):
        rows, hits = _labeled_and_right(conn, r["id"])
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


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``k / n`` (in [0, 1]), by
    :meth:`scipy.stats.binomtest`.

    Example:
        >>> lo, hi = wilson_interval(17, 20)
        >>> round(lo, 3), round(hi, 3)
        (0.64, 0.948)
    """
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def audit_summary(conn: sqlite3.Connection) -> dict[str, Any]:
    """Every audit round's estimate (``eada query --audit N``): per round the samples drawn,
    labeled and predicted right AT THE DRAW, the accuracy in % with its 95 % Wilson interval,
    and which model it is for (epoch, target labels it trained on, checkpoint file, pool
    size). ``latest``: the last audit round with at least one label (``None``: none yet)."""
    rounds = []
    for r in conn.execute(
        "SELECT r.id, r.number, r.epoch, r.info, c.path AS checkpoint FROM rounds r "
        "JOIN checkpoints c ON c.id = r.checkpoint_id WHERE r.strategy = ? ORDER BY r.number",
        (AUDIT,),
    ):
        drawn = conn.execute(
            "SELECT COUNT(*) FROM round_samples WHERE round_id = ? AND rank IS NOT NULL",
            (r["id"],),
        ).fetchone()[0]
        rows, hits = _labeled_and_right(conn, r["id"])
        info = json.loads(r["info"])
        entry: dict[str, Any] = {
            "round": r["number"],
            "drawn": drawn,
            "labeled": len(rows),
            "pending": drawn - len(rows),
            "predicted_right": hits,
            "accuracy": None,
            "ci95": None,
            "model": {
                "epoch": r["epoch"],
                "trained_labels": info.get("n_labeled_trained"),
                "checkpoint": r["checkpoint"],
            },
            "pool": info.get("pool"),
            "excluded_pending": info.get("excluded_pending", 0),
            "pending_round": info.get("pending_round"),
        }
        if rows:
            lo, hi = wilson_interval(hits, len(rows))
            entry["accuracy"] = 100.0 * hits / len(rows)
            entry["ci95"] = [100.0 * lo, 100.0 * hi]
        rounds.append(entry)
    latest = next((e for e in reversed(rounds) if e["labeled"]), None)
    return {"rounds": rounds, "latest": latest, "method": "wilson", "note": AUDIT_NOTE}


def audit_headline(r: dict[str, Any]) -> str:
    """One audit round of :func:`audit_summary` in words: what was drawn, from which pool, for
    which model (``audit round 3: 20 drawn uniformly from a pool of 275, model of epoch 12
    trained on 8 target labels``)."""
    m = r["model"]
    minus = ""
    if r.get("excluded_pending"):
        minus = (
            f" (the unlabeled pool minus the {r['excluded_pending']} samples of round "
            f"{r['pending_round']} out for labeling: the estimate is for that pool)"
        )
    return (
        f"audit round {r['round']}: {r['drawn']} drawn uniformly from a pool of {r['pool']}"
        f"{minus}, model of epoch {m['epoch']} trained on {m['trained_labels']} target labels"
    )


def class_coverage(conn: sqlite3.Connection) -> dict[str, Any]:
    """Which classes the labels in force cover: ``labeled_classes`` of ``classes``, the
    ``missing`` class names, and the ``counts`` per class (audit labels included: they are
    labels a human gave, though never trained on)."""
    names = [r[0] for r in conn.execute("SELECT name FROM classes ORDER BY id")]
    counts = dict.fromkeys(names, 0)
    for r in conn.execute(
        "SELECT c.name FROM labels l JOIN classes c ON c.id = l.class_id WHERE NOT EXISTS "
        "(SELECT 1 FROM labels n WHERE n.supersedes = l.id)"
    ):
        counts[r[0]] += 1
    return {
        "labeled_classes": sum(1 for v in counts.values() if v),
        "classes": len(names),
        "missing": [n for n, v in counts.items() if not v],
        "counts": counts,
    }


def pool_predictions(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The predicted-class distribution of the pool the last active round scored (every
    sample it scored, with the model of that round): ``round``, ``epoch``, ``n`` and
    ``counts`` by class name, most frequent first; ``None`` before the first round."""
    r = conn.execute(
        "SELECT id, number, epoch FROM rounds WHERE strategy != ? ORDER BY number DESC LIMIT 1",
        (AUDIT,),
    ).fetchone()
    if r is None:
        return None
    counts: dict[str, int] = {}
    for (scores,) in conn.execute("SELECT scores FROM round_samples WHERE round_id = ?", (r[0],)):
        name = json.loads(scores)["predicted"]
        counts[name] = counts.get(name, 0) + 1
    ordered = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return {"round": r[1], "epoch": r[2], "n": sum(counts.values()), "counts": ordered}
