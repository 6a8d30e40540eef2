"""Results you can trust: resume keyed by the resolved config (``eada run``, ``eada bench``),
plans that train on every label they query, summaries that never crash, one-line errors, and
the accuracy on the target samples never labeled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from eada import bench
from eada.cli import main, summary_table
from eada.config import ConfigError, ExperimentConfig
from eada.experiment import run_seeds
from eada.hparams import PRESETS, preset_config
from eada.runs import OtherConfigError, read_jsonl

TOY = ["train.epochs=2", "active.rounds_at=[1]", "data.n_per_class=60"]


def _toy_yaml(path: Path, epochs: int = 2) -> Path:
    raw = json.loads(json.dumps(PRESETS["toy"]))
    raw["train"]["epochs"] = epochs
    raw["active"]["rounds_at"] = [1]
    raw["data"]["n_per_class"] = 60
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def _sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def test_run_refuses_a_folder_holding_another_configs_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's scenario: `--method random` then `--method eada` into the same folder."""
    cfg = _toy_yaml(tmp_path / "toy.yaml")
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--method", "random", "--seeds", "0", "--out", str(out)]) == 0
    before = (out / "runs.jsonl").read_text(), (out / "results.json").read_text()
    capsys.readouterr()
    assert main(["run", str(cfg), "--method", "eada", "--seeds", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds runs of another config" in err
    assert "active.strategy: 'random' -> 'eada'" in err and "train.gamma: 0.0 -> 0.01" in err
    # nothing trained, nothing rewritten: the folder still says random
    assert ((out / "runs.jsonl").read_text(), (out / "results.json").read_text()) == before
    assert json.loads((out / "config.json").read_text())["active"]["strategy"] == "random"
    # the same config with another seed resumes there (the seed is not part of the key)
    assert main(["run", str(cfg), "--method", "random", "--seeds", "0-1", "--out", str(out)]) == 0
    assert [r["seed"] for r in read_jsonl(out / "runs.jsonl")] == [0, 1]
    # a changed override is refused too, naming the key
    with pytest.raises(OtherConfigError, match=r"train\.batch_size: 32 -> 16"):
        run_seeds(
            lambda s: preset_config("toy", "random", s, [*TOY, "train.batch_size=16"]), [0], out
        )


def test_run_default_folders_keep_methods_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for method in ("random", "eada"):
        assert main(["run", "toy", "--method", method, *_sets(TOY)]) == 0
    for method in ("random", "eada"):
        results = json.loads((tmp_path / "runs" / f"toy_{method}" / "results.json").read_text())
        assert results["strategy"] == method


def test_bench_keys_tasks_by_their_identity_not_their_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _toy_yaml(tmp_path / "cfgs" / "x.yaml")
    out = tmp_path / "bench"
    first = bench.run_grid(bench.build_grid(["cfgs/x.yaml"], ["random"], [0]), out)
    assert first[0]["task"] == "cfgs/x.yaml"
    for spelling in (str(tmp_path / "cfgs" / "x.yaml"), "./cfgs/x.yaml", "cfgs/../cfgs/x.yaml"):
        assert bench.task_id(spelling) == "cfgs/x.yaml"
        again = bench.run_grid(bench.build_grid([spelling], ["random"], [0]), out)
        assert again == first  # nothing trained again
    # two spellings in one grid are one task
    assert len(bench.build_grid(["cfgs/x.yaml", "./cfgs/x.yaml"], ["random"], [0])) == 1
    assert len(read_jsonl(out / "runs.jsonl")) == 1
    # a line written under an older literal spelling, same config: adopted, not re-run
    rec = read_jsonl(out / "runs.jsonl")[0]
    rec["key"] = json.dumps(["./cfgs/x.yaml", "random", [], 0])
    (out / "runs.jsonl").write_text(json.dumps(rec) + "\n")
    adopted = bench.run_grid(bench.build_grid(["cfgs/x.yaml"], ["random"], [0]), out)
    assert adopted[0]["key"] == first[0]["key"] and len(read_jsonl(out / "runs.jsonl")) == 1
    # the same YAML edited: refused, naming the key
    _toy_yaml(tmp_path / "cfgs" / "x.yaml", epochs=3)
    with pytest.raises(ValueError, match=r"train\.epochs: 2 -> 3"):
        bench.run_grid(bench.build_grid(["cfgs/x.yaml"], ["random"], [0]), out)


def test_bench_tasks_with_the_same_file_name_get_their_own_columns(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a" / "x.yaml"), str(tmp_path / "b" / "x.yaml")
    recs = [
        {"task": t, "method": "random", "variant": [], "seed": 0, "final": {"target/accuracy": v}}
        for t, v in ((a, 50.0), (b, 70.0))
    ]
    head = bench.accuracy_table(recs).splitlines()[0]
    assert head == f"| Method | {a} | {b} | Mean |"
    assert bench.task_labels([a, "digits/mnist-usps"]) == {
        a: "x",
        "digits/mnist-usps": "digits/mnist-usps",
    }


def test_a_round_at_the_last_epoch_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's plan: 2 epochs with rounds at 1 and 2 (data.root points nowhere: the
    refusal comes before any data is read)."""
    args = ["train.epochs=2", "active.rounds_at=[1,2]", f"data.root={tmp_path / 'none'}"]
    assert main(["run", "digits/mnist-usps", *_sets(args)]) == 2
    err = capsys.readouterr().err
    assert "at or after the last epoch" in err and "never be trained on" in err
    assert "--set train.epochs=3" in err and "--set active.rounds_at=[1]" in err
    with pytest.raises(ConfigError, match=r"train\.epochs=6\)$"):
        preset_config("toy", None, 0, ["train.epochs=5", "active.rounds_at=[5]"])
    # the defaults (e.g. a feature-input config that sets no schedule) are a valid plan:
    # five rounds, each followed by at least one epoch of training
    cfg = ExperimentConfig.model_validate(
        {"data": {"kind": "features", "source": "s.npz", "target": "t.npz"}}
    )
    assert cfg.active.rounds_at[-1] < cfg.train.epochs and len(cfg.active.rounds_at) == 5
    # no schedule at all (no target labels) stays valid whatever the epochs
    preset_config("toy", "source_only", 0, ["train.epochs=1", "active.rounds_at=[1]"])


def test_summary_table_shows_unmeasured_values_as_dashes() -> None:
    """A stored summary whose last round had no training after it (what crashed with
    ``KeyError: 'target/accuracy'``) prints ``-`` there."""
    stat = {"values": [80.0], "mean": 80.0, "std": 0.0}
    summary = {
        "rounds": [
            {"round": 0, "n_labeled": [0], "target/accuracy": stat},
            {"round": 1, "n_labeled": [5]},
        ],
        "final": {"last_epoch/target/accuracy": stat},
    }
    console = Console(record=True, width=200)
    console.print(summary_table(summary, "t"))
    text = console.export_text()
    assert "80.00 ± 0.00" in text and "│ 1     │ 5       │                           - │" in text


def test_summaries_and_tables_show_accuracy_on_never_labeled_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["run", "toy", "--method", "random", *_sets(TOY), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "never-labeled target" in printed and "whole target" in printed
    (run,) = read_jsonl(out / "runs.jsonl")
    last = run["results"]["final"]["last_epoch"]
    n_labeled = len(run["results"]["labeled_indices"])
    assert last["target"]["n"] == 120 and last["target_unlabeled"]["n"] == 120 - n_labeled > 0
    summary = json.loads((out / "results.json").read_text())
    acc = summary["final"]["last_epoch/target_unlabeled/accuracy"]
    assert acc["values"] == [last["target_unlabeled"]["accuracy"]]
    # before any label the never-labeled set is the whole target
    r0 = run["results"]["rounds"][0]["after_training"]
    assert r0["target_unlabeled"]["accuracy"] == r0["target"]["accuracy"]
    # the HTML report's summary
    from eada.reports.html import build_report

    html = build_report(out, tmp_path / "r.html").read_text()
    assert "never-labeled target acc % (last epoch)" in html
    # eada bench: its own table
    recs = bench.run_grid(bench.build_grid(["toy"], ["random"], [0], TOY), tmp_path / "b")
    assert recs[0]["final"]["target_unlabeled/accuracy"] == pytest.approx(
        last["target_unlabeled"]["accuracy"]
    )
    assert "target samples never labeled" in bench.render_tables(recs)


def test_errors_are_one_line_whatever_the_path_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path.joinpath(*(["a-rather-long-folder-name-" + "x" * 40] * 6), "nothing")
    assert len(str(deep)) > 300
    assert main(["report", str(deep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(deep) in err and "not a folder" in err
    # brackets in a message are text, not markup
    assert main(["report", str(tmp_path / "[bold]x")]) == 2
    assert "[bold]x" in capsys.readouterr().err
    # YAML syntax errors, in a config file or in a --set value: one line, where, exit 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain:\n  epochs: [3\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid YAML" in err and "at line 4, column 1" in err
    assert main(["run", "toy", "--set", "train.epochs=[", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "override 'train.epochs=['" in err and "bug" not in err
    # a config that does not validate: every problem on the one line, each with its key
    assert main(["run", "toy", "--set", "optim.lr=inf", "--set", "train.gamma=x", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.lr: " in err and "; train.gamma: " in err


def test_scores_from_energies_are_one_blockwise_pass() -> None:
    """EADA from energies computes F and U block by block (one pass over the matrix, block-
    sized temporaries), with exactly the values of the whole-matrix functions."""
    import numpy as np
    import torch

    from eada import energy
    from eada.strategies import PoolOutputs

    rng = np.random.default_rng(0)
    e = rng.normal(size=(3001, 345)).astype(np.float32)  # > 1 block of ~760 rows
    pool = PoolOutputs(energies=e, n_target=len(e))
    f, u = pool.get_free_energy(), pool.get_mvsm()
    assert np.array_equal(f, energy.free_energy(torch.from_numpy(e)).numpy())
    assert np.array_equal(u, energy.mvsm(torch.from_numpy(e)).numpy())
    one = PoolOutputs(energies=e[:, :1].copy())  # one class: F exists, U does not
    assert one.get_free_energy().shape == (3001,)
    with pytest.raises(ValueError, match="2 classes"):
        one.get_mvsm()
    for bad in (np.nan, np.inf, -np.inf):  # checked without an (N, C) temporary
        e2 = e.copy()
        e2[1234, 7] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            PoolOutputs(energies=e2)


def test_segmentation_run_refuses_a_folder_of_another_config(tmp_path: Path) -> None:
    """`eada run` on a segmentation config shares the check (before any data is read)."""
    from eada.runs import append_jsonl
    from eada.segmentation.cli import resolve_seg_config
    from eada.segmentation.train import run_seg_seeds

    syn = Path(__file__).resolve().parents[1] / "configs" / "seg_synthetic.yaml"
    stored = resolve_seg_config(str(syn), None, [], 0)
    append_jsonl(tmp_path / "runs.jsonl", {"seed": 0, "config": stored.resolved()})
    other = resolve_seg_config(str(syn), None, ["train.gamma=0.5"], 0)
    with pytest.raises(OtherConfigError, match=r"train\.gamma: 0\.01 -> 0\.5"):
        run_seg_seeds(lambda s: other, [0], tmp_path)


def test_runs_stored_before_train_alignment_existed_are_not_resumed_as_another_variant(
    tmp_path: Path,
) -> None:
    """Runs recorded before ``train.alignment`` existed used the paper's L_fea: resuming them
    under the new default (``balanced``) would report paper-loss numbers under it."""
    from eada.runs import check_same_config

    current = preset_config("toy", "eada", 0).resolved()
    old = json.loads(json.dumps(current))
    del old["train"]["alignment"]
    records = [{"seed": 0, "config": old}]
    current["train"]["alignment"] = "balanced"
    with pytest.raises(OtherConfigError, match=r"train\.alignment: 'paper'"):
        check_same_config(records, current, tmp_path)
    current["train"]["alignment"] = "paper"
    check_same_config(records, current, tmp_path)  # the same config: resumes
