"""Forward modes of a training step (separate / fused with per-stream batch norm), channels-last,
and the per-rank split of the batch streams."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from eada.data.base import TensorDomain
from eada.data.tasks import load_task
from eada.hparams import preset_config
from eada.train import ActiveDATrainer
from eada.train.forward import StepForward, segment_batchnorm
from eada.train.loop import BatchStream


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    )


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    # three streams with different statistics, as source / unlabeled / labeled target
    return [torch.randn(6, 3, 8, 8, generator=g) * s + m for s, m in ((1, 0), (3, 2), (0.5, -1))]


def test_fused_equals_separate_outputs_and_running_stats() -> None:
    a, b = _net(), _net()
    sep, fus = StepForward(a, "separate"), StepForward(b, "fused")
    xs = _batches()
    out_s, out_f = sep(xs), fus(xs)
    for s, f in zip(out_s, out_f, strict=True):
        torch.testing.assert_close(f, s, rtol=1e-5, atol=1e-5)
    bn_a, bn_b = a[1], b[1]
    torch.testing.assert_close(bn_b.running_mean, bn_a.running_mean)
    torch.testing.assert_close(bn_b.running_var, bn_a.running_var)
    assert int(bn_b.num_batches_tracked) == 3  # one update per stream, as three passes
    # a plain concatenated pass mixes the streams' statistics: a different result
    mixed = _net()(torch.cat(xs))[:6]
    assert not torch.allclose(mixed, out_s[0], atol=1e-3)


def test_segment_batchnorm_keeps_parameters_and_keys() -> None:
    net = _net()
    keys, params = list(net.state_dict()), [id(p) for p in net.parameters()]
    layers = segment_batchnorm(net)
    assert len(layers) == 1 and isinstance(layers[0], nn.BatchNorm2d)
    assert segment_batchnorm(net) == layers  # idempotent
    assert list(net.state_dict()) == keys and [id(p) for p in net.parameters()] == params
    net.eval()  # eval mode: running statistics, segments ignored
    x = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(net(x), _net().eval()(x))


def test_channels_last_gives_the_same_energies() -> None:
    net = _net()
    ref = StepForward(copy.deepcopy(net), "separate")
    cl = StepForward(net.to(memory_format=torch.channels_last), "separate", channels_last=True)
    for r, c in zip(ref(_batches()), cl(_batches()), strict=True):
        torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)


def test_bad_forward_mode() -> None:
    with pytest.raises(ValueError, match="forward mode"):
        StepForward(_net(), "joint")  # type: ignore[arg-type]


@pytest.mark.parametrize("alignment", ["paper", "normalized"])
def test_trainer_fused_matches_separate(alignment: str) -> None:
    """The toy run (bottleneck with batch norm) trains to the same model either way, with the
    toy's pinned `paper` alignment and the default `normalized` one (a scale over two streams)."""
    runs = {}
    for mode in ("separate", "fused"):
        cfg = preset_config(
            "toy",
            "eada",
            0,
            [
                "train.epochs=2",
                "active.rounds_at=[1]",
                "model.bottleneck_dim=16",  # a batch-norm layer, so the modes could differ
                f"train.forward={mode}",
                f"train.alignment={alignment}",
            ],
        )
        tr = ActiveDATrainer(cfg, load_task(cfg.data, 0))
        res = tr.run()
        runs[mode] = (res, [p.detach().clone() for p in tr.model.parameters()])
    (rs, ps), (rf, pf) = runs["separate"], runs["fused"]
    assert rs.labeled_indices == rf.labeled_indices
    for a, b in zip(ps, pf, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
    acc = [r.final["last_epoch"]["target"]["accuracy"] for r in (rs, rf)]
    assert acc[0] == pytest.approx(acc[1], abs=0.5)


def test_batch_streams_split_each_global_batch_between_ranks() -> None:
    dom = TensorDomain("d", torch.arange(40.0).view(40, 1), torch.zeros(40, dtype=torch.long))
    idx = torch.arange(40)
    single = BatchStream(dom, idx, 8, torch.Generator().manual_seed(0))
    ranks = [BatchStream(dom, idx, 4, torch.Generator().manual_seed(0), None, r, 2) for r in (0, 1)]
    assert single.batches_per_pass == ranks[0].batches_per_pass == 5
    for _ in range(7):  # across a reshuffle
        whole = single.next()[0].flatten().tolist()
        parts = [s.next()[0].flatten().tolist() for s in ranks]
        assert not set(parts[0]) & set(parts[1])
        assert parts[0] + parts[1] == whole
    # a set smaller than 2 x world samples is used whole on every rank
    tiny = [
        BatchStream(dom, idx[:3], 4, torch.Generator().manual_seed(0), None, r, 2) for r in (0, 1)
    ]
    assert tiny[0].next()[0].tolist() == tiny[1].next()[0].tolist()
