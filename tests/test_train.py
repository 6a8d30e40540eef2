"""The round-based trainer: plan validation, pool bookkeeping, oracle labels, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from eada.config import ConfigError
from eada.data.base import TensorDomain
from eada.data.tasks import Task, load_task
from eada.hparams import preset_config
from eada.train import ActiveDATrainer, SimulatedOracle
from eada.train.loop import BatchStream

FAST = ["train.epochs=4", "active.rounds_at=[1,2,3]"]


def _trainer(method: str = "eada", seed: int = 0, extra: list[str] | None = None, **kw):
    cfg = preset_config("toy", method, seed, FAST + (extra or []))
    return ActiveDATrainer(cfg, load_task(cfg.data, seed), **kw)


def test_rounds_label_budget_and_leave_pool() -> None:
    tr = _trainer()
    res = tr.run()
    sel = [r["selected"] for r in res.rounds[1:]]
    assert [len(s) for s in sel] == [20, 20, 20]  # 2% of 1000 target points a round
    flat = [i for s in sel for i in s]
    assert len(set(flat)) == 60, "a sample was selected twice"
    assert sorted(flat) == res.labeled_indices
    assert int(tr.labeled_mask.sum()) == 60
    # selected samples left the unlabeled stream
    assert set(tr.unlabeled_stream.indices.tolist()).isdisjoint(flat)
    assert len(tr.unlabeled_stream.indices) == 940
    # the oracle revealed ground truth for exactly those samples
    truth = tr.task.target.y
    assert all(tr.target_labels[i] == truth[i] for i in flat)
    assert (tr.target_labels[~tr.labeled_mask] == -1).all()
    for r in res.rounds[1:]:
        assert r["n_labeled"] == 20 * r["round"]
        assert r["selection_seconds"] >= 0 and r["scoring_seconds"] >= 0
        assert 0.0 <= r["selected_error_rate"] <= 100.0
        assert "after_training" in r and 0 <= r["after_training"]["target"]["accuracy"] <= 100


def test_round_zero_and_final_metrics_recorded() -> None:
    res = _trainer().run()
    assert res.rounds[0]["round"] == 0 and res.rounds[0]["n_labeled"] == 0
    fin = res.final
    assert fin["last_epoch"]["epoch"] == 4
    assert fin["best_epoch"]["target"]["accuracy"] >= fin["last_epoch"]["target"]["accuracy"]
    per_class = fin["last_epoch"]["target"]["per_class_accuracy"]
    assert len(per_class) == 2
    assert fin["last_epoch"]["target"]["mean_class_accuracy"] == pytest.approx(np.mean(per_class))
    assert len(res.history) == 4 and all("metrics" in h for h in res.history)


def test_same_seed_same_labels_different_seed_differs() -> None:
    a = _trainer(seed=3).run()
    b = _trainer(seed=3).run()
    c = _trainer(seed=4).run()
    assert a.labeled_indices == b.labeled_indices
    assert (
        a.final["last_epoch"]["target"]["accuracy"] == b.final["last_epoch"]["target"]["accuracy"]
    )
    assert a.labeled_indices != c.labeled_indices


class LyingOracle(SimulatedOracle):
    """Answers class 1 for everything: training must use these answers, not ground truth."""

    def label(self, indices: np.ndarray) -> np.ndarray:
        super().label(indices)
        return np.ones(len(indices), dtype=np.int64)


def test_training_uses_oracle_labels_not_ground_truth() -> None:
    cfg = preset_config("toy", "random", 0, FAST)
    task = load_task(cfg.data, 0)
    oracle = LyingOracle(task.target.y)
    tr = ActiveDATrainer(cfg, task, oracle=oracle)
    tr.run()
    assert oracle.queries == 60
    assert (tr.target_labels[tr.labeled_mask] == 1).all()
    _, y = tr.labeled_stream.next()
    assert (y == 1).all()


def test_source_only_runs_without_rounds() -> None:
    res = _trainer("source_only").run()
    assert res.rounds == [] and res.labeled_indices == [] and res.plan == []


def test_alignment_loss_and_delta_are_tracked() -> None:
    tr = _trainer("eada")
    res = tr.run()
    assert all("loss_align" in h and "delta" in h for h in res.history)
    assert tr.delta.steps == 4 * tr.steps_per_epoch()
    assert "loss_align" not in _trainer("random").run().history[0]


def _history(deltas: list[float], aligns: list[float]) -> list[dict]:
    return [
        {"epoch": i + 1, "delta": d, "loss_align": a}
        for i, (d, a) in enumerate(zip(deltas, aligns, strict=True))
    ]


@pytest.mark.parametrize("alignment", ["paper", "centered", "balanced", "normalized"])
def test_centered_alignment_leaves_the_common_mode_alone(alignment: str) -> None:
    """Under SGD the NLL's gradient has no common-mode part, so the head's mean bias moves only
    through L_fea: steadily down with the paper's F, not at all with the centred G (nor B)."""
    extra = [
        "optim.name=sgd",
        "optim.momentum=0",
        "train.gamma=1.0",
        f"train.alignment={alignment}",
    ]
    tr = _trainer("eada", extra=extra)
    before = float(tr.model.head.bias.detach().mean())
    tr.run()
    moved = float(tr.model.head.bias.detach().mean()) - before
    if alignment == "paper":
        assert moved < -1e-3
    else:
        assert abs(moved) < 1e-5


