"""``eada export`` extras: the final model's prediction for every target sample
(``predictions.csv``, a pre-annotation of the whole target) and what loading the exported
model needs (input shape, classes)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import torch

from eada.models.factory import build_model
from eada.store.labelfiles import csv_safe, write_atomic
from eada.store.unlabeled import round_rows_extra

PREDICTION_COLUMNS = [
    "sample_id",
    "external_id",
    "domain",
    "index",
    "path",
    "external_path",
    "predicted",
    "score",
    "label",
    "label_source",
]


def final_predictions(project: Any, model_state: dict[str, Any]) -> list[dict[str, Any]]:
    """The model of ``model_state`` on every target sample: predicted class and its
    probability (``softmax(-tau E)``), next to the label in force where one was given."""
    from eada.train.evaluate import predict_energies

    task = project.task
    cfg = project.cfg
    net = build_model(cfg.model, task.source.input_shape, len(project.classes))
    net.load_state_dict(model_state)
    e = predict_energies(net, task.target, None, cfg.train.eval_batch_size, "cpu")
    p = torch.softmax(-cfg.train.tau * e, dim=1)
    score, pred = p.max(dim=1)
    labels = {r["sample_id"]: r for r in project.store.current_labels()}
    extra = round_rows_extra(project.store.conn)
    rows = []
    for s in project.store.samples("target"):
        k = s["position"]
        lab = labels.get(s["id"])
        rows.append(
            {
                "sample_id": s["id"],
                **{"external_id": None, "external_path": None, **extra.get(s["id"], {})},
                "domain": s["domain"],
                "index": k,
                "path": s["path"],
                "predicted": project.classes[int(pred[k])],
                "score": round(float(score[k]), 6),
                "label": None if lab is None else lab["class_name"],
                "label_source": None if lab is None else lab["source"],
            }
        )
    return rows


def predictions_csv(project: Any, model_state: dict[str, Any]) -> str:
    """The text of ``predictions.csv`` (:data:`PREDICTION_COLUMNS`; text cells
    spreadsheet-safe)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=PREDICTION_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in final_predictions(project, model_state):
        w.writerow({k: "" if v is None else csv_safe(v) for k, v in r.items()})
    return buf.getvalue()


def write_predictions(project: Any, model_state: dict[str, Any], out: Path) -> Path:
    """``out/predictions.csv`` (:func:`predictions_csv`), written atomically."""
    path = out / "predictions.csv"
    write_atomic(path, predictions_csv(project, model_state))
    return path


def model_meta(project: Any) -> dict[str, Any]:
    """What :func:`eada.load_model` needs beyond the config: the model's input shape, whether
    the target carried labels, and (frozen backbones) that ``model.pt`` is the head only."""
    frozen = project.cfg.data.kind == "images" and project.cfg.model.freeze_backbone
    return {
        "input_shape": list(project.task.source.input_shape),
        "target_labeled": project.target_labeled,
        "head_only": bool(frozen),
    }


#: the files ``eada export`` writes; a folder holding only these (or nothing) is an export that
#: ``--force`` may replace
EXPORT_FILES = frozenset(
    {
        "labels.csv",
        "labels_history.csv",
        "disputes.csv",
        "model.pt",
        "model.json",
        "predictions.csv",
    }
)


def check_export_target(out: Path, force: bool) -> None:
    """Refuse an ``--out`` that would lose data: an existing file; a folder holding files that
    are not an export's (even with ``force``); a folder holding an export, unless ``force``.

    Raises:
        StoreError: naming ``out`` and what it holds.
    """
    from eada.store.base import StoreError

    if out.exists() and not out.is_dir():
        raise StoreError(f"--out {out} is an existing file; give a folder to export into")
    if not out.is_dir():
        blocked = next((p for p in out.absolute().parents if p.exists()), None)
        if blocked is not None and not blocked.is_dir():
            raise StoreError(
                f"--out {out}: its parent {blocked} is a file, not a folder; give a folder "
                "to export into"
            )
        return
    held = sorted(p.name for p in out.iterdir())
    if not held:
        return
    foreign = [n for n in held if n not in EXPORT_FILES]
    shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
    if foreign:
        raise StoreError(
            f"--out {out} holds files that are not part of an eada export ({shown}): it is not "
            "replaced, even with --force; give another --out"
        )
    if not force:
        raise StoreError(
            f"--out {out} already holds an export ({shown}): give --force to replace it, or "
            "another --out"
        )


def write_export(out: Path, files: dict[str, bytes]) -> dict[str, str]:
    """Write an export's ``files`` (name -> bytes) into a staging folder beside ``out`` and move
    it into place (:func:`eada.runs.staged_folder`): ``out`` is the previous export or the new
    one, whole. Returns the final path of each file.

    Raises:
        OSError: a write failed (a full disk), naming the file in ``out``; ``out`` unchanged.
    """
    from eada.runs import named, staged_folder
    from eada.store.checkpoints import crash_point

    with staged_folder(out) as tmp:
        for name, data in files.items():
            try:
                (tmp / name).write_bytes(data)
            except OSError as err:
                raise named(OSError(err.errno, err.strerror), out / name) from None
            crash_point(f"export:{name}")
        crash_point("export:staged")
    return {name: str(out / name) for name in files}
