"""The commands of README.md and docs/*.md run as written.

(The pages under ``docs/results/`` are records of benchmark runs, moved from BENCHMARKS.md:
their commands are hours of training, not a user's commands; they are not run here, but every
``python benchmarks/...`` script they or BENCHMARKS.md name must exist,
:func:`test_every_benchmark_script_named_in_the_docs_exists`.)

Every ``eada ...`` line of a fenced shell block is found and classified, so a new or changed
command is never silently untested:

* a synopsis (placeholders such as ``[--seeds N]``, ``RUN_DIR``, ``...``) is not a command;
* a cheap command runs exactly as written (in a scratch folder beside which ``../shared`` is the
  repository's ``../shared``, so relative paths mean what they mean in the repository root);
* a training or grid command runs with ``--dry-run`` appended (its config, overrides and data
  paths validate as written; nothing trains);
* the rest is listed in :data:`NOT_RUN` with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from eada.cli import main
from eada.runs import read_jsonl
from support import real_data

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Commands that neither run nor dry-run here, with the reason (keyed by the command as written).
NOT_RUN: dict[str, str] = {
    "eada report --compare runs/mine --out runs/mine-compare": "needs the tutorial's full grid "
    "of the line before it (hours; that one dry-runs); the same command on its first grid runs",
    "eada report benchmarks/results/digits --figures docs/figures": "about a minute of "
    "figures (tests/test_reports.py covers eada report); writes into docs/",
    "eada report benchmarks/results/digits --out digits.html --figures figs/": "as above",
    "eada report runs/toy": "needs the trained run of the line before it (dry-run here)",
    "eada demo --out runs/demo && eada report runs/demo": "make demo runs eada demo; "
    "tests/test_reports.py reports a demo folder",
    "python benchmarks/digits.py --seeds 0-2 --out runs/digits": "a benchmark (hours); tested "
    "below: the committed results predate the data digests and are refused, not reused",
    "eada data features configs/office31_amazon_subset_webcam_lite0_frozen.yaml --out "
    "feats/office.npz": "minutes of extraction; tests/test_export.py runs it on a subset",
    "eada run feats/office.yaml --seeds 0-2": "needs the files of the line before it "
    "(tests/test_export.py runs one)",
    "eada init --store runs/proj --config configs/annotate_office31_unlabeled.yaml": "extracts "
    "Lite0 features of 1,795 images (minutes); the store flow: tests/test_store.py",
    "eada train --store runs/proj": "store flow (needs the init above): tests/test_store.py",
    "eada query --store runs/proj": "store flow: tests/test_store.py",
    "eada label import runs/filled.csv --store runs/proj --annotator alice": "needs a filled "
    "export of the line before it",
    "eada status --store runs/proj --json": "store flow: tests/test_store.py",
    "eada report runs/proj": "store flow: the project report's own tests",
    "eada export --store runs/proj --out runs/final": "store flow: tests/test_store.py",
    "eada labelstudio connect --store runs/proj --url http://127.0.0.1:8080": "needs a running "
    "Label Studio: tests/test_labelstudio_live.py runs the README's Label Studio block as "
    "written against a real server (store and port substituted)",
    "eada labelstudio pull --store runs/proj": "as above (tests/test_labelstudio_live.py)",
    "eada labelstudio connect --store runs/proj --url http://127.0.0.1:8080 --overlap 2": "needs "
    "a running Label Studio: tests/test_labelstudio_team.py follows docs/label-studio.md's team "
    "route (--overlap 2, an annotator joining by the invite link) against a real server",
    "eada status --store runs/proj": "as above (tests/test_labelstudio_live.py)",
    "eada labelstudio push --store runs/proj": "needs a connected store and a running Label "
    "Studio (tests/test_labelstudio_live.py pushes through eada query)",
    "eada query --store runs/proj --audit 20": "store flow (needs the init above): "
    "tests/test_pool.py draws and labels an audit round",
    "eada target scan --store runs/proj": "store flow: tests/test_pool.py grows a pool",
    "eada config set --store runs/proj store.label_studio_root=/srv/label-studio-data": "needs "
    "a store whose images lie under that folder: tests/test_labelstudio_team.py sets the root "
    "after init (connect --root, the same call)",
    "eada config set --store runs/proj store.conflicts=majority store.conflict_tie=reviewer "
    "store.reviewer=alice": "needs a store with annotators: tests/test_store_disputes.py runs "
    "eada config set on one",
}
TEMPLATE = re.compile(r"\[|\||\.\.\.|\$|\b[A-Z][A-Z_0-9]{2,}\b|\bM\b")
TRAINS = ("eada run ", "eada bench ")
#: training commands cheap enough to run for real
RUN_FOR_REAL = {
    "eada run toy --set train.epochs=3 --set active.rounds_at=[1,2]",
    # the tutorial's first grid (12 SURF runs of 2 epochs, --jobs 2) and its second plugin's
    "eada bench surf/C-A,surf/A-W --plugin my_method.py --methods density_margin,random,eada "
    "--seeds 0-1 --jobs 2 --set train.epochs=2 --set active.rounds_at=[1] --out runs/quick",
    "eada bench surf/C-A,surf/A-W --plugin my_method.py --plugin my_component.py --methods "
    "density_margin_ent,density_margin --seeds 0-1 --jobs 2 --set train.epochs=2 --set "
    "active.rounds_at=[1] --out runs/quick",
}
#: a fenced Python block with a file name (```python title="my_method.py"```): the page's file,
#: written into the scratch folder before the page's commands run
FILE_BLOCK = re.compile(r'```python title="([\w.]+)"\n(.*?)```', re.S)


def doc_files(doc: str) -> dict[str, str]:
    """The files a page shows under a title (its plugins), by name."""
    return dict(FILE_BLOCK.findall(next(d for d in DOCS if d.name == doc).read_text()))


#: the folder the --table-only line reads: what its grid line made (digits records) AND toy
#: records of another grid, so the line must print the table of the task it names only
TABLE_ONLY = "eada bench digits/mnist-usps --out runs/bench --table-only --format latex"


def doc_commands() -> list[tuple[str, str, list[str]]]:
    """``(file name, command, its words)`` for every ``eada`` / ``python benchmarks`` line of a
    fenced shell block, in document order (continuation lines joined, comments dropped)."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if not (line.startswith("eada ") or line.startswith("python benchmarks/")):
                    continue
                words = shlex.split(line, comments=True)
                out.append((doc.name, " ".join(words), words))
    return out


