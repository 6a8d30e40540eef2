"""``eada export`` extras: the final model's prediction for every target sample
(``predictions.csv``, a pre-annotation of the whole target), what loading the exported
model needs (input shape, classes, feature statistics) and the deployable ``model.onnx``
(:func:`inference_path` builds the one inference path both ``eada.load_model`` and the ONNX
file run)."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eada.store.db import PRIVATE_DIR, PRIVATE_FILE
from eada.store.labelfiles import csv_safe, write_atomic
from eada.store.pixels import pixel_reader
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
    from eada.models.factory import build_model
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
    the target carried labels, (frozen backbones) that ``model.pt`` is the head only, and
    (feature projects) the target domain's normalisation statistics
    (:func:`feature_statistics`), so raw rows can be predicted."""
    frozen = project.cfg.data.kind == "images" and project.cfg.model.freeze_backbone
    out = {
        "input_shape": list(project.task.source.input_shape),
        "target_labeled": project.target_labeled,
        "head_only": bool(frozen),
    }
    stats = feature_statistics(project)
    if stats is not None:
        out["feature_statistics"] = stats
    return out


def feature_statistics(project: Any) -> dict[str, Any] | None:
    """A feature project's target-domain normalisation (``data.normalize`` and, for ``zscore``
    / ``l1_zscore``, the column means and standard deviations the target rows were normalised
    with: those frozen at ``eada init`` for an unlabeled target, the target file's own for a
    labeled one); ``None`` for other projects."""
    from eada.config import FeatureData
    from eada.data.features import domain_statistics, read_feature_file

    data = project.cfg.data
    if not isinstance(data, FeatureData):
        return None
    if data.normalize not in ("zscore", "l1_zscore"):
        return {"normalize": data.normalize}
    if not project.target_labeled:
        recorded = project.store.get_json("target_statistics")
        if recorded is not None:
            return dict(recorded)
        from eada.store.targets import read_unlabeled_features

        x, _ = read_unlabeled_features(Path(data.target), data.features_key)
    else:
        x, _ = read_feature_file(
            data.target, data.target_labels, data.features_key, data.labels_key
        )
    return domain_statistics(x, data.normalize)


@dataclass
class InferencePath:
    """What turns a user's input into energies, as one description both
    :func:`eada.load_model` and ``model.onnx`` follow.

    Attributes:
        net: model-ready inputs -> energies ``(N, C)`` (a frozen backbone included).
        prepare: raw inputs as ``model.onnx`` takes them -> model-ready inputs
            (:class:`~eada.models.deploy.FeatureInput`, :class:`~eada.models.deploy.PixelInput`
            or nothing).
        input_name: ``features``, ``pixels`` or ``inputs``.
        input_desc: the input's dtype, shape and meaning (metadata).
        preprocessing: the steps before the graph, in words (metadata).
        example: a batch of two raw inputs (the export's trace and check).
        transform: image models: PIL image -> normalised tensor (the test view).
        pixels: image models: PIL image -> uint8 ``(H, W, C)`` array, the graph's input.
    """

    net: nn.Module
    prepare: nn.Module
    input_name: str
    input_desc: dict[str, Any]
    preprocessing: list[str]
    example: torch.Tensor
    transform: Callable[[Any], torch.Tensor] | None = None
    pixels: Callable[[Any], np.ndarray] | None = None


