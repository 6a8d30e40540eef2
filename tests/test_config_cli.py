"""Configs are validated before any work; the CLI and the run records."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from eada.cli import main
from eada.config import ConfigError, load_config
from eada.experiment import run_seeds
from eada.hparams import PRESETS, preset_config
from eada.runs import parse_seeds, read_jsonl


def test_every_preset_and_method_validates() -> None:
    from eada.hparams import METHODS

    for p in PRESETS:
        for m in METHODS:
            cfg = preset_config(p, m)
            assert cfg.resolved()["name"] == PRESETS[p]["name"]


def test_unknown_key_and_wrong_type_are_named(tmp_path: Path) -> None:
    raw = {"data": {"kind": "toy"}, "train": {"epochs": "many", "gama": 0.1}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "train.epochs" in msg and "train.gama" in msg and "Extra inputs" in msg


def test_unknown_strategy_lists_known(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown strategy .badgee.*eada"):
        preset_config("toy", None, 0, ["active.strategy=badgee"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["active.strategy=waal", "active.params.selectoin=5"],
            r"params\.selectoin is not a setting of strategy .waal.*selection",
        ),
        (
            ["active.strategy=eada", "active.params.alpha1=0.3"],
            r"params\.alpha1: set active\.alpha1 instead",
        ),
        (
            ["active.strategy=clue", "active.params.aux_components=[critic]"],
            "aux_components must be a list of",
        ),
    ],
)
def test_strategy_params_that_would_be_ignored_are_errors(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        preset_config("toy", None, 0, overrides)


def test_strategy_and_component_params_are_accepted() -> None:
    cfg = preset_config(
        "toy",
        None,
        0,
        ["active.strategy=waal", "active.params.selection=5", "active.params.critic_weight=0.01"],
    )
    assert cfg.active.params == {"selection": 5, "critic_weight": 0.01}


def test_segmentation_params_are_checked_too() -> None:
    from eada.segmentation.config import SegActiveConfig

    with pytest.raises(ValueError, match=r"params\.rule: set active\.selection_rule"):
        SegActiveConfig(strategy="eada", params={"rule": "reference"})


def test_rounds_past_epochs_and_unsorted_rounds() -> None:
    with pytest.raises(ConfigError, match=r"at or after the last epoch"):
        preset_config("toy", None, 0, ["active.rounds_at=[10,50]"])
    with pytest.raises(ConfigError, match="strictly increasing"):
        preset_config("toy", None, 0, ["active.rounds_at=[3,2]"])


@pytest.mark.parametrize("budget", ["0", "1.5", "-3", "true"])
def test_bad_budget(budget: str) -> None:
    with pytest.raises(ConfigError, match="budget"):
        preset_config("toy", None, 0, [f"active.budget_per_round={budget}"])


def test_parse_seeds() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("3,1") == [3, 1]
    for bad in ("4-1", "a", "1,1", "-1"):
        with pytest.raises(ValueError, match="seed"):
            parse_seeds(bad)


def test_run_seeds_writes_records_and_resumes(tmp_path: Path) -> None:
    def make(seed: int):
        return preset_config("toy", "eada", seed, ["train.epochs=3", "active.rounds_at=[1,2]"])

    out = tmp_path / "run"
    summary = run_seeds(make, [0, 1], out)
    for name in ("config.json", "meta.json", "results.json", "runs.jsonl"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "meta.json").read_text())
    assert {"torch", "numpy", "python", "git", "eada"} <= set(meta)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["seed"] == 0 and cfg["train"]["epochs"] == 3
    runs = read_jsonl(out / "runs.jsonl")
    assert [r["seed"] for r in runs] == [0, 1]
    assert summary["final"]["last_epoch/target/accuracy"]["values"] == [
        100 * 0 + r["results"]["final"]["last_epoch"]["target"]["accuracy"] for r in runs
    ]
    # a torn last line (killed writer) is ignored, finished seeds are not run again
    with (out / "runs.jsonl").open("a") as fh:
        fh.write('{"seed": 2, "trunc')
    calls = []
    run_seeds(lambda s: calls.append(s) or make(s), [0, 1], out)
    assert len(read_jsonl(out / "runs.jsonl")) == 2


def test_summary_carries_and_prints_training_warnings(tmp_path: Path) -> None:
    from rich.console import Console

    from eada.data.commands import print_summary_extras
    from eada.experiment import summarize_runs

    cfg = preset_config("toy", "eada", 0, ["train.epochs=2", "active.rounds_at=[1]"])
    run_seeds(lambda s: cfg, [0], tmp_path / "run")
    run = read_jsonl(tmp_path / "run" / "runs.jsonl")
    assert summarize_runs(run)["warnings"] == []
    warned = {**run[0], "seed": 3}
    warned["results"] = {
        **run[0]["results"],
        "warnings": [{"kind": "alignment_runaway", "epoch": 2, "message": "Delta fell x"}],
    }
    summary = summarize_runs([run[0], warned])
    assert summary["warnings"] == [
        {"seed": 3, "kind": "alignment_runaway", "epoch": 2, "message": "Delta fell x"}
    ]
    console = Console(record=True, width=200)
    print_summary_extras(console, summary)
    assert "warning (seed 3, epoch 2): Delta fell x" in console.export_text()


def test_cli_demo_writes_results_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--seeds", "2", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["preset"] == "toy-calibrated"  # the calibrated toy by default
    for name in ("source_only", "random", "badge", "eada"):
        s = res["strategies"][name]
        assert len(s["errors"]) == 2
        assert s["mean_error"] == pytest.approx(sum(s["errors"]) / 2)
        assert all(0 <= e <= 100 for e in s["errors"])
    assert res["strategies"]["eada"]["paper_error"] == 1.0
    assert res["strategies"]["badge"]["paper_error"] == 4.2
    # each seed's first round: the target-minus-source free energy and the boundary's angle
    for s in res["strategies"].values():
        assert len(s["free_energy_gap"]) == 2 and len(s["boundary_angle"]) == 2
        assert all(0 <= a <= 180 for a in s["boundary_angle"])
    assert all(g > 0 for g in res["strategies"]["source_only"]["free_energy_gap"])
    png = (out / "toy_fig5.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    # five panels in one row: the grid fits them (no empty cell)
    width, height = struct.unpack(">II", png[16:24])
    assert width > 4 * height
    printed = capsys.readouterr().out
    assert "Source-only" in printed and "52.0" in printed and "EADA" in printed
    assert "preset toy-calibrated" in printed and "BADGE" in printed


def test_cli_run_dry_run_touches_no_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "run",
            "digits/mnist-usps",
            "--method",
            "random",
            "--seeds",
            "0-2",
            "--set",
            "data.root=/nonexistent",
            "--dry-run",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "config valid" in out and "strategy random" in out and "[0, 1, 2]" in out


def test_cli_run_yaml_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "toy", "--method", "random"]) == 0
    text = capsys.readouterr().out
    cfg_path = tmp_path / "toy.yaml"
    cfg_path.write_text(text)
    assert yaml.safe_load(text)["active"]["strategy"] == "random"
    out = tmp_path / "r"
    code = main(
        [
            "run",
            str(cfg_path),
            "--set",
            "train.epochs=2",
            "--set",
            "active.rounds_at=[1]",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    res = json.loads((out / "results.json").read_text())
    assert res["strategy"] == "random" and len(res["rounds"]) == 2


def test_cli_bad_input_exits_2_with_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "toy", "--set", "train.nope=1", "--dry-run"]) == 2
    assert "train.nope" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "neither a preset" in capsys.readouterr().err
    assert main(["demo", "--seeds", "0"]) == 2


def test_digits_end_to_end_one_round(digits_root: Path, tmp_path: Path) -> None:
    cfg = preset_config(
        "digits/mnist-usps",
        "eada",
        0,
        [f"data.root={digits_root}", "train.epochs=2", "active.rounds_at=[1]"],
    )
    from eada.experiment import run_once

    run = run_once(cfg)
    res = run["results"]
    assert len(res["rounds"]) == 2 and res["rounds"][1]["budget"] == 73  # 1% of 7,291 USPS train
    assert res["final"]["last_epoch"]["target"]["n"] == 7291
    assert res["final"]["last_epoch"]["heldout"]["n"] == 2007
    assert res["final"]["last_epoch"]["target"]["accuracy"] > 50  # LeNet after two epochs


def test_alignment_option_default_and_paper_pins(tmp_path: Path) -> None:
    """The normalized alignment is the default; configs that reproduce the paper pin `paper`; an
    unknown variant is named with its key path."""
    from eada.hparams import preset_config

    assert preset_config("digits/mnist-usps", "eada").train.alignment == "normalized"
    assert preset_config("toy", "eada").train.alignment == "paper"  # the paper's Fig. 5
    for name in ("office31_amazon_webcam", "office_home_ar_cl", "visda2017"):
        assert load_config(Path("configs") / f"{name}.yaml").train.alignment == "paper"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"kind": "toy"}, "train": {"alignment": "shifted"}}))
    with pytest.raises(ConfigError, match=r"train\.alignment"):
        load_config(path)


def test_closed_stdout_pipe_ends_quietly(tmp_path: Path) -> None:
    """`eada config show toy | head -1`: the reader gone is no 'bug in eada' message."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eada.cli", "config", "show", "toy"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes anything (it imports first): every write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "bug" not in err and "Traceback" not in err and "BrokenPipe" not in err, err


def test_every_command_help_is_plain_text_with_a_description() -> None:
    """``eada CMD --help`` says what CMD does, without reStructuredText markup."""
    import argparse

    from eada.cli import build_parser

    def commands(parser: argparse.ArgumentParser, name: str):  # type: ignore[no-untyped-def]
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from commands(p, f"{name} {sub}")

    seen = dict(commands(build_parser(), "eada"))
    assert {"eada demo", "eada bench", "eada run", "eada data features"} <= set(seen)
    for name, parser in seen.items():
        text = parser.format_help()
        assert parser.description, name
        for markup in ("``", ":func:", ":data:", ":mod:", ":class:", ":meth:"):
            assert markup not in text, (name, markup)
    assert "Source-only, Random, BADGE, EADA" in " ".join(seen["eada demo"].format_help().split())
    assert "--preset {toy-calibrated,toy}" in seen["eada demo"].format_help()
    assert "what eada.hparams.METHODS says" in seen["eada bench"].format_help()
