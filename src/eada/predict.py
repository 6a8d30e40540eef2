"""``eada predict``: an exported model on new data, into a CSV.

``eada predict --model DIR INPUT... --out preds.csv [--labels truth.csv]``. The inputs are image
files, folders (every image under them, sorted) or feature files (``.npz``, ``.npy``,
``.mat``, ``.parquet``: one prediction a row). The model runs on ONNX Runtime from
``model.onnx`` where it and ``onnxruntime`` are there (``--engine auto``), else on eager
PyTorch (:func:`eada.load_model`); both give ``softmax(-tau E)``.

The CSV has one row an input: ``input`` (the image, or the feature file), ``row`` (the row of
a feature file; empty for images), ``id`` (a feature file's ``ids`` entry, or the image's file
name), ``predicted``, ``score`` (its probability) and, with ``--labels``, ``label`` and
``correct``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eada.data.images import IMAGE_EXTENSIONS

if TYPE_CHECKING:
    import numpy as np

FEATURE_SUFFIXES = (".npz", ".npy", ".mat", ".parquet")
COLUMNS = ["input", "row", "id", "predicted", "score"]
Engine = Literal["auto", "onnxruntime", "torch"]


class PredictInputError(ValueError):
    """An input ``eada predict`` cannot read or that does not fit the model."""


@dataclass
class Item:
    """One input: an image file, or a feature file's row block."""

    path: Path
    kind: Literal["image", "features"]


def collect_inputs(inputs: Sequence[str | Path]) -> list[Item]:
    """The inputs in the order given; a folder contributes every image under it (sorted, hidden
    files left out).

    Raises:
        PredictInputError: an input that does not exist, a folder without images, a file that
            is neither an image nor a feature file.
    """
    out: list[Item] = []
    for given in inputs:
        p = Path(given)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and f.suffix.lower() in IMAGE_EXTENSIONS
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise PredictInputError(
                    f"{p}: no images in this folder ({', '.join(IMAGE_EXTENSIONS)})"
                )
            out += [Item(f, "image") for f in found]
        elif not p.exists():
            raise PredictInputError(f"{p}: no such file or folder")
        elif p.suffix.lower() in IMAGE_EXTENSIONS:
            out.append(Item(p, "image"))
        elif p.suffix.lower() in FEATURE_SUFFIXES:
            out.append(Item(p, "features"))
        else:
            raise PredictInputError(
                f"{p}: not an image ({', '.join(IMAGE_EXTENSIONS)}) nor a feature file "
                f"({', '.join(FEATURE_SUFFIXES)})"
            )
    if not out:
        raise PredictInputError("no inputs given")
    return out