def test_alignment_runaway_is_found_once_and_kept() -> None:
    from eada.train.loop import record_alignment_runaway

    deltas, aligns = [-8.8, -30.1, -58.9, -133.5, -503.6, -3038.4], [5, 18, 31, 65, 229, 1304]
    found: list[dict] = []
    messages = []
    for k in range(1, len(deltas) + 1):
        messages.append(
            record_alignment_runaway(_history(deltas[:k], aligns[:k]), found, {"epoch": k})
        )
    assert [m is not None for m in messages] == [False] * 4 + [True, False]  # once, at epoch 5
    assert messages[4].startswith("Delta fell -58.9 -> -133.5 -> -503.6")
    assert found == [{"kind": "alignment_runaway", "epoch": 5, "message": messages[4]}]


def _fires_from(n: int):
    """A stand-in for eada.energy.alignment_runaway that fires once the log has n epochs."""

    def fake(deltas, aligns, unit="epochs"):
        return f"Delta x after {len(deltas)} {unit}" if len(deltas) >= n else None

    return fake


def test_runaway_reaches_the_user_through_progress_or_python_warnings(monkeypatch) -> None:
    from eada import energy
    from eada.energy import AlignmentRunawayWarning

    monkeypatch.setattr(energy, "alignment_runaway", _fires_from(1))
    lines: list[str] = []
    res = _trainer("eada", extra=["train.epochs=2", "active.rounds_at=[1]"]).run(lines.append)
    msg = "Delta x after 1 epochs"
    assert lines.index(f"warning (epoch 1): {msg}") == 1  # right after the epoch's line
    assert res.warnings == [{"kind": "alignment_runaway", "epoch": 1, "message": msg}]
    assert res.to_dict()["warnings"] == res.warnings
    with pytest.warns(AlignmentRunawayWarning, match=f"epoch 1: {msg}"):
        _trainer("eada", extra=["train.epochs=2", "active.rounds_at=[1]"]).run()


def test_runaway_log_spans_checkpoints_and_warns_once_per_model(monkeypatch) -> None:
    """``eada train`` trains a model in segments (a new trainer per segment, restored from the
    last checkpoint): the Delta/L_fea log travels in the checkpoint, so a runaway spread over
    segments is found, and a model that was warned is not warned again."""
    from eada import energy

    monkeypatch.setattr(energy, "alignment_runaway", _fires_from(4))

    cfg = preset_config("toy", "eada", 0, ["train.epochs=2", "active.rounds_at=[1]"])
    cfg = cfg.model_copy(update={"active": cfg.active.model_copy(update={"rounds_at": []})})
    task = load_task(cfg.data, 0)

    def segment(state):  # as the store builds a segment: same config, no rounds
        tr = ActiveDATrainer(cfg, task)
        if state is not None:
            tr.load_state_dict(state, progress=False)
        return tr, tr.run(progress=lambda line: None)

    tr1, res1 = segment(None)
    assert len(tr1.alignment_log) == 2 and res1.warnings == []
    tr2, res2 = segment(tr1.state_dict())
    assert len(tr2.alignment_log) == 4
    assert res2.warnings == [
        {"kind": "alignment_runaway", "epoch": 2, "message": "Delta x after 4 epochs"}
    ]
    tr3, res3 = segment(tr2.state_dict())
    assert len(tr3.alignment_log) == 6 and res3.warnings == []  # once per model
    assert tr3.alignment_warnings == res2.warnings
    old = {k: v for k, v in tr2.state_dict().items() if k != "alignment"}  # older checkpoint
    tr4, _ = segment(old)
    assert len(tr4.alignment_log) == 2


def test_stable_run_has_no_warnings() -> None:
    res = _trainer("eada").run()
    assert res.warnings == [] and res.to_dict()["warnings"] == []


def test_budget_larger_than_pool_fails_before_training() -> None:
    cfg = preset_config("toy", "random", 0, [*FAST, "active.budget_per_round=400"])
    task = load_task(cfg.data, 0)
    with pytest.raises(ValueError, match=r"round 3 .*budget 400 is larger than the unlabeled pool"):
        ActiveDATrainer(cfg, task)


def test_alpha1_too_small_for_budget_fails_before_training() -> None:
    cfg = preset_config("toy", "eada", 0, [*FAST, "active.alpha1=0.01"])
    with pytest.raises(ValueError, match="step 1 keeps only"):
        ActiveDATrainer(cfg, load_task(cfg.data, 0))


