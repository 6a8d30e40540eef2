"""Whether ONNX Runtime is at hand, asked without importing torch (``eada predict`` asks it
before it knows whether it needs torch at all); :mod:`eada.models.engines` re-exports it."""

from __future__ import annotations


def onnxruntime_available() -> bool:
    """Whether ``onnxruntime`` (and the ``onnx`` package the export needs) import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True
