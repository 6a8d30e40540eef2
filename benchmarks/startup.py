"""Start-up of the ``eada`` commands: wall time and peak memory of each, as a ratio to
``python -c "import eada"`` measured in the same run, and whether the command imported torch.

The commands run in fresh interpreters, round-robin (each repetition runs every command once,
so a change in the machine's load touches all of them alike); the table gives the median of
the repetitions. The store commands run on the own-images tutorial's project
(docs/tutorial-own-images.md: 60 amazon source photos, 50 unlabeled webcam photos, frozen
EfficientNet-Lite0, one round labeled, exported with ``model.onnx``), built once under
``--work``. ``--before SRC`` also runs every command with another source tree (e.g. the commit
before the lazy start-up, ``git archive COMMIT src | tar -x -C DIR``) on the same store, side
by side.

Usage (repository root, ../shared/data beside it)::

    OMP_NUM_THREADS=1 python benchmarks/startup.py --repeat 5 \\
        --out benchmarks/results/startup.json [--before /tmp/eada-before/src]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
CLASSES = "back_pack,bike,calculator,headphones,mug"


def commands(work: Path) -> dict[str, list[str]]:
    """Name -> argv after ``python``; the store commands act on the tutorial's project."""
    store = ["--store", str(work / "runs" / "mine")]
    eada = ["-m", "eada.cli"]
    return {
        'python -c "import eada"': ["-c", "import eada"],
        "eada --version": [*eada, "--version"],
        "eada --help": [*eada, "--help"],
        "eada strategies": [*eada, "strategies"],
        "eada status": [*eada, "status", *store],
        "eada label import": [
            *eada,
            "label",
            "import",
            str(work / "runs" / "round1.csv"),
            *store,
            "--annotator",
            "me",
        ],
        "eada config set": [*eada, "config", "set", *store, "store.reviewer=@lead"],
        "eada predict (ONNX Runtime, 50 images)": [
            *eada,
            "predict",
            "--model",
            str(work / "runs" / "model"),
            str(work / "runs" / "my-photos"),
            "--engine",
            "onnxruntime",
            "--out",
            str(work / "preds.csv"),
        ],
        'python -c "import torch"': ["-c", "import torch"],
    }


def build_store(work: Path, src: Path) -> None:
    """The tutorial's project under ``work`` (once): subset, unlabel, init, train, query,
    the first round's labels, train, export."""
    if (work / "runs" / "model" / "model.onnx").is_file():
        return
    shutil.rmtree(work, ignore_errors=True)
    (work / "configs").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "own_images_lite0.yaml", work / "configs")
    steps = [
        ["data", "subset", str(DATA / "office31" / "amazon"), "runs/source", "--per-class", "12"],
        ["data", "unlabel", str(DATA / "office31" / "webcam"), "runs/my-photos"],
        ["init", "--store", "runs/mine", "--config", "configs/own_images_lite0.yaml"],
        ["train", "--store", "runs/mine"],
        ["query", "--store", "runs/mine"],
        ["data", "fill-labels", "runs/mine/exports/round-001.csv", "--truth", "runs/truth.csv"],
        ["label", "import", "runs/round1.csv", "--store", "runs/mine", "--annotator", "me"],
        ["train", "--store", "runs/mine"],
        ["export", "--store", "runs/mine", "--out", "runs/model"],
    ]
    steps[0] += ["--classes", CLASSES]
    steps[1] += ["--truth", "runs/truth.csv", "--per-class", "10", "--classes", CLASSES]
    steps[5] += ["--out", "runs/round1.csv"]
    for step in steps:
        print("build:", "eada", *step, file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "eada.cli", *step],
            cwd=work,
            env=_env(src),
            check=True,
            stdout=subprocess.DEVNULL,
        )


