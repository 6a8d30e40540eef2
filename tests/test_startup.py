"""The ``eada`` command's start and stop.

The commands that need no model start without torch: each runs in a fresh interpreter under
``python -X importtime`` (as a user's shell runs it), and the test fails naming the command
whose import list holds ``torch``, with the chain of modules that pulled it in. Ctrl-C: exit
130 from the shell, the ``KeyboardInterrupt`` itself for a Python caller (one Ctrl-C stops
the test suite)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from eada.cli import main
from eada.store import Project

REPO = Path(__file__).resolve().parents[1]


def imported_modules(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], list]:
    """Run ``eada ARGS`` under ``-X importtime``; returns the process and its import lines
    ``(depth, module)`` in the order Python finished importing them."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "eada.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1]
            lines.append((len(name) - len(name.lstrip()), name.strip()))
    return proc, lines


def torch_chain(lines: list) -> list[str]:
    """The modules that imported torch, outermost first (``[]`` when torch was not imported):
    importtime prints a module after the ones it imported, one indent deeper."""
    for i, (depth, name) in enumerate(lines):
        if name == "torch":
            chain, want = [name], depth
            for d, n in lines[i + 1 :]:
                if d < want:
                    chain.append(n)
                    want = d
            return chain[::-1]
    return []


def assert_no_torch(args: list[str], cwd: Path) -> str:
    proc, lines = imported_modules(args, cwd)
    said = "\n".join(x for x in proc.stderr.splitlines() if not x.startswith("import time:"))
    assert proc.returncode == 0, f"eada {' '.join(args)}: exit {proc.returncode}\n{said}"
    assert lines, "no -X importtime output"
    chain = torch_chain(lines)
    assert not chain, f"eada {' '.join(args)} imports torch: {' -> '.join(chain)}"
    return proc.stdout


def test_torch_chain_names_the_importers() -> None:
    """The chain is read right: the check cannot pass by misreading importtime's tree."""
    lines = [(2, "numpy"), (6, "torch._C"), (4, "torch"), (2, "eada.energy"), (0, "eada.cli")]
    assert torch_chain(lines) == ["eada.cli", "eada.energy", "torch"]
    assert torch_chain([(0, "yaml")]) == []
    proc, lines = imported_modules(["run", "toy", "--dry-run"], REPO)  # needs torch: found
    assert proc.returncode == 0 and torch_chain(lines)[-1] == "torch"


def test_commands_that_need_no_model_do_not_import_torch(tmp_path: Path) -> None:
    """--version, --help, strategies, presets, config show/set, status, label import and
    predict on ONNX Runtime, on a small feature project trained and exported in-process."""
    pytest.importorskip("onnxruntime")
    for args in (["--version"], ["--help"], ["strategies"], ["presets"], ["status", "--help"]):
        assert_no_torch(args, tmp_path)
    assert "eada" in assert_no_torch(["strategies"], tmp_path)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "s.npz", features=rng.normal(size=(24, 6)), labels=np.arange(24) % 3)
    np.savez(tmp_path / "t.npz", features=rng.normal(size=(20, 6)), labels=np.arange(20) % 3)
    raw = {
        "data": {"kind": "features", "source": "s.npz", "target": "t.npz", "normalize": "zscore"},
        "model": {"name": "mlp", "hidden": [8]},
        "train": {"epochs": 2, "batch_size": 8},
        "active": {"rounds_at": [1], "budget_per_round": 3},
        "store": {"target": "unlabeled"},
    }
    (tmp_path / "F.yaml").write_text(yaml.safe_dump(raw))
    store = ["--store", str(tmp_path / "P")]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["init", *store, "--config", "F.yaml"]) == 0
        assert main(["train", *store]) == 0
        assert main(["query", *store]) == 0
        assert main(["export", *store, "--out", "final"]) == 0
    finally:
        os.chdir(cwd)
    assert (tmp_path / "final" / "model.onnx").is_file()
    assert "round" in assert_no_torch(["status", *store], tmp_path)
    exported = sorted((tmp_path / "P" / "exports").glob("round-001.csv"))
    with open(exported[0], newline="") as fh:
        rows = list(csv.DictReader(fh))
    first_class = Project(tmp_path / "P").classes[0]
    with open(tmp_path / "labels.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "label": first_class})
    assert_no_torch(["label", "import", "labels.csv", *store, "--annotator", "me"], tmp_path)
    assert_no_torch(["config", "set", *store, "store.reviewer=@alice"], tmp_path)
    assert_no_torch(["config", "show", "digits/usps-mnist"], tmp_path)
    out = assert_no_torch(
        ["predict", "--model", "final", "t.npz", "--out", "p.csv", "--engine", "onnxruntime"],
        tmp_path,
    )
    assert "20 predictions (onnxruntime)" in out


def test_pixel_reader_equals_torchvision_on_real_images() -> None:
    """The PIL-only pixels ``eada predict`` feeds ``model.onnx`` are torchvision's, byte for
    byte: an image-folder project (resize) and an image-list project (resize, test resize,
    centre crop, odd margins included), on Office-31 webcam photos and a synthetic odd size."""
    from PIL import Image
    from torchvision import transforms as T

    from eada.config import ImageTransforms
    from eada.store.config import FolderData
    from eada.store.pixels import pixel_reader

    webcam = REPO.parent / "shared" / "data" / "office31" / "webcam" / "images" / "mug"
    if not webcam.is_dir():
        pytest.skip(f"real data not found at {webcam}")
    images = [Image.open(p) for p in sorted(webcam.iterdir())[:4]]
    images.append(Image.new("RGB", (301, 177), color=(200, 30, 90)))
    t = ImageTransforms(resize=67, test_resize=61, crop=48)
    list_cfg = SimpleNamespace(data=SimpleNamespace(kind="images", transforms=t))
    folder_cfg = SimpleNamespace(data=FolderData(source="s", target="t", image_size=29))
    tv_list = T.Compose([T.Resize((67, 67)), T.Resize((61, 61)), T.CenterCrop(48)])
    tv_folder = T.Resize((29, 29))
    ours_list, ours_folder = pixel_reader(list_cfg), pixel_reader(folder_cfg)
    assert ours_list is not None and ours_folder is not None
    for im in images:
        want = np.asarray(tv_list(im.convert("RGB")), dtype=np.uint8)
        assert np.array_equal(ours_list(im), want)
        want = np.asarray(tv_folder(im.convert("RGB")), dtype=np.uint8)
        assert np.array_equal(ours_folder(im), want)


def test_ctrl_c_is_130_from_the_shell_and_an_interrupt_in_python(monkeypatch) -> None:
    """The shell's `eada` returns 130 on Ctrl-C; `main([...])` called in Python (as the tests
    call it) lets the KeyboardInterrupt through instead of turning it into a return value."""
    import eada.cli as cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_presets", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["presets"])
    code = (
        "import sys, eada.cli as c\n"
        "def stop(a):\n    raise KeyboardInterrupt\n"
        "c._cmd_presets = stop\n"
        "sys.argv = ['eada', 'presets']\n"
        "sys.exit(c.main())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
