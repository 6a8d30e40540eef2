"""The whole inference path of an exported model as one network, and its ONNX file.

``eada export`` writes ``model.onnx``: ONNX Runtime runs it without eada (or torch) and it
outputs the class probabilities ``softmax(-tau * E)`` (rows sum to 1) and the energies ``E``
(lower = more likely). What goes in front of the energy network:

* **feature rows** (``input``: ``features``, float32 ``(N, D)``): the raw rows; the training
  normalisation (``data.normalize``: ``l2``, ``zscore``, ``l1_zscore``, with the target
  domain's frozen statistics) is inside the graph (:class:`FeatureInput`);
* **images** (``input``: ``pixels``, uint8 ``(N, H, W, 3)`` RGB): the decoded, resized and
  cropped pixels; the scaling to ``[0, 1]``, the backbone's per-channel normalisation and the
  channel-first layout are inside the graph (:class:`PixelInput`), then the backbone (a frozen
  one included) and the head. Decoding and resizing stay outside: ONNX has no JPEG/PNG decoder
  before opset 20, and its ``Resize`` does not reproduce PIL's antialiased resampling, which
  the model was trained on; the steps are written in the file's metadata (``preprocessing``);
* anything else (``input``: ``inputs``): model-ready tensors as training saw them.

The metadata (``metadata_props``, plain strings; JSON where structured) holds ``classes``,
``tau``, ``input``, ``preprocessing``, ``outputs`` and ``normalize``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eada.models.engines import OPSET, export_onnx

#: Largest accepted ``max |onnx - torch|`` of the probabilities on the export's check batch.
MAX_PROBABILITY_DIFFERENCE = 1e-4


class FeatureInput(nn.Module):
    """Raw feature rows -> the rows the head trained on (``data.normalize``).

    ``l2``: each row over its L2 norm (at least ``1e-12``); ``zscore``:
    ``(x - mean) / (std + 1e-8)`` with the given (frozen) statistics; ``l1_zscore``: rows over
    their L1 norm, then ``zscore``; ``none``: unchanged. As
    :func:`eada.data.features.normalize_features`.

    >>> f = FeatureInput("zscore", {"mean": [2.0, 2.0], "std": [1.0, 1.0]})
    >>> f(torch.tensor([[1.0, 3.0]])).tolist()
    [[-1.0, 1.0]]
    """

    def __init__(self, how: str, stats: dict[str, Any] | None = None) -> None:
        super().__init__()
        if how not in ("none", "l2", "zscore", "l1_zscore"):
            raise ValueError(f"unknown feature normalisation {how!r}")
        self.how = how
        mean = np.zeros(0, np.float32)
        scale = np.ones(0, np.float32)
        if how in ("zscore", "l1_zscore"):
            if stats is None or "mean" not in stats or "std" not in stats:
                raise ValueError(f"normalize {how!r} needs the domain's mean and std")
            mean = np.asarray(stats["mean"], dtype=np.float32)
            scale = np.asarray(stats["std"], dtype=np.float32) + np.float32(1e-8)
        self.mean: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("mean", torch.from_numpy(mean))
        self.register_buffer("scale", torch.from_numpy(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised rows of ``x`` (float32 ``(N, D)``)."""
        if self.how == "l2":
            return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        if self.how == "l1_zscore":
            x = x / x.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
        if self.how in ("zscore", "l1_zscore"):
            return (x - self.mean) / self.scale
        return x


class PixelInput(nn.Module):
    """uint8 RGB pixels ``(N, H, W, C)`` -> ``((x / 255) - mean) / std`` as ``(N, C, H, W)``
    float32: ``ToTensor`` + ``Normalize`` of the test view, inside the graph.

    >>> p = PixelInput((0.5,), (0.5,))
    >>> p(torch.full((1, 1, 1, 1), 255, dtype=torch.uint8)).tolist()
    [[[[1.0]]]]
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Channel-first normalised float32 images of ``x``."""
        x = x.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return (x - self.mean) / self.std