class Predictor:
    """An exported model as ``probabilities`` of raw inputs: feature rows ``(N, D)`` or images
    (PIL), on ONNX Runtime (``model.onnx``) or eager PyTorch.

    Args:
        folder: the export folder (``model.json``, ``model.pt``, optionally ``model.onnx``).
        engine: ``auto`` (ONNX Runtime where ``model.onnx`` and ``onnxruntime`` are there),
            ``onnxruntime`` or ``torch``.
        threads: intra-op threads of ONNX Runtime (torch's come from ``--threads``).

    Raises:
        FileNotFoundError: no export there.
        PredictInputError: ``engine="onnxruntime"`` without ``model.onnx`` or the package.
    """

    def __init__(self, folder: str | Path, engine: Engine = "auto", threads: int = 1) -> None:
        from eada.models.runtime import onnxruntime_available
        from eada.store.config import build_config
        from eada.store.pixels import pixel_reader

        self.folder = Path(folder)
        if self.folder.name == "model.json":
            self.folder = self.folder.parent
        meta_file = self.folder / "model.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"no exported model at {self.folder}: model.json missing")
        meta = read_model_meta(meta_file)
        self.meta = meta
        self.classes: list[str] = list(meta["classes"])
        self.cfg = build_config(meta["config"], str(meta_file))
        onnx_file = self.folder / "model.onnx"
        usable = onnx_file.is_file() and onnxruntime_available()
        if engine == "onnxruntime" and not usable:
            why = "no model.onnx there" if not onnx_file.is_file() else "onnxruntime missing"
            raise PredictInputError(f"--engine onnxruntime: {why} ({self.folder})")
        self.engine = "onnxruntime" if engine != "torch" and usable else "torch"
        if self.engine == "onnxruntime":
            check_digest(onnx_file, (meta.get("onnx") or {}).get("sha256"), meta_file)
        self.pixels = pixel_reader(self.cfg)
        self.kind = "features" if self.cfg.data.kind == "features" else "other"
        if self.pixels is not None:
            self.kind = "images"
        self._loaded: Any = None
        self._session: Any = None
        if self.engine == "onnxruntime":
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = max(1, threads)
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                self._session = ort.InferenceSession(
                    str(onnx_file), so, providers=["CPUExecutionProvider"]
                )
            except Exception as err:  # ONNX Runtime's own errors are not OSError/ValueError
                raise PredictInputError(
                    f"{onnx_file}: ONNX Runtime cannot load it ({str(err).splitlines()[0][:200]})"
                    "; export the model again (eada export --force)"
                ) from None
            self._input = self._session.get_inputs()[0].name
            check_onnx_session(self._session, meta, onnx_file)
        else:
            from eada.api import load_model

            self._loaded = load_model(self.folder)

    def rows(self, x: np.ndarray) -> np.ndarray:
        """Probabilities ``(N, C)`` of raw feature rows ``(N, D)``."""
        import numpy as np

        if self.kind != "features":
            raise PredictInputError("this model takes images, not feature rows")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self._session is not None:
            out: np.ndarray = self._session.run(["probabilities"], {self._input: x})[0]
            return out
        return self._loaded.probabilities(x).numpy()

    def images(self, images: Sequence[Any]) -> np.ndarray:
        """Probabilities ``(N, C)`` of PIL images."""
        import numpy as np

        if self.kind != "images" or self.pixels is None:
            raise PredictInputError("this model takes feature rows, not images")
        if self._session is not None:
            batch = np.stack([self.pixels(im) for im in images])
            out: np.ndarray = self._session.run(["probabilities"], {self._input: batch})[0]
            return out
        import torch

        t = self._loaded.transform
        x = torch.stack([t(im.convert(self._mode())) for im in images])
        return self._loaded.probabilities(x).numpy()

    def _mode(self) -> str:
        return "L" if getattr(self.cfg.data, "channels", 3) == 1 else "RGB"


