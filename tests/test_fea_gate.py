"""The gate of ``L_fea`` (``train.fea_gate``, :func:`eada.energy.fea_gate_weight`): its weight
formulas, its config validation, and the trainer's loss ``... + gamma * w * L_fea``."""

from __future__ import annotations

import math

import pytest
import torch

from eada.config import ConfigError, TrainConfig
from eada.data.tasks import load_task
from eada.energy import (
    FEA_GATES,
    alignment_scale,
    fea_gate_weight,
    fea_sample_weights,
    free_energy_alignment_loss,
)
from eada.hparams import preset_config
from eada.runs import LEGACY_VALUES
from eada.train import ActiveDATrainer

FAST = ["train.epochs=4", "active.rounds_at=[1,2,3]"]


def _trainer(extra: list[str]) -> ActiveDATrainer:
    cfg = preset_config("toy", "eada", 0, FAST + extra)
    return ActiveDATrainer(cfg, load_task(cfg.data, 0))


@pytest.mark.parametrize("p", [0.0, 0.05, 0.1, 0.2, 0.5, 1.0])
def test_gate_weights_follow_their_formulas(p: float) -> None:
    assert fea_gate_weight("none", p, 0.0) == 1.0
    assert fea_gate_weight("dann", p) == pytest.approx(2 / (1 + math.exp(-10 * p)) - 1)
    assert fea_gate_weight("labels", 0.9, labeled_share=p) == pytest.approx(p)
    assert fea_gate_weight("dann", 0.0) == 0.0
    assert fea_gate_weight("zero", p, 1.0) == 0.0


@pytest.mark.parametrize(
    ("gate", "progress", "share", "words"),
    [
        ("ramp", 0.5, 1.0, "train.fea_gate must be one of none, dann, labels, confidence, zero"),
        ("dann", 1.5, 1.0, "progress must be in [0, 1]"),
        ("labels", 0.5, -0.1, "labeled_share must be in [0, 1]"),
    ],
)
def test_gate_weight_refuses_bad_input(gate: str, progress: float, share: float, words: str):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        fea_gate_weight(gate, progress, share)


def test_config_validates_the_gate_and_old_records_mean_no_gate() -> None:
    assert set(FEA_GATES) == {"none", "dann", "labels", "confidence", "zero"}
    assert TrainConfig(fea_gate="labels").fea_gate == "labels"
    with pytest.raises(ValueError, match="fea_gate"):
        TrainConfig(fea_gate="ramp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fea_gate"):
        preset_config("toy", "eada", 0, ["train.fea_gate=sometimes"])
    assert LEGACY_VALUES["train.fea_gate"] == "none"  # runs before the option had no gate


def test_loss_scales_the_alignment_term_by_the_gate_weight() -> None:
    """``loss = NLL_s + gamma * w * L_fea`` (no labels yet): w = 1 is the old loss exactly."""
    for w in (1.0, 0.25, 0.0):
        tr = _trainer(["train.gamma=0.5"])
        torch.manual_seed(0)
        tr.fea_weight = w
        out = tr.train_step()
        assert out["loss_align"] > 0
        expected = out["loss_source"] + 0.5 * w * out["loss_align"]
        assert out["loss"] == pytest.approx(expected, rel=1e-6)


def test_trainer_weights_follow_progress_and_labels() -> None:
    dann = _trainer(["train.fea_gate=dann"])
    res = dann.run()
    weights = [h["fea_weight"] for h in res.history]  # each epoch's mean weight
    assert weights == sorted(weights) and 0 < weights[0] < weights[-1] < 1
    assert dann.fea_gate_weight(0.0) == 0.0
    assert dann.fea_gate_weight(2.0) == pytest.approx(2 / (1 + math.exp(-5)) - 1)

    labels = _trainer(["train.fea_gate=labels"])
    assert labels.fea_gate_weight(0.0) == 0.0  # no labels yet
    res = labels.run()
    planned = sum(p["budget"] for p in labels.plan)
    assert res.history[0]["fea_weight"] == 0.0  # epoch 1 trains before round 1 selects
    assert res.history[-1]["fea_weight"] == pytest.approx(1.0)  # all planned labels given
    assert int(labels.labeled_mask.sum()) == planned

    plain = _trainer([])
    assert "fea_weight" not in plain.run().history[0]  # no gate: records unchanged
    assert plain.fea_gate_weight(0.0) == 1.0


def test_confidence_weights_are_the_confidence_above_chance() -> None:
    e = torch.tensor([[0.0, 0.0, 0.0], [0.0, 50.0, 50.0], [0.0, math.log(2.0), 9.0]])
    p = torch.softmax(-e, dim=1).amax(dim=1)
    w = fea_sample_weights(e)
    assert torch.allclose(w, (p - 1 / 3) / (1 - 1 / 3))
    assert w[0] == 0.0 and w[1] == pytest.approx(1.0) and not w.requires_grad
    assert fea_gate_weight("confidence", 0.0, 0.0) == 1.0  # no global weight
    with pytest.raises(ValueError, match="at least 2 classes"):
        fea_sample_weights(torch.zeros(3, 1))


def test_confidence_gate_weights_each_sample_of_the_loss() -> None:
    """The trainer's L_fea under ``confidence`` is ``mean(w_i * max(0, B_i / sigma - Delta))``
    on the step's own batches (recomputed here from the model and the same draws)."""
    tr = _trainer(["train.gamma=0.5", "train.fea_gate=confidence"])
    plain = _trainer(["train.gamma=0.5"])
    torch.manual_seed(0)
    out = tr.train_step()
    torch.manual_seed(0)
    ref = plain.train_step()
    assert out["loss_source"] == pytest.approx(ref["loss_source"])  # same batches, same model
    assert 0 < out["loss_align"] < ref["loss_align"]  # every weight below 1 on the toy's start
    e = torch.randn(16, 2)
    per = free_energy_alignment_loss(
        e, -1.0, alignment="normalized", scale=alignment_scale(e), reduction="none"
    )
    assert (fea_sample_weights(e) * per).mean() <= per.mean()