class InferenceNet(nn.Module):
    """``prepare`` -> ``net`` (energies) -> ``(softmax(-tau E), E)``.

    >>> m = InferenceNet(nn.Identity(), nn.Identity(), 1.0)
    >>> p, e = m(torch.tensor([[0.0, 0.0]]))
    >>> p.tolist()
    [[0.5, 0.5]]
    """

    def __init__(self, prepare: nn.Module, net: nn.Module, tau: float) -> None:
        super().__init__()
        self.prepare = prepare
        self.net = net
        self.tau = float(tau)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Probabilities ``(N, C)`` (rows sum to 1) and energies ``(N, C)``."""
        e = self.net(self.prepare(x))
        return torch.softmax(-self.tau * e, dim=1), e


def onnx_model_bytes(
    model: InferenceNet,
    example: torch.Tensor,
    input_name: str,
    metadata: dict[str, str],
    work: Path,
) -> tuple[bytes, dict[str, Any]]:
    """Export ``model`` to ONNX (batch axis dynamic, :data:`~eada.models.engines.OPSET`), with
    ``metadata`` as the file's ``metadata_props``, and check it: where ONNX Runtime is
    installed, its probabilities on ``example`` against the eager model's (at most
    :data:`MAX_PROBABILITY_DIFFERENCE` apart). ``work``: a scratch folder. Returns the file's
    bytes and what the check found (``{"checked": bool, "max_abs_difference": float}``).

    Raises:
        ImportError: ``onnx`` is not installed (the ``fast`` extra).
        ValueError: the check failed.
    """
    import onnx

    model = model.to("cpu").eval()
    path = work / "model.onnx"
    export_onnx(
        model,
        tuple(example.shape[1:]),
        path,
        example=example,
        input_name=input_name,
        output_names=("probabilities", "energies"),
    )
    proto = onnx.load(str(path))
    for k, v in metadata.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.doc_string = metadata.get("description", "")
    data = proto.SerializeToString()
    check: dict[str, Any] = {"checked": False}
    try:
        import onnxruntime as ort
    except ImportError:
        return data, check
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    with torch.no_grad():
        ref = model(example)[0]
    got = torch.from_numpy(sess.run(["probabilities"], {input_name: example.numpy()})[0])
    diff = float((got - ref).abs().max()) if got.shape == ref.shape else float("inf")
    if not diff <= MAX_PROBABILITY_DIFFERENCE:
        raise ValueError(
            f"the ONNX export's probabilities differ from eager PyTorch's by {diff:.2e}, more "
            f"than {MAX_PROBABILITY_DIFFERENCE:g}"
        )
    return data, {"checked": True, "max_abs_difference": diff}


def onnx_metadata(
    classes: Sequence[str],
    tau: float,
    input_desc: dict[str, Any],
    preprocessing: list[str],
    extra: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The ``metadata_props`` of ``model.onnx`` (every value a string; lists and dicts as JSON).

    >>> m = onnx_metadata(["a", "b"], 1.0, {"name": "features"}, [])
    >>> json.loads(m["classes"]), m["tau"]
    (['a', 'b'], '1.0')
    """
    out = {
        "classes": json.dumps(list(classes)),
        "tau": repr(float(tau)),
        "input": json.dumps(input_desc),
        "preprocessing": json.dumps(preprocessing),
        "outputs": json.dumps(
            {
                "probabilities": "softmax(-tau * energies), (N, classes), rows sum to 1",
                "energies": "E(x, y), (N, classes); lower = more likely (predict = argmin)",
            }
        ),
        "opset": str(OPSET),
        "description": (
            "eada energy classifier: probabilities = softmax(-tau * E); the class of row i is "
            "classes[argmax(probabilities[i])]"
        ),
    }
    for k, v in (extra or {}).items():
        out[k] = v if isinstance(v, str) else json.dumps(v)
    return out


__all__ = [
    "MAX_PROBABILITY_DIFFERENCE",
    "FeatureInput",
    "InferenceNet",
    "PixelInput",
    "onnx_metadata",
    "onnx_model_bytes",
]
