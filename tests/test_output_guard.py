"""No command writes over what the project owns, nor over a device, FIFO, socket or link
(:mod:`eada.outputs`): a real SURF store and its export, every command that writes files with
its output set to each owned path (bytes unchanged), and the hostile inputs as a table, one row
a case with the message the user sees."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA
from eada.cli import COMMAND_FILES, build_parser, check_outputs, main
from eada.outputs import OutputError, check_output
from eada.runs import write_bytes_atomic

SURF = SHARED_DATA / "office_caltech10_surf"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def surf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A real SURF store (Caltech10 -> webcam, one epoch, one round exported, a report) and its
    export (model.pt, model.onnx, model.json), plus the inputs the commands read."""
    if not SURF.is_dir():
        pytest.skip(f"real data not found at {SURF}")
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("guard")
    store, final = root / "P", root / "final"
    sets = [
        f"data.source={SURF / 'Caltech10_SURF_L10.mat'}",
        f"data.target={SURF / 'webcam_SURF_L10.mat'}",
        "train.epochs=2",
        "active.rounds_at=[1]",
        "model.hidden=[32]",
    ]
    cfg = REPO / "configs" / "office_caltech10_surf.yaml"
    init = ["init", "--store", str(store), "--config", str(cfg)]
    assert main([*init, *[a for s in sets for a in ("--set", s)], "--threads", "1"]) == 0
    assert main(["train", "--store", str(store), "--epochs", "1", "--threads", "1"]) == 0
    assert main(["query", "--store", str(store)]) == 0
    assert main(["export", "--store", str(store), "--out", str(final)]) == 0
    assert main(["report", str(store)]) == 0
    gc.collect()  # no connection left open: the database is whole, no -wal to fold in later
    x = np.random.default_rng(0).random((4, 800), dtype=np.float32)
    np.save(root / "X.npy", x)
    images = root / "imgs" / "a"
    images.mkdir(parents=True)
    (images / "1.jpg").write_bytes(b"not decoded: the guard refuses first")
    (root / "truth.csv").write_text("file,label\n1.jpg,a\n")
    yield {"root": root, "store": store, "final": final, "X": root / "X.npy"}


def _tree(*folders: Path) -> dict[str, tuple[str, int]]:
    """Every path under ``folders``: its type and mode, and a regular file's SHA-256."""
    out: dict[str, tuple[str, int]] = {}
    for folder in folders:
        for p in sorted([folder, *folder.rglob("*")]):
            st = p.lstat()
            what = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out[str(p)] = (what if stat.S_ISREG(st.st_mode) or p.is_dir() else "other", st.st_mode)
    return out


def _commands(s: dict[str, Path]) -> dict[str, Callable[[str], list[str]]]:
    """Every command of :data:`eada.cli.COMMAND_FILES`, as ``argv(output)`` with each of its
    output options in turn set to the output (the others left at new paths)."""
    root, store, final = s["root"], str(s["store"]), str(s["final"])
    round_csv = str(s["store"] / "exports" / "round-001.csv")
    imgs, new = str(root / "imgs"), str(root / "new-output")
    cfg = str(REPO / "configs" / "office_caltech10_surf.yaml")
    return {
        "run --out": lambda t: ["run", "toy", "--out", t],
        "run --tensorboard": lambda t: ["run", "toy", "--out", new, "--tensorboard", t],
        "demo --out": lambda t: ["demo", "--out", t],
        "report --out": lambda t: ["report", store, "--out", t],
        "report --figures": lambda t: ["report", store, "--out", new, "--figures", t],
        "bench --out": lambda t: ["bench", "toy", "--methods", "random", "--out", t],
        "data index --out": lambda t: ["data", "index", imgs, "--out", t],
        "data features --out": lambda t: ["data", "features", cfg, "--out", t],
        "data unlabel OUT": lambda t: ["data", "unlabel", imgs, t, "--truth", new + ".csv"],
        "data unlabel --truth": lambda t: ["data", "unlabel", imgs, new, "--truth", t],
        "data subset OUT": lambda t: ["data", "subset", imgs, t],
        "data fill-labels --out": lambda t: [
            "data",
            "fill-labels",
            round_csv,
            "--truth",
            str(root / "truth.csv"),
            "--out",
            t,
        ],
        "export --out": lambda t: ["export", "--store", store, "--out", t],
        "predict --out": lambda t: ["predict", "--model", final, str(s["X"]), "--out", t],
    }


