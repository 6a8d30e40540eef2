"""Inference engines for frozen-backbone feature extraction.

A frozen backbone only ever runs forward, once per image, so it can run on an engine faster than
eager PyTorch. :func:`feature_engine` picks one:

* ``onnxruntime`` (the optional extra ``pip install 'eada[fast]'``): the backbone exported once to
  ONNX and run by ONNX Runtime's CPU provider, the fastest exact engine measured on
  EfficientNet-Lite0: 2.6-6x eager PyTorch per core for the model alone on a shared machine
  (BENCHMARKS.md, "Frozen feature extraction speed"). The export is cached
  under ``<cache_dir>/onnx/<key>.onnx``; the key hashes the backbone's architecture (its module
  tree), EVERY weight tensor, the input shape and the torch version, so other weights or another
  backbone never reuse it. Each time a session is opened, its features on a fixed random batch are
  compared with eager PyTorch's: beyond :data:`MAX_RELATIVE_DIFFERENCE` the engine is not used
  (a one-line note; eager PyTorch extracts).
* ``torch``: eager PyTorch in ``channels_last`` memory format (on CUDA under bfloat16 autocast).
  The fallback without the extra, with a one-line note, and always on a GPU.

Both run with the process's torch thread count (``--threads N``, :mod:`eada.threads`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from eada.models.runtime import onnxruntime_available
from eada.runs import tmp_name

#: Largest accepted ``max |fast - eager| / max |eager|`` of one sample's features.
MAX_RELATIVE_DIFFERENCE = 1e-5
#: The ONNX opset of the export.
OPSET = 17
#: Bumped when the export changes in a way the key does not see.
EXPORT_FORMAT = 1

EngineName = Literal["auto", "onnxruntime", "torch"]
Note = Callable[[str], None]


def _stderr_note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


@dataclass
class FeatureEngine:
    """A callable ``(B, C, H, W)`` float32 images -> ``(B, D)`` float32 features on the CPU.

    ``name``: ``onnxruntime`` or ``torch``; ``threads``: the intra-op thread count it runs with;
    ``info``: what to record (the ONNX file, the check's relative difference, a fallback's
    reason)."""

    name: str
    threads: int
    run: Callable[[torch.Tensor], torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)

    def record(self) -> dict[str, Any]:
        """``{"engine", "threads", ...info}`` for run records and notes."""
        return {"engine": self.name, "threads": self.threads, **self.info}


def max_relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest, over samples (rows), of ``max |a - b| / max |b|``: how far features ``a``
    are from the reference ``b`` (0 when equal).

    >>> b = torch.tensor([[1.0, -2.0], [4.0, 0.0]])
    >>> round(max_relative_difference(b + torch.tensor([[0.0, 0.2], [0.0, 0.0]]), b), 6)
    0.1
    """
    a2 = a.detach().float().reshape(len(a), -1)
    b2 = b.detach().float().reshape(len(b), -1)
    if a2.shape != b2.shape:
        raise ValueError(f"features of shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    if a2.numel() == 0:
        return 0.0
    scale = b2.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    return float(((a2 - b2).abs().amax(dim=1) / scale).max())


def torch_engine(
    module: nn.Module, device: torch.device | str = "cpu", channels_last: bool = True
) -> FeatureEngine:
    """Eager PyTorch (``channels_last`` when asked; on CUDA under bfloat16 autocast, the output
    cast back to float32), output on the CPU."""
    dev = torch.device(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    module = module.to(dev).to(memory_format=fmt).eval()

    @torch.no_grad()
    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return module(x).float().cpu()

    return FeatureEngine("torch", torch.get_num_threads(), run, {"device": str(dev)})


def export_key(module: nn.Module, input_shape: tuple[int, ...]) -> str:
    """SHA-256 naming an ONNX export of ``module``: its module tree (architecture), the bytes
    of every parameter and buffer, the input shape ``(C, H, W)``, torch's version, the opset
    and :data:`EXPORT_FORMAT`. Any other weights give another key.

    >>> m = nn.Linear(2, 2)
    >>> k = export_key(m, (2,))
    >>> with torch.no_grad():
    ...     _ = m.weight.add_(1.0)
    >>> export_key(m, (2,)) != k
    True
    """
    h = hashlib.sha256()
    head = [repr(module), list(input_shape), torch.__version__, OPSET, EXPORT_FORMAT]
    h.update(json.dumps(head).encode())
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        if t.numel():  # a 0-d tensor (a BatchNorm's counter) cannot be viewed as bytes
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def export_onnx(
    module: nn.Module,
    input_shape: tuple[int, ...],
    path: Path,
    example: torch.Tensor | None = None,
    input_name: str = "images",
    output_names: tuple[str, ...] = ("features",),
) -> Path:
    """Export ``module`` (eval mode, batch axis dynamic) to ``path`` atomically. ``example``:
    the traced input (default: zeros of shape ``(2, *input_shape)``); ``input_name`` and
    ``output_names`` name the graph's input and outputs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    module = module.to("cpu").to(memory_format=torch.contiguous_format).eval()
    if example is None:
        example = torch.zeros(2, *input_shape)
    axes = {name: {0: "batch"} for name in (input_name, *output_names)}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (example,),
                str(tmp),
                input_names=[input_name],
                output_names=list(output_names),
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: The last export of this process by key (a second cache folder gets it without exporting).
_EXPORTS: dict[str, bytes] = {}


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # no busy-waiting between operators: on a shared machine spinning threads steal cores
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def onnx_engine(
    module: nn.Module,
    input_shape: tuple[int, ...],
    cache_dir: Path,
    threads: int | None = None,
) -> FeatureEngine:
    """ONNX Runtime on the CPU, the export read from (or written to) ``cache_dir/onnx``, its
    output checked against eager PyTorch on a fixed random batch of two.

    Raises:
        ValueError: the check's relative difference exceeds :data:`MAX_RELATIVE_DIFFERENCE`
            (the file is removed: the next run exports again).
    """
    n = threads if threads is not None else torch.get_num_threads()
    module = module.to("cpu").to(memory_format=torch.contiguous_format).eval()
    key = export_key(module, input_shape)
    f = cache_dir / "onnx" / f"{key}.onnx"
    exported = not f.is_file()
    if exported and key in _EXPORTS:  # exported by this process into another cache folder
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(f)
        tmp.write_bytes(_EXPORTS[key])
        os.replace(tmp, f)
    elif exported:
        export_onnx(module, input_shape, f)
        _EXPORTS.clear()  # keep the last one only (a backbone's weights, ~20 MB)
        _EXPORTS[key] = f.read_bytes()
    sess = _session(f, n)
    probe = torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = module(probe).float()
    got = torch.from_numpy(sess.run(None, {"images": probe.numpy()})[0])
    diff = max_relative_difference(got, ref) if got.shape == ref.shape else float("inf")
    if not diff <= MAX_RELATIVE_DIFFERENCE:
        f.unlink(missing_ok=True)
        raise ValueError(
            f"the ONNX export {f} differs from eager PyTorch by {diff:.2e} (relative), more "
            f"than {MAX_RELATIVE_DIFFERENCE:g}"
        )

    def run(x: torch.Tensor) -> torch.Tensor:
        a = x.detach().to("cpu", torch.float32).contiguous().numpy()
        return torch.from_numpy(sess.run(None, {"images": a})[0])

    info = {"file": str(f), "exported": exported, "check_relative_difference": diff}
    return FeatureEngine("onnxruntime", n, run, info)


def feature_engine(
    module: nn.Module,
    input_shape: tuple[int, ...],
    cache_dir: Path | None,
    device: torch.device | str = "cpu",
    engine: EngineName = "auto",
    note: Note | None = _stderr_note,
) -> FeatureEngine:
    """The engine a frozen backbone extracts with (see the module docstring).

    ``auto``: ONNX Runtime on the CPU when installed and ``cache_dir`` is given (the export's
    home), else eager PyTorch with a one-line ``note`` saying why; ``torch``: eager PyTorch;
    ``onnxruntime``: ONNX Runtime or an ``ImportError`` naming the extra.
    """
    dev = torch.device(device)
    if engine == "torch" or dev.type != "cpu" or cache_dir is None:
        return torch_engine(module, dev)
    if not onnxruntime_available():
        if engine == "onnxruntime":
            raise ImportError(
                "the onnxruntime engine needs onnxruntime and onnx (pip install 'eada[fast]')"
            )
        if note is not None:
            note(
                "note: onnxruntime is not installed, so features are extracted with eager "
                "PyTorch (pip install 'eada[fast]' for a faster first extraction)"
            )
        out = torch_engine(module, dev)
        out.info["fallback"] = "onnxruntime not installed"
        return out
    try:
        return onnx_engine(module, input_shape, cache_dir)
    except Exception as err:  # an export the exporter cannot do, or one that is not exact
        if engine == "onnxruntime":
            raise
        if note is not None:
            first = (str(err).splitlines() or [""])[0]
            note(f"note: eager PyTorch extracts the features: no usable ONNX export ({first})")
        out = torch_engine(module, dev)
        out.info["fallback"] = f"{type(err).__name__}: {err}"
        return out


__all__ = [
    "MAX_RELATIVE_DIFFERENCE",
    "FeatureEngine",
    "export_key",
    "feature_engine",
    "max_relative_difference",
    "onnx_engine",
    "onnxruntime_available",
    "torch_engine",
]