def inference_path(
    cfg: Any,
    n_classes: int,
    input_shape: tuple[int, ...],
    state: dict[str, Any],
    stats: dict[str, Any] | None = None,
) -> InferencePath:
    """Build the exported model's inference path from its config (an
    :class:`~eada.config.ExperimentConfig` of a project), ``state`` (``model.pt``) and, for
    feature projects, the target's statistics (:func:`feature_statistics`).

    Raises:
        ValueError: ``zscore`` features without statistics; ``state`` does not fit the model.
    """
    from eada.models.deploy import FeatureInput, PixelInput
    from eada.models.factory import build_model
    from eada.store.config import FolderData

    data = cfg.data
    kind = data.kind
    model_cfg = cfg.model
    if kind == "images" and not model_cfg.freeze_backbone:  # every weight comes from state
        model_cfg = model_cfg.model_copy(update={"weights": None})
    net: nn.Module = build_model(model_cfg, tuple(input_shape), n_classes)
    net.load_state_dict(state)
    if kind == "features":
        how = data.normalize
        if stats is not None and stats.get("normalize", how) != how:
            raise ValueError(f"statistics for normalize {stats.get('normalize')!r}, not {how!r}")
        dim = int(np.prod(input_shape))
        return InferencePath(
            net.eval(),
            FeatureInput(how, stats),
            "features",
            {"name": "features", "dtype": "float32", "shape": ["N", dim]},
            [f"raw feature rows; the graph applies data.normalize={how!r}"],
            torch.randn(2, dim, generator=torch.Generator().manual_seed(0)).abs(),
        )
    if kind == "images":
        from eada.data.image_tasks import backbone_normalization, transform_spec
        from eada.data.transforms import build_transform

        norm = backbone_normalization(cfg.model, data.transforms.normalization)
        if cfg.model.freeze_backbone:
            from eada.models.backbones import build_backbone

            bb = build_backbone(
                cfg.model.backbone,
                cfg.model.weights,
                cfg.model.factory,
                data.transforms.normalization,
            )
            norm = bb.normalization
            net = nn.Sequential(bb.module, net)
        t = data.transforms
        steps = [
            "decode the image, convert to RGB",
            f"resize to {t.resize}x{t.resize} (bilinear, antialiased: PIL's)",
            f"resize to {t.test_resize}x{t.test_resize} (bilinear, antialiased: PIL's)",
            f"center crop {t.crop}x{t.crop}",
            "uint8 array (H, W, 3); the graph scales to [0, 1] and normalises with "
            f"mean {list(norm.mean)} and std {list(norm.std)} ({norm.name})",
        ]
        return InferencePath(
            net.eval(),
            PixelInput(norm.mean, norm.std),
            "pixels",
            {"name": "pixels", "dtype": "uint8", "shape": ["N", t.crop, t.crop, 3], "mode": "RGB"},
            steps,
            _example_pixels(t.crop, 3),
            build_transform("test", transform_spec(data), norm),
            pixel_reader(cfg),
        )
    if isinstance(data, FolderData):
        from eada.data.transforms import fixed_size_transform

        s, c = data.image_size, data.channels
        mode = "L" if c == 1 else "RGB"
        steps = [
            f"decode the image, convert to {mode}",
            f"resize to {s}x{s} (bilinear, antialiased: PIL's)",
            f"uint8 array (H, W, {c}); the graph scales to [0, 1] and normalises with mean "
            "0.5 and std 0.5",
        ]
        return InferencePath(
            net.eval(),
            PixelInput((0.5,) * c, (0.5,) * c),
            "pixels",
            {"name": "pixels", "dtype": "uint8", "shape": ["N", s, s, c], "mode": mode},
            steps,
            _example_pixels(s, c),
            fixed_size_transform(s, c),
            pixel_reader(cfg),
        )
    return InferencePath(
        net.eval(),
        nn.Identity(),
        "inputs",
        {"name": "inputs", "dtype": "float32", "shape": ["N", *input_shape]},
        ["model-ready tensors, as the training data loader gave them"],
        torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0)),
    )


def _example_pixels(side: int, channels: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (2, side, side, channels), generator=g, dtype=torch.uint8)


def onnx_export(
    cfg: Any,
    classes: list[str],
    input_shape: tuple[int, ...],
    state: dict[str, Any],
    stats: dict[str, Any] | None = None,
) -> tuple[bytes | None, dict[str, Any]]:
    """``model.onnx`` of an exported model (:mod:`eada.models.deploy`): the bytes, and what
    ``model.json`` records about it (input, preprocessing, the export check). Without the
    ``onnx`` package, or when the exporter fails or its file's probabilities differ from eager
    PyTorch's: ``None`` and the reason (``{"skipped": ...}``), and the rest of the export
    stands."""
    from eada.models.deploy import InferenceNet, onnx_metadata, onnx_model_bytes
    from eada.models.engines import onnxruntime_available

    if not onnxruntime_available():
        return None, {"skipped": "onnx/onnxruntime not installed (pip install 'eada[fast]')"}
    path = inference_path(cfg, len(classes), input_shape, state, stats)
    tau = float(cfg.train.tau)
    extra: dict[str, Any] = {"normalize": getattr(cfg.data, "normalize", "none")}
    meta = onnx_metadata(classes, tau, path.input_desc, path.preprocessing, extra)
    model = InferenceNet(path.prepare, path.net, tau)
    try:
        with tempfile.TemporaryDirectory(prefix="eada-onnx-") as work:
            data, check = onnx_model_bytes(model, path.example, path.input_name, meta, Path(work))
    except Exception as err:  # an operator the exporter cannot do, or a file that is not exact:
        first = (str(err).splitlines() or [""])[0]  # the rest of the export stands without it
        return None, {"skipped": f"no usable ONNX export ({type(err).__name__}: {first})"}
    info = {
        "input": path.input_desc,
        "preprocessing": path.preprocessing,
        "outputs": ["probabilities", "energies"],
        "check": check,
    }
    return data, info


#: the files ``eada export`` writes; a folder holding only these (or nothing) is an export that
#: ``--force`` may replace
EXPORT_FILES = frozenset(
    {
        "labels.csv",
        "labels_history.csv",
        "disputes.csv",
        "votes.csv",
        "model.pt",
        "model.json",
        "model.onnx",
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
        os.chmod(tmp, PRIVATE_DIR)  # annotator identities: the owner's only
        for name, data in files.items():
            try:
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            except OSError as err:
                raise named(OSError(err.errno, err.strerror), out / name) from None
            crash_point(f"export:{name}")
        crash_point("export:staged")
    return {name: str(out / name) for name in files}