def _owned(s: dict[str, Path]) -> list[Path]:
    """The paths the store and the export own, one of each kind, and the predict input."""
    store, final = s["store"], s["final"]
    checkpoint = next((store / "checkpoints").glob("train-*.pt"))
    return [
        store,
        store / "eada.sqlite",
        store / "checkpoints",
        checkpoint,
        store / "checkpoints" / "new.pt",  # new, but inside the store's checkpoints/
        store / "exports",
        store / "exports" / "round-001.csv",
        store / "exports" / "labelstudio-config.xml",
        store / "report.html",
        store / "exports" / ".." / "checkpoints" / checkpoint.name,  # through ..
        final,
        final / "model.onnx",
        final / "model.json",
        final / "model.pt",
        final / "labels.csv",
    ]


def test_every_command_onto_every_owned_path_is_refused_and_changes_nothing(
    surf: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command x every owned path through the CLI's guard (one parser, the check
    ``eada.cli.main`` runs before any work); through ``main`` itself: each command once, and
    ``report``/``predict``/``data index`` onto a checkpoint, a round export and model.onnx."""
    commands = _commands(surf)
    walked = {name.rsplit(" ", 1)[0] for name in commands}
    assert walked == set(COMMAND_FILES), "a command that writes files is not walked here"
    link = surf["root"] / "ckpt-link"  # a symlinked folder into the store's checkpoints/
    link.symlink_to(surf["store"] / "checkpoints")
    targets = [*_owned(surf), link / "x.pt"]
    folders = (surf["store"], surf["final"], surf["root"] / "imgs")
    before = _tree(*folders)
    x_before = surf["X"].read_bytes()
    parser = build_parser()
    for name, argv in commands.items():
        for target in targets:
            if name == "report --out" and target == surf["store"] / "report.html":
                continue  # the report's own page: it rewrites it (checked below)
            if name == "export --out" and target == surf["final"]:
                continue  # its own previous export: --force replaces it (checked below)
            with pytest.raises(OutputError) as err:
                check_outputs(parser.parse_args(argv(str(target))))
            assert str(target).split("/")[-1] in str(err.value), (name, target, err.value)
    checkpoint = next((surf["store"] / "checkpoints").glob("train-*.pt"))
    grader = [checkpoint, surf["store"] / "exports" / "round-001.csv", surf["final"] / "model.onnx"]
    through_main = [(argv, target) for name, argv in commands.items() for target in targets[3:4]]
    through_main += [
        (commands[name], target)
        for name in ("report --out", "predict --out", "data index --out")
        for target in grader
    ]
    for argv, target in through_main:
        code = main(argv(str(target)))
        err = capsys.readouterr().err
        assert code == 2, (argv(str(target)), err)
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "Traceback" not in err and "bug in eada" not in err, err
    assert _tree(*folders) == before
    assert surf["X"].read_bytes() == x_before
    assert not (surf["root"] / "new-output").exists()
    # what stays allowed: the report's own page, export --force into its own previous export,
    # predict into a new file
    assert main(["report", str(surf["store"]), "--out", str(surf["store"] / "report.html")]) == 0
    again = ["export", "--store", str(surf["store"]), "--out", str(surf["final"]), "--force"]
    assert main(again) == 0
    fresh = surf["root"] / "fresh.csv"
    argv = ["predict", "--model", str(surf["final"]), str(surf["X"]), "--out", str(fresh)]
    assert main(argv) == 0 and fresh.stat().st_size > 0
    capsys.readouterr()


def _special(kind: str, where: Path) -> Path:
    """A device node (root only: /dev/full's numbers), a FIFO or a socket made in ``where``."""
    p = where / kind
    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # a full device, in the test's folder
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    return p


@pytest.mark.parametrize("kind", ["device", "fifo", "socket"])
def test_devices_fifos_and_sockets_stay_what_they_are(
    surf: dict[str, Path], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _special(kind, tmp_path)
    mode = target.lstat().st_mode
    predict = ["predict", "--model", str(surf["final"]), str(surf["X"]), "--out", str(target)]
    for argv in (predict, ["report", str(surf["store"]), "--out", str(target)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "not a regular file" in err and str(target) in err, err
        assert target.lstat().st_mode == mode  # still the device, FIFO or socket
    with pytest.raises(OutputError, match="not a regular file"):
        write_bytes_atomic(target, b"x")  # the low-level writer refuses too
    assert target.lstat().st_mode == mode


def _damaged(surf: dict[str, Path], where: Path, change: Callable[[Path], None]) -> Path:
    folder = where / "model"
    shutil.copytree(surf["final"], folder)
    change(folder)
    return folder


def _flip_one_byte(folder: Path) -> None:
    data = bytearray((folder / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 1
    (folder / "model.onnx").write_bytes(bytes(data))


def _truncate_unrecorded(folder: Path) -> None:
    meta = json.loads((folder / "model.json").read_text())
    meta["onnx"]["sha256"] = None  # an older export: no digest to catch it
    (folder / "model.json").write_text(json.dumps(meta))
    (folder / "model.onnx").write_bytes((folder / "model.onnx").read_bytes()[:500])


def _meta(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        meta = json.loads((folder / "model.json").read_text())
        edit(meta)
        (folder / "model.json").write_text(json.dumps(meta))

    return change


MODEL_CASES = [
    (_flip_one_byte, "model.onnx does not match the SHA-256 recorded in"),
    (_truncate_unrecorded, "ONNX Runtime cannot load it"),
    (_meta(lambda m: m.update(classes=m["classes"][:5])), "10 output classes, model.json names 5"),
    (
        _meta(lambda m: m["feature_statistics"].update(mean=m["feature_statistics"]["mean"][:5])),
        "feature_statistics.mean holds 5 values, the model takes 800 features",
    ),
    (_meta(lambda m: m.update(classes="abc")), "'classes' is not a list of distinct class names"),
    (lambda f: (f / "model.json").write_text("{"), "model.json: not valid JSON"),
]


@pytest.mark.parametrize(("change", "says"), MODEL_CASES)
def test_damaged_models_are_refused_naming_the_file(
    surf: dict[str, Path],
    tmp_path: Path,
    change: Callable[[Path], None],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = _damaged(surf, tmp_path, change)
    out = tmp_path / "p.csv"
    assert main(["predict", "--model", str(model), str(surf["X"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
    assert str(model) in err and not out.exists()


def test_hostile_outputs_and_sizes_table(
    surf: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row a case: the command, the message the user sees (exit 2, one line)."""
    final, x, store = str(surf["final"]), str(surf["X"]), str(surf["store"])
    (tmp_path / "file.csv").write_text("keep me\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "file.csv")
    np.save(tmp_path / "empty.npy", np.zeros((0, 800), np.float32))
    cfg = str(REPO / "configs" / "office_caltech10_surf.yaml")
    predict = ["predict", "--model", final]
    cases = [
        ([*predict, x, "--out", x], "is an input of this command"),
        ([*predict, x, "--out", str(tmp_path / "link.csv")], "is a symbolic link"),
        (["report", store, "--out", str(tmp_path / "link.csv")], "is a symbolic link"),
        (["report", store, "--out", "-"], "cannot write to standard output"),
        ([*predict, str(tmp_path / "empty.npy"), "--out", str(tmp_path / "e.csv")], "no rows"),
        (
            ["init", "--store", str(tmp_path / "q"), "--config", cfg, "--threads", "100000"],
            "--threads 100000 is more than the",
        ),
        (
            ["run", "toy", "--set", "model.name=mlp", "--set", "model.hidden=[2000000000]"],
            "the largest model.hidden[0] that fits is",
        ),
        (["run", "toy", "--set", "model.name=mlp", "--set", "model.hidden=[0]"], "hidden"),
    ]
    for argv, says in cases:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and says in err, (argv, err)
        last = err.strip().splitlines()[-1]  # `run` says which seed it starts first
        assert last.startswith("error: ") and "Traceback" not in err, (argv, err)
    assert (tmp_path / "file.csv").read_text() == "keep me\n"
    assert (tmp_path / "link.csv").is_symlink()
    assert not (tmp_path / "q").exists() and not (tmp_path / "e.csv").exists()


def test_the_guard_as_a_function(tmp_path: Path) -> None:
    """Python callers get the same rule: the input folder's files, a folder holding an input."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jpg").write_bytes(b"x")
    check_output(tmp_path / "in" / "new.csv", inputs=[tmp_path / "in"])  # new: fine
    with pytest.raises(OutputError, match="under the input folder"):
        check_output(tmp_path / "in" / "a.jpg", inputs=[tmp_path / "in"])
    with pytest.raises(OutputError, match="holds the input"):
        check_output(tmp_path, kind="folder", inputs=[tmp_path / "in" / "a.jpg"])
    check_output("-", stdout=True)


def test_configs_names_and_logs_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row a case: a config, a setting or a log that meant something else than it said."""
    from eada.api import open_project
    from eada.runs import read_jsonl
    from eada.store.config import StoreOptions, check_annotator, check_label_studio_root_exists

    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup.yaml").write_text("name: x\nseed: 7\nseed: 8\n")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "digits.yaml").write_text("name: x\nseed: " + "9" * 5001 + "\n")
    cases = [
        (["run", "dup.yaml"], "the key 'seed' is given twice; keep one at line 3"),
        (["run", "latin1.yaml"], "latin1.yaml is not UTF-8 text"),
        (["run", "digits.yaml"], "digits.yaml: a value eada cannot read"),
        (["run", "toy", "--set", "optim={lr: 1, lr: 2}"], "the key 'lr' is given twice"),
        (["bench", "toy", "--out", "b", "--max-runs", "-1"], "--max-runs must be >= 0"),
        (["run", "toy", "--dry-run", "--set", "train.gamma=1e30"], "less than or equal to 1000"),
        (["run", "toy", "--dry-run", "--set", "train.batch_size=100000000"], "equal to 65536"),
    ]
    for argv, says in cases:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and says in err, (argv, err)
    assert not (tmp_path / "b").exists()
    for name in ("ali\u202eecila", "al\u200bice", "alice\ufeff"):
        with pytest.raises(ValueError, match="invisible or direction-changing character"):
            check_annotator(name)
    with pytest.raises(ValueError, match="relative path"):
        StoreOptions.model_validate({"label_studio_root": "images"})
    with pytest.raises(ValueError, match="does not exist"):
        check_label_studio_root_exists(StoreOptions(label_studio_root=tmp_path / "gone"))
    from eada.store.labelfiles import ImportFileError, read_csv

    wide = ",".join(["sample_id", "label", *(f"c{i}" for i in range(100_000))])
    with pytest.raises(ImportFileError, match="100,002 columns, more than the 10,000"):
        read_csv(wide + "\n" + ",".join(["1", "a", *["x"] * 100_000]) + "\n")
    # init keeps the config's seed, and --set seed=N
    assert main(["config", "show", "toy"]) == 0
    text = capsys.readouterr().out.replace("\nseed: 0\n", "\nseed: 7\n")
    (tmp_path / "toy.yaml").write_text(text)
    assert main(["init", "--store", "s7", "--config", "toy.yaml"]) == 0
    assert main(["init", "--store", "s9", "--config", "toy.yaml", "--set", "seed=9"]) == 0
    assert open_project(tmp_path / "s7").cfg.seed == 7
    assert open_project(tmp_path / "s9").cfg.seed == 9
    # a torn last line of runs.jsonl: skipped with one warning naming the file and line
    log = tmp_path / "runs.jsonl"
    log.write_text('{"seed": 0}\n{"seed": 1, "resu')
    capsys.readouterr()
    assert [r["seed"] for r in read_jsonl(log)] == [0]
    assert [r["seed"] for r in read_jsonl(log)] == [0]
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and f"{log}: line 2 is torn" in err, err


def test_reports_are_private_wherever_they_go(
    surf: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        out = tmp_path / "shared" / "r.html"
        assert main(["report", str(surf["store"]), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert stat.S_IMODE((surf["store"] / "report.html").stat().st_mode) == 0o600