def test_no_fea_is_paired_it_trains_on_eada_s_batches_without_the_term() -> None:
    """``eada_no_fea`` (``train.fea_gate: zero``) draws EADA's unlabeled batches and random
    numbers, so under one seed it sees the same source batches as EADA; its loss is the NLL
    alone. ``train.gamma: 0`` draws no unlabeled batch, so the streams' shared generator is at
    another point when the source reshuffles, and its source batches differ from then on."""
    no_fea = ActiveDATrainer(
        cfg := preset_config("toy", "eada_no_fea", 0, FAST), load_task(cfg.data, 0)
    )
    assert cfg.train.fea_gate == "zero" and cfg.train.gamma > 0
    assert preset_config("toy", "eada", 0, [*FAST, "train.fea_gate=zero"]).train == cfg.train
    eada, gamma0 = _trainer([]), _trainer(["train.gamma=0"])
    steps = eada.source_stream.batches_per_pass + 1  # past the source's first reshuffle
    for _ in range(steps):
        out = no_fea.train_step()
        ref = eada.train_step()
        gamma0.train_step()
        assert out["loss_align"] > 0 and out["loss"] == out["loss_source"]  # the term is off
        assert ref["loss"] > ref["loss_source"]
    x_off, x_eada, x_g0 = (t.source_stream.next()[0] for t in (no_fea, eada, gamma0))
    assert torch.equal(x_off, x_eada)  # paired: the same draws as EADA
    assert not torch.equal(x_g0, x_eada)  # gamma = 0: the reshuffle drew other numbers
    assert no_fea.delta.steps == eada.delta.steps == steps  # Delta still tracked (and logged)
    w_off = next(no_fea.model.parameters()).detach()
    w_eada = next(eada.model.parameters()).detach()
    assert not torch.equal(w_off, w_eada)  # L_fea moved EADA's weights, not no_fea's


@pytest.mark.parametrize("gate", ["dann", "labels"])
def test_a_project_store_weighs_l_fea_as_one_simulated_run(
    tmp_path, monkeypatch: pytest.MonkeyPatch, gate: str
) -> None:
    """A project store trains its schedule in segments with no rounds of their own; the
    ``dann`` and ``labels`` weights must still count over the whole schedule (the epochs and
    the planned labels of the project's config), step for step as one run does. Before
    :class:`eada.train.GateSchedule` a segment gave ``labels`` a weight of 1 throughout and
    restarted ``dann``'s ramp at 0."""
    from eada.store import init_project

    seen: list[float] = []
    weight = ActiveDATrainer.fea_gate_weight

    def record(self: ActiveDATrainer, epochs_done: float) -> float:
        seen.append(weight(self, epochs_done))
        return seen[-1]

    monkeypatch.setattr(ActiveDATrainer, "fea_gate_weight", record)
    sets = ["data.n_per_class=60", "train.epochs=3", "active.rounds_at=[1,2]"]
    cfg = preset_config("toy", "eada", 1, [*sets, "active.budget_per_round=5"])
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"fea_gate": gate})})
    plain = ActiveDATrainer(cfg, load_task(cfg.data, 1)).run()
    one_run, seen[:] = list(seen), []
    proj = init_project(tmp_path / "p", cfg)
    proj.run_simulated()
    assert seen == pytest.approx(one_run) and len(seen) > 0
    assert min(seen) == 0.0 and max(seen) > 0.5  # the ramp / the labels given, not 1 throughout
    assert sorted(r["position"] for r in proj.store.current_labels()) == plain.labeled_indices


def test_the_default_is_the_labels_gate_and_the_paper_s_protocol_pins_none() -> None:
    """The default gate is ``labels`` (BENCHMARKS.md "A paired ablation of L_fea"); every
    config that trains the paper's loss (the authors' protocol, the toy of Fig. 5) pins
    ``none``, as the authors train ``L_fea`` from the first step."""
    from pathlib import Path

    from eada.config import load_config

    assert TrainConfig().fea_gate == "labels"
    assert preset_config("toy", "eada", 0).train.fea_gate == "none"  # Fig. 5, the paper's loss
    assert preset_config("digits/mnist-usps", "eada", 0).train.fea_gate == "labels"
    paper = [
        p for p in sorted(Path("configs").glob("*.yaml")) if "alignment: paper" in p.read_text()
    ]
    assert len(paper) >= 10
    for path in paper:
        cfg = load_config(path)
        assert (cfg.train.alignment, cfg.train.fea_gate) == ("paper", "none"), path


def test_a_project_made_before_the_gate_existed_keeps_no_gate(tmp_path) -> None:
    """A project store whose stored config has no ``train.fea_gate`` (made before the option)
    trained ``L_fea`` without a gate, and keeps doing so under the new default."""
    import json

    from eada.store import Project, init_project

    cfg = preset_config("toy", "eada", 0, ["data.n_per_class=20", "train.fea_gate=labels"])
    proj = init_project(tmp_path / "p", cfg)
    raw = proj.store.get_json("config")
    assert raw["train"]["fea_gate"] == "labels"  # a new project records its gate
    del raw["train"]["fea_gate"]
    with proj.store.transaction():
        proj.store.set_meta("config", json.dumps(raw))
    assert Project(tmp_path / "p").cfg.train.fea_gate == "none"