def _env(src: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")


def run_once(argv: list[str], src: Path, cwd: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (KiB) and exit status of one fresh ``python ARGV``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=cwd,
        env=_env(src),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, int(usage.ru_maxrss), proc.returncode


def imports_torch(argv: list[str], src: Path, cwd: Path) -> bool:
    """Whether ``python -X importtime ARGV`` lists torch among its imports."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=cwd,
        env=_env(src),
        capture_output=True,
        text=True,
    )
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in out.stderr.splitlines())


def measure(
    cmds: dict[str, list[str]], trees: dict[str, Path], cwd: Path, repeat: int
) -> dict[str, dict[str, Any]]:
    """Every command with every source tree, ``repeat`` rounds of each once, round-robin."""
    walls: dict[tuple[str, str], list[float]] = {}
    rss: dict[tuple[str, str], list[int]] = {}
    for _ in range(repeat):
        for tree, src in trees.items():
            for name, argv in cmds.items():
                wall, peak, code = run_once(argv, src, cwd)
                if code != 0:
                    raise SystemExit(f"{name} ({tree}) exited {code}")
                walls.setdefault((tree, name), []).append(wall)
                rss.setdefault((tree, name), []).append(peak)
    out: dict[str, dict[str, Any]] = {}
    for tree, src in trees.items():
        base = statistics.median(walls[(tree, 'python -c "import eada"')])
        rows = {}
        for name, argv in cmds.items():
            med = statistics.median(walls[(tree, name)])
            rows[name] = {
                "median_s": round(med, 3),
                "runs_s": [round(w, 3) for w in walls[(tree, name)]],
                "ratio_to_import_eada": round(med / base, 1),
                "peak_rss_mib": round(max(rss[(tree, name)]) / 1024, 1),
                "imports_torch": imports_torch(argv, src, cwd),
            }
        out[tree] = rows
    return out


def table(result: dict[str, Any]) -> str:
    """The Markdown table: one row a command, the trees side by side."""
    trees = list(result["trees"])
    head = "| command |"
    rule = "|---|"
    for t in trees:
        head += f" {t}: median s | x `import eada` | peak MiB | torch |"
        rule += "---:|---:|---:|:---:|"
    lines = [head, rule]
    for name in result["trees"][trees[0]]:
        row = f"| `{name}` |"
        for t in trees:
            r = result["trees"][t][name]
            torch_mark = "yes" if r["imports_torch"] else "no"
            row += (
                f" {r['median_s']:.2f} | {r['ratio_to_import_eada']:.1f} | "
                f"{r['peak_rss_mib']:.0f} | {torch_mark} |"
            )
        lines.append(row)
    return "\n".join(lines)


def git_commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/eada-startup", help="the tutorial's project folder")
    p.add_argument("--repeat", type=int, default=5, help="repetitions of each command")
    p.add_argument("--before", default=None, metavar="SRC", help="another source tree to run")
    p.add_argument("--out", default="benchmarks/results/startup.json")
    args = p.parse_args(argv)
    work = Path(args.work).resolve()
    trees = {"now": REPO / "src"}
    if args.before:
        trees = {"before": Path(args.before).resolve(), **trees}
    build_store(work, REPO / "src")
    commit = git_commit()  # the code measured: read before, not after, the runs
    load_before = os.getloadavg()
    t0 = time.time()
    rows = measure(commands(work), trees, work, args.repeat)
    result = {
        "what": "start-up of eada commands: median wall time of fresh interpreters, as a ratio "
        'to python -c "import eada" in the same run; peak RSS; whether torch was imported',
        "command": " ".join(["python", "benchmarks/startup.py", *(argv or sys.argv[1:])]),
        "commit": commit,
        "before": args.before,
        "repeat": args.repeat,
        "store": "docs/tutorial-own-images.md's project (60 source, 50 target photos, Lite0)",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
        },
        "time_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)),
        "seconds": round(time.time() - t0, 1),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "trees": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"load average before {load_before}, after {result['load_average_1_5_15']['after']}")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