def classify(cmd: str) -> str:
    """``synopsis``, ``skip``, ``dry-run`` or ``run``."""
    if cmd in NOT_RUN:
        return "skip"
    if any(TEMPLATE.search(w) for w in cmd.split() if "=" not in w or "[" in w.split("=")[0]):
        return "synopsis"
    if cmd in RUN_FOR_REAL:
        return "run"
    if cmd.startswith(TRAINS) and "--table-only" not in cmd and "--dry-run" not in cmd:
        return "dry-run"
    return "run"


COMMANDS = doc_commands()


def test_docs_have_commands_and_every_one_is_classified() -> None:
    kinds = {cmd: classify(cmd) for _, cmd, _ in COMMANDS}
    assert sum(k == "run" for k in kinds.values()) >= 8
    assert kinds[TABLE_ONLY] == "run" and kinds[next(iter(RUN_FOR_REAL))] == "run"
    stale = set(NOT_RUN) - set(kinds)
    assert not stale, f"NOT_RUN lists commands the docs no longer have: {stale}"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp/work`` with the repository's configs/benchmarks/docs and ``tmp/shared``."""
    if not SHARED.is_dir():
        pytest.skip("needs ../shared")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)
    for name in ("configs", "benchmarks", "docs"):
        (work / name).symlink_to(REPO / name)
    (work / "runs" / "bench").mkdir(parents=True)
    digits = [
        json.dumps(r) for r in read_jsonl(REPO / "benchmarks/results/bench_digits/runs.jsonl")
    ]
    toy = [line.replace("digits/mnist-usps", "toy") for line in digits[:3]]
    (work / "runs/bench/runs.jsonl").write_text("\n".join([*toy, *digits]) + "\n")
    monkeypatch.chdir(work)
    return work