@pytest.mark.parametrize("alpha1", [0, -0.5, 1.5])
def test_alpha1_outside_range_is_a_config_error(alpha1: float) -> None:
    with pytest.raises(ConfigError, match=r"active\.alpha1"):
        preset_config("toy", "eada", 0, [f"active.alpha1={alpha1}"])


def _domain(n: int, classes: int, name: str) -> TensorDomain:
    g = torch.Generator().manual_seed(n)
    return TensorDomain(
        name,
        torch.randn(n, 2, generator=g),
        torch.arange(n) % classes,
        [str(i) for i in range(classes)],
    )


def test_empty_target_fails() -> None:
    cfg = preset_config("toy", "eada", 0, FAST)
    task = Task(
        _domain(20, 2, "s"), TensorDomain("t", torch.empty(0, 2), torch.empty(0).long(), ["0", "1"])
    )
    with pytest.raises(ValueError, match="target domain 't' is empty"):
        ActiveDATrainer(cfg, task)


def test_class_count_mismatch_fails() -> None:
    cfg = preset_config("toy", "eada", 0, FAST)
    with pytest.raises(ValueError, match="source has 2 classes but target has 3"):
        ActiveDATrainer(cfg, Task(_domain(50, 2, "s"), _domain(50, 3, "t")))


def test_nan_energies_raise_clear_error() -> None:
    cfg = preset_config("toy", "eada", 0, FAST)
    tr = ActiveDATrainer(cfg, load_task(cfg.data, 0))
    with torch.no_grad():
        tr.model.head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        tr.run()


def test_batch_stream_duplicates_single_sample_and_covers_all() -> None:
    d = _domain(10, 2, "d")
    g = torch.Generator().manual_seed(0)
    s = BatchStream(d, torch.tensor([7]), 4, g)
    x, _y = s.next()
    assert x.shape[0] == 2 and torch.equal(x[0], x[1])
    s.set_indices(torch.arange(8))
    seen = torch.cat([s.next()[1] for _ in range(2)])
    assert len(seen) == 8  # one pass of two full batches covers every sample once
    assert sorted(seen.tolist()) == sorted(d.y[:8].tolist())


def test_reference_rule_plan_matches_two_ceilings() -> None:
    cfg = preset_config(
        "toy", "eada", 0, [*FAST, "active.selection_rule=reference", "active.budget_per_round=0.01"]
    )
    tr = ActiveDATrainer(cfg, load_task(cfg.data, 0))
    # n1 = ceil(0.5 * 1000) = 500 of the whole target set; n2 = ceil(500 * 0.01 / 0.5) = 10
    assert [(p["stage1"], p["budget"]) for p in tr.plan] == [(500, 10)] * 3


def test_scoring_passes_run_on_the_models_device() -> None:
    """``predict_energies``, ``score_pool`` and ``embed_samples`` move each batch to the
    model's device unless told otherwise (they moved it to the CPU: a model on CUDA then
    failed, "Expected all tensors to be on the same device"). The ``meta`` device stands in
    for CUDA here: the model records where its inputs came."""
    from eada.models.base import EnergyNet
    from eada.train.evaluate import embed_samples, model_device, predict_energies, score_pool

    seen: list[str] = []

    class Where(nn.Module):
        def __init__(self, out: int) -> None:
            super().__init__()
            self.out = out
            self.w = nn.Parameter(torch.empty(1, device="meta"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.device.type)
            return torch.zeros(len(x), self.out)

    dom = _domain(10, 2, "t")
    assert model_device(Where(2)).type == "meta"
    assert model_device(nn.ReLU()).type == "cpu"  # no parameter, no buffer
    assert predict_energies(Where(2), dom, batch_size=4).shape == (10, 2)
    score_pool(Where(2), dom, torch.arange(10), ("free_energy",), batch_size=4)
    net = EnergyNet(Where(3), 3, 2)  # its first parameter (the backbone's) on meta
    assert embed_samples(net, dom, torch.arange(10), batch_size=5).shape == (10, 3)
    assert seen == ["meta"] * 8
    seen.clear()
    predict_energies(Where(2), dom, batch_size=10, device="cpu")  # told otherwise
    assert seen == ["cpu"]


def test_scoring_passes_report_batch_progress() -> None:
    from eada.data.batches import report_batches
    from eada.train.evaluate import predict_energies, score_pool

    tr = _trainer()
    seen: list[tuple[int, int]] = []
    with report_batches(lambda done, total: seen.append((done, total))):
        predict_energies(tr.model, tr.task.target, None, batch_size=300)
        score_pool(tr.model, tr.task.target, torch.arange(500), ("free_energy",), batch_size=200)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4), (1, 3), (2, 3), (3, 3)]
    predict_energies(tr.model, tr.task.target, None, batch_size=300)
    assert len(seen) == 7  # no reporting outside the block