def read_model_meta(meta_file: Path) -> dict[str, Any]:
    """``model.json`` of an export, checked against itself: a JSON object with ``classes`` (a
    non-empty list of distinct names), ``config``, ``input_shape`` (positive sizes) and, where
    recorded, feature statistics as long as one input row.

    Raises:
        PredictInputError: naming the file and what is wrong.
    """
    import numpy as np

    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PredictInputError(f"{meta_file}: not valid JSON ({err}); export again") from None
    if not isinstance(meta, dict):
        raise PredictInputError(f"{meta_file}: not a JSON object; export again")
    missing = [k for k in ("classes", "config") if k not in meta]
    if missing:
        raise PredictInputError(f"{meta_file}: no {', '.join(missing)}; export again")
    classes = meta["classes"]
    if (
        not isinstance(classes, list)
        or not classes
        or not all(isinstance(c, str) for c in classes)
        or len(set(classes)) != len(classes)
    ):
        raise PredictInputError(f"{meta_file}: 'classes' is not a list of distinct class names")
    shape = meta.get("input_shape")
    if shape is not None and (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise PredictInputError(f"{meta_file}: 'input_shape' {shape!r} is not a list of sizes")
    stats = meta.get("feature_statistics") or {}
    width = int(np.prod(shape)) if shape else None
    for key in ("mean", "std"):
        values = stats.get(key) if isinstance(stats, dict) else None
        if values is not None and width is not None and len(values) != width:
            raise PredictInputError(
                f"{meta_file}: feature_statistics.{key} holds {len(values)} values, the model "
                f"takes {width} features; the file was changed: export again"
            )
    return dict(meta)


def check_digest(path: Path, recorded: str | None, meta_file: Path) -> None:
    """Refuse ``path`` when its SHA-256 differs from the one ``meta_file`` records for it
    (nothing recorded: an export of an older eada, used as it is).

    Raises:
        PredictInputError: naming the file, the recorded and the actual digest.
    """
    if not recorded:
        return
    from eada.runs import sha256_file

    actual = sha256_file(path)
    if actual != recorded:
        raise PredictInputError(
            f"{path} does not match the SHA-256 recorded in {meta_file} (recorded "
            f"{recorded[:12]}..., found {actual[:12]}...): the file was changed or damaged; "
            "export the model again (eada export --force)"
        )


def check_onnx_session(session: Any, meta: dict[str, Any], onnx_file: Path) -> None:
    """The loaded ``model.onnx`` against ``model.json``: one input of the recorded type
    (float32 feature rows, uint8 pixels) and shape, a ``probabilities`` output with one column
    a class.

    Raises:
        PredictInputError: naming the file and the mismatch.
    """
    inputs = session.get_inputs()
    outputs = {o.name: o for o in session.get_outputs()}
    recorded = (meta.get("onnx") or {}).get("input") or {}
    if len(inputs) != 1:
        raise PredictInputError(f"{onnx_file}: {len(inputs)} inputs, the export has one")
    got = inputs[0]
    want_type = recorded.get("dtype", "float32")
    ort_type = {"float32": "tensor(float)", "uint8": "tensor(uint8)"}.get(want_type, want_type)
    if got.type != ort_type:
        raise PredictInputError(
            f"{onnx_file}: its input {got.name!r} is {got.type}, model.json records "
            f"{want_type} ({ort_type}); export the model again"
        )
    shape = list(got.shape)[1:]
    want = list(recorded.get("shape") or ["N", *(meta.get("input_shape") or [])])[1:]
    fixed = [(a, b) for a, b in zip(shape, want, strict=False) if isinstance(a, int)]
    if len(shape) != len(want) or any(isinstance(b, int) and a != b for a, b in fixed):
        raise PredictInputError(
            f"{onnx_file}: its input takes shape {['N', *shape]}, model.json records "
            f"{['N', *want]}; export the model again"
        )
    probs = outputs.get("probabilities")
    if probs is None:
        raise PredictInputError(f"{onnx_file}: no 'probabilities' output; export the model again")
    n = probs.shape[-1] if probs.shape else None
    if isinstance(n, int) and n != len(meta["classes"]):
        raise PredictInputError(
            f"{onnx_file}: {n} output classes, model.json names {len(meta['classes'])}; the "
            "export's files do not belong together: export the model again"
        )


def _feature_rows(
    path: Path, features_key: str | None
) -> tuple[np.ndarray, list[str | None] | None]:
    from eada.store.targets import read_unlabeled_features

    try:
        x, info = read_unlabeled_features(path, features_key)
    except ValueError as err:
        raise PredictInputError(str(err) if str(path) in str(err) else f"{path}: {err}") from None
    return x, info.ids


def _open_image(path: Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            return im.copy()
    except (UnidentifiedImageError, OSError) as err:
        raise PredictInputError(f"{path}: cannot read the image ({err})") from None


def predict_rows(
    predictor: Predictor,
    items: Sequence[Item],
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """One dict a prediction (:data:`COLUMNS`), in input order. ``progress(done, total)``:
    after each batch (total: images plus feature files' rows, counted as they are read)."""

    if predictor.kind == "other":
        kind = predictor.cfg.data.kind
        raise PredictInputError(
            f"{predictor.folder}: this model takes model-ready tensors (a {kind} project), "
            "not files: use eada.load_model(...).predict(x)"
        )
    if any(i.kind == "image" for i in items) and predictor.kind != "images":
        first = next(i.path for i in items if i.kind == "image")
        raise PredictInputError(f"{first}: this model takes feature rows, not images")
    if any(i.kind == "features" for i in items) and predictor.kind != "features":
        first = next(i.path for i in items if i.kind == "features")
        raise PredictInputError(f"{first}: this model takes images, not feature rows")
    fkey = getattr(predictor.cfg.data, "features_key", None)
    total = sum(1 for i in items if i.kind == "image")
    feats = [(i, *_feature_rows(i.path, fkey)) for i in items if i.kind == "features"]
    total += sum(len(x) for _, x, _ in feats)
    dim = predictor.cfg.data.kind == "features" and _model_width(predictor)
    done = 0
    classes = predictor.classes

    def rows_of(p: np.ndarray) -> list[tuple[str, float]]:
        k = p.argmax(axis=1)
        return [(classes[int(j)], float(p[n, j])) for n, j in enumerate(k)]

    by_path = {id(i): (x, ids) for i, x, ids in feats}
    images = [i for i in items if i.kind == "image"]
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        probs = predictor.images([_open_image(i.path) for i in chunk])
        for i, (name, score) in zip(chunk, rows_of(probs), strict=True):
            yield {
                "input": str(i.path),
                "row": "",
                "id": i.path.name,
                "predicted": name,
                "score": score,
            }
        done += len(chunk)
        if progress is not None:
            progress(done, total)
    for i in items:
        if i.kind != "features":
            continue
        x, ids = by_path[id(i)]
        if len(x) == 0:
            raise PredictInputError(f"{i.path}: no rows to predict (an empty feature file)")
        if dim and x.shape[1] != dim:
            raise PredictInputError(
                f"{i.path}: {x.shape[1]} feature columns, the model takes {dim}"
            )
        for start in range(0, len(x), max(batch_size, 256)):
            part = x[start : start + max(batch_size, 256)]
            for r, (name, score) in enumerate(rows_of(predictor.rows(part)), start=start):
                rid = (ids[r] if ids else None) or str(r)
                yield {"input": str(i.path), "row": r, "id": rid, "predicted": name, "score": score}
            done += len(part)
            if progress is not None:
                progress(done, total)


def _model_width(predictor: Predictor) -> int:
    import numpy as np

    return int(np.prod(predictor.meta["input_shape"]))


def read_labels(path: Path, classes: Sequence[str]) -> dict[str, str]:
    """A labels CSV: a ``label`` column and a key column, one of ``path``, ``file``, ``id`` or
    ``row``. Returns ``{key: class name}``.

    Raises:
        PredictInputError: no such file, no ``label`` or key column, an unknown class name.
    """
    if not path.is_file():
        raise FileNotFoundError(f"labels file not found: {path}")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        key = next((c for c in ("path", "file", "id", "row") if c in cols), None)
        if "label" not in cols or key is None:
            raise PredictInputError(
                f"{path}: needs a 'label' column and one of 'path', 'file', 'id', 'row' "
                f"(found: {', '.join(cols) or 'nothing'})"
            )
        out: dict[str, str] = {}
        known = set(classes)
        for n, r in enumerate(reader, start=2):
            lab = (r.get("label") or "").strip()
            if not lab:
                continue
            if lab not in known:
                raise PredictInputError(
                    f"{path}, line {n}: unknown class name {lab!r} (the model's classes: "
                    f"{', '.join(list(classes)[:8])}{', ...' if len(classes) > 8 else ''})"
                )
            out[(r.get(key) or "").strip()] = lab
    return out


def _label_of(row: dict[str, Any], labels: dict[str, str]) -> str | None:
    for k in (row["input"], row["id"], str(row["row"]), Path(row["input"]).name):
        if k in labels:
            return labels[k]
    return None


def _progress(total_hint: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """A rich bar on a terminal, plain lines (every 10 % or 30 s) otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from eada.data.features import PlainProgress

    console = Console(stderr=True)
    if console.is_terminal:
        bar = Progress(
            "  predicting",
            BarColumn(),
            MofNCompleteColumn(),
            "left",
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        task = bar.add_task("predict", total=total_hint)
        bar.start()

        def update(done: int, total: int) -> None:
            bar.update(task, total=total, completed=done)

        return update, bar.stop
    plain: list[PlainProgress] = []

    def update_plain(done: int, total: int) -> None:
        if not plain:
            plain.append(PlainProgress("predicting", total))
        plain[0].total = total
        plain[0].update(done)

    return update_plain, lambda: None


def run_predict(
    model: str | Path,
    inputs: Sequence[str | Path],
    out: str | Path,
    labels: str | Path | None = None,
    engine: Engine = "auto",
    batch_size: int = 32,
    threads: int = 1,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Predict ``inputs`` with the export at ``model`` and write the CSV ``out`` (written
    whole, atomically). Returns ``{"out", "n", "engine", "by_class"}`` and, with ``labels``,
    ``{"labeled", "correct", "accuracy"}`` (accuracy in %, over the inputs with a label).

    Raises:
        PredictInputError: bad inputs or labels (named), before anything is written.
        FileNotFoundError: no export at ``model``.
    """
    from eada.store.labelfiles import csv_safe, write_atomic

    if batch_size < 1:
        raise PredictInputError(f"--batch-size must be >= 1, got {batch_size}")
    from eada.outputs import STDOUT, check_output

    to_stdout = str(out) == STDOUT
    check_output(out, inputs=[*map(str, inputs), model, *([labels] if labels else [])], stdout=True)
    out = Path(out)
    if not to_stdout and out.is_dir():
        raise PredictInputError(f"--out {out} is a folder; name the CSV file to write")
    items = collect_inputs(inputs)
    predictor = Predictor(model, engine, threads)
    truth = read_labels(Path(labels), predictor.classes) if labels is not None else None
    update, stop = _progress(len(items)) if show_progress else (None, lambda: None)
    try:
        rows = list(predict_rows(predictor, items, batch_size, update))
    finally:
        stop()
    cols = COLUMNS + (["label", "correct"] if truth is not None else [])
    labeled = correct = 0
    by_class: dict[str, int] = {}
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        by_class[r["predicted"]] = by_class.get(r["predicted"], 0) + 1
        r["score"] = round(r["score"], 6)
        if truth is not None:
            lab = _label_of(r, truth)
            r["label"] = lab or ""
            r["correct"] = "" if lab is None else int(lab == r["predicted"])
            if lab is not None:
                labeled += 1
                correct += lab == r["predicted"]
        w.writerow({k: csv_safe(v) if isinstance(v, str) else v for k, v in r.items()})
    if to_stdout:  # the user's own stream: written through, its errors are the user's
        sys.stdout.write(buf.getvalue())
        sys.stdout.flush()
    else:
        if out.parent != Path("") and not out.parent.is_dir():
            out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, buf.getvalue())
    result: dict[str, Any] = {
        "out": str(out),
        "n": len(rows),
        "engine": predictor.engine,
        "by_class": dict(sorted(by_class.items(), key=lambda kv: -kv[1])),
    }
    if truth is not None:
        if labeled == 0:
            raise PredictInputError(
                f"{labels}: none of its rows names one of the {len(rows)} inputs (match by "
                "path, file name, id or row)"
            )
        result.update(labeled=labeled, correct=correct, accuracy=100.0 * correct / labeled)
    return result


def _cmd_predict(args: argparse.Namespace) -> int:
    from eada.threads import available_cores, env_threads, requested_threads

    res = run_predict(
        args.model,
        args.inputs,
        args.out,
        labels=args.labels,
        engine=args.engine,
        batch_size=args.batch_size,
        # --threads N (eada.cli.main), else OMP_NUM_THREADS, else the cores: torch's own
        # default, without importing torch for ONNX Runtime
        threads=requested_threads() or env_threads() or available_cores(),
    )
    top = ", ".join(f"{k} {v}" for k, v in list(res["by_class"].items())[:6])
    more = " ..." if len(res["by_class"]) > 6 else ""
    say = sys.stderr if args.out == "-" else sys.stdout  # stdout holds the CSV
    where = "standard output" if args.out == "-" else res["out"]
    print(f"{res['n']} predictions ({res['engine']}) -> {where}; predicted: {top}{more}", file=say)
    if "accuracy" in res:
        print(
            f"accuracy {res['accuracy']:.2f}% ({res['correct']} of {res['labeled']} labeled "
            f"inputs, labels from {args.labels})",
            file=say,
        )
    sys.stdout.flush()
    return 0


def add_predict_command(sub: Any) -> None:
    """Add ``eada predict`` to the ``eada`` subparsers ``sub``."""
    from eada.threads import add_threads_argument

    p = sub.add_parser(
        "predict",
        help="predict new images or feature rows with an exported model (eada export)",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders, feature files")
    p.add_argument("--model", required=True, help="the export folder (eada export --out)")
    p.add_argument(
        "--out", required=True, help="the CSV to write (one row a prediction; - for stdout)"
    )
    p.add_argument(
        "--labels",
        default=None,
        help="a CSV with 'label' and 'path'/'file'/'id'/'row' columns: adds label and correct "
        "columns and prints the accuracy over the labeled inputs",
    )
    p.add_argument(
        "--engine",
        choices=["auto", "onnxruntime", "torch"],
        default="auto",
        help="auto: ONNX Runtime on model.onnx where installed, else eager PyTorch",
    )
    p.add_argument("--batch-size", type=int, default=32, help="images a batch (default 32)")
    add_threads_argument(
        p, "threads of the model (default: OMP_NUM_THREADS if set, else all cores)"
    )
    p.set_defaults(func=_cmd_predict)


__all__ = [
    "COLUMNS",
    "PredictInputError",
    "Predictor",
    "add_predict_command",
    "collect_inputs",
    "predict_rows",
    "read_labels",
    "run_predict",
]