@pytest.mark.data
@pytest.mark.parametrize(
    "doc", sorted({d for d, cmd, _ in COMMANDS if classify(cmd) in ("run", "dry-run")})
)
def test_doc_commands_run_as_written(doc: str, workdir: Path) -> None:
    """A document's commands, in its order, in one scratch folder (later lines use what
    earlier ones wrote, as a reader's would)."""
    ran = 0
    for name, text in doc_files(doc).items():  # the page's files (plugins), as a reader saves them
        Path(name).write_text(text)
    for _, cmd, words in [c for c in COMMANDS if c[0] == doc]:
        kind = classify(cmd)
        if kind not in ("run", "dry-run"):
            continue
        redirect = None
        if ">" in words:
            at = words.index(">")
            words, redirect = words[:at], words[at + 1]
        if kind == "dry-run":
            words = [*words, "--dry-run"]
        assert words[0] == "eada"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(words[1:])
        assert code == 0, f"{doc}: {cmd!r} exited {code}"
        ran += 1
        if redirect:
            Path(redirect).write_text(buf.getvalue())
            assert main(["run", redirect, "--dry-run"]) == 0  # the YAML it wrote runs
        if cmd in RUN_FOR_REAL and "--plugin" in words:  # the tutorial's grids name the plugins
            recs = read_jsonl(Path(words[words.index("--out") + 1]) / "runs.jsonl")
            named = [r for r in recs if r["plugins"]]
            assert named and all(r["method"].startswith("density_margin") for r in named)
            assert all(r["plugins"] == [] for r in recs if r not in named)
        if cmd == TABLE_ONLY:
            assert "mnist-usps" in buf.getvalue() and "toy" not in buf.getvalue()
        if cmd.startswith("eada predict") and "--labels" in words:  # the own-images tours
            acc = re.search(r"accuracy ([\d.]+)%", buf.getvalue())
            assert acc and float(acc.group(1)) >= 80.0, buf.getvalue()
    assert ran


def test_every_benchmark_script_named_in_the_docs_exists() -> None:
    """``benchmarks/X.py`` in any page (README, BENCHMARKS.md, CONTRIBUTING.md, docs/ and its
    results pages) names a script that is there (the investigations moved to
    ``benchmarks/investigations/``: a stale path fails here)."""
    pages = [REPO / "BENCHMARKS.md", REPO / "CONTRIBUTING.md", *DOCS]
    pages += sorted((REPO / "docs").rglob("*.md"))
    named = {
        (page.relative_to(REPO).as_posix(), m)
        for page in pages
        for m in re.findall(r"\bbenchmarks/[\w/]+\.py\b", page.read_text())
    }
    assert len({m for _, m in named}) >= 20
    missing = sorted((page, m) for page, m in named if not (REPO / m).is_file())
    assert not missing, f"pages name benchmark scripts that do not exist: {missing}"


def test_digits_benchmark_refuses_committed_runs_without_a_data_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python benchmarks/digits.py --seeds 0-2`` on the committed results: their records
    predate the data digests (and ``train.amp``), so what they ran on cannot be told; they are
    refused (not silently reused, not re-trained), naming the way to start afresh."""
    import importlib.util

    from eada.runs import OtherConfigError

    real_data("digits")
    out = tmp_path / "digits"
    shutil.copytree(REPO / "benchmarks/results/digits", out)
    spec = importlib.util.spec_from_file_location("digits_bench", REPO / "benchmarks/digits.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import eada.experiment

    def no_training(*a: object, **k: object) -> None:
        raise AssertionError("benchmarks/digits.py trained a run that is committed")

    monkeypatch.setattr(eada.experiment, "run_once", no_training)
    monkeypatch.chdir(REPO)
    # (these records also predate train.amp: the code ran fp32 then, the default is now True)
    with pytest.raises(OtherConfigError, match=r"train\.amp: False .*another --out"):
        mod.main(["--seeds", "0-2", "--out", str(out)])
