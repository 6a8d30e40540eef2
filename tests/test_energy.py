"""Energy maths: free energy, MvSM, energy NLL, free-energy alignment, the Delta estimator."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from eada.energy import (
    DeltaEstimator,
    alignment_free_energy,
    alignment_runaway,
    alignment_scale,
    balanced_free_energy,
    centered_free_energy,
    energy_from_logits,
    energy_nll,
    free_energy,
    free_energy_alignment_loss,
    mvsm,
    normalized_free_energy,
)
from eada.runs import find_jsonl, read_jsonl

E3 = torch.tensor([[0.0, 1.0, 3.0], [2.0, -1.0, 0.5]], dtype=torch.float64)


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# -- free energy ----------------------------------------------------------------------------------


def test_free_energy_hand_computed() -> None:
    expected = [
        -math.log(math.exp(0.0) + math.exp(-1.0) + math.exp(-3.0)),
        -math.log(math.exp(-2.0) + math.exp(1.0) + math.exp(-0.5)),
    ]
    got = free_energy(E3)
    assert got.shape == (2,)
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("tau", [0.5, 2.0, 3.7])
def test_free_energy_reverse_temperature(tau: float) -> None:
    expected = [-math.log(sum(math.exp(-tau * e) for e in row)) / tau for row in E3.tolist()]
    assert free_energy(E3, tau=tau).tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_free_energy_tau_changes_value() -> None:
    # tau must actually enter the formula (tau=2 differs from tau=1 on a non-degenerate row).
    assert not torch.allclose(free_energy(E3, tau=2.0), free_energy(E3, tau=1.0))


def test_free_energy_single_class_is_the_energy() -> None:
    e = _t([[4.25], [-3.0]])
    assert free_energy(e).tolist() == pytest.approx([4.25, -3.0], abs=1e-12)


def test_free_energy_docstring_value() -> None:
    got = float(free_energy(torch.tensor([[0.0, 1.0, 3.0]]))[0])
    assert got == pytest.approx(-math.log(1 + math.exp(-1) + math.exp(-3)), abs=1e-6)
    assert got == pytest.approx(-0.3490, abs=1e-4)


def test_energy_from_logits_is_negation() -> None:
    z = _t([[1.0, -2.0, 0.5]])
    assert energy_from_logits(z).tolist() == [[-1.0, 2.0, -0.5]]


# -- MvSM -----------------------------------------------------------------------------------------


def test_mvsm_hand_computed() -> None:
    # row 0: min 0, second 1 -> -1 ; row 1: min -1, second 0.5 -> -1.5
    assert mvsm(E3).tolist() == pytest.approx([-1.0, -1.5], abs=1e-12)
    # order of classes must not matter, and only the two lowest count
    assert mvsm(_t([[9.0, 7.0, 100.0, 7.5]])).tolist() == pytest.approx([-0.5], abs=1e-12)


def test_mvsm_nonpositive_on_random_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    for c in (2, 3, 10):
        e = torch.randn(500, c, generator=g, dtype=torch.float64) * 5
        u = mvsm(e)
        assert (u <= 0).all()
        sorted_e = torch.sort(e, dim=1).values
        assert torch.allclose(u, sorted_e[:, 0] - sorted_e[:, 1])


def test_mvsm_zero_for_tie_of_two_lowest() -> None:
    u = mvsm(_t([[1.0, 1.0, 3.0], [5.0, -2.0, -2.0], [0.0, 0.0, 0.0]]))
    assert u.tolist() == [0.0, 0.0, 0.0]


def test_mvsm_needs_two_classes() -> None:
    with pytest.raises(ValueError, match="at least 2 classes"):
        mvsm(_t([[1.0], [2.0]]))


# -- energy NLL -----------------------------------------------------------------------------------


def test_energy_nll_hand_computed_tau1() -> None:
    targets = torch.tensor([2, 0])
    expected = [
        3.0 + math.log(math.exp(0.0) + math.exp(-1.0) + math.exp(-3.0)),
        2.0 + math.log(math.exp(-2.0) + math.exp(1.0) + math.exp(-0.5)),
    ]
    got = energy_nll(E3, targets, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    total = sum(expected)
    assert float(energy_nll(E3, targets, reduction="sum")) == pytest.approx(total, rel=1e-12)
    assert float(energy_nll(E3, targets)) == pytest.approx(total / 2, rel=1e-12)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_energy_nll_hand_computed_tau(tau: float) -> None:
    # paper Eq. 6: E(x, y) + (1/tau) log sum_c exp(-tau E(x, c))
    targets = torch.tensor([1, 2])
    rows = E3.tolist()
    expected = [
        rows[i][targets[i]] + math.log(sum(math.exp(-tau * e) for e in rows[i])) / tau
        for i in range(2)
    ]
    got = energy_nll(E3, targets, tau=tau, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert float(energy_nll(E3, targets, tau=tau, reduction="sum")) == pytest.approx(
        sum(expected), rel=1e-12
    )
    assert float(energy_nll(E3, targets, tau=tau)) == pytest.approx(sum(expected) / 2, rel=1e-12)
    # not the authors' second placement (cross-entropy on -tau * E), which differs for tau != 1
    ce = F.cross_entropy(-tau * E3, targets, reduction="none")
    assert not torch.allclose(got, ce)


def test_energy_nll_tau1_is_cross_entropy_and_e_minus_f() -> None:
    g = torch.Generator().manual_seed(1)
    e = torch.randn(64, 7, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 7, (64,), generator=g)
    nll = energy_nll(e, y, reduction="none")
    assert torch.allclose(nll, F.cross_entropy(-e, y, reduction="none"), atol=1e-12)
    e_y = e.gather(1, y[:, None]).squeeze(1)
    assert torch.allclose(nll, e_y - free_energy(e), atol=1e-12)
    assert (nll >= 0).all()


def test_energy_nll_tau_close_to_one_is_continuous() -> None:
    # the tau == 1 shortcut and the general formula must agree in the limit
    y = torch.tensor([0, 1])
    a = energy_nll(E3, y, tau=1.0, reduction="none")
    b = energy_nll(E3, y, tau=1.0 + 1e-9, reduction="none")
    assert torch.allclose(a, b, atol=1e-7)


def test_energy_nll_gradient_flows() -> None:
    e = E3.clone().requires_grad_(True)
    energy_nll(e, torch.tensor([0, 1]), reduction="sum").backward()
    assert e.grad is not None
    # d/dE_c [E_y - F] = 1[c=y] - p_c
    p = torch.softmax(-E3, dim=1)
    onehot = F.one_hot(torch.tensor([0, 1]), 3).to(torch.float64)
    assert torch.allclose(e.grad, onehot - p, atol=1e-12)


# -- numerical stability --------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e4, -1e4])
def test_large_energies_stay_finite(scale: float) -> None:
    e = _t([[0.0, 1.0, 3.0], [2.0, 2.0, -1.0]]) * scale
    f = free_energy(e)
    assert torch.isfinite(f).all()
    # F = m - log sum_c exp(-(E_c - m)) with m the min energy (the shifted terms are 0 or 1)
    expected = [
        min(row) - math.log(sum(math.exp(-(v - min(row))) for v in row)) for row in e.tolist()
    ]
    assert f.tolist() == pytest.approx(expected, rel=1e-12)
    assert torch.isfinite(mvsm(e)).all()
    y = torch.tensor([1, 0])
    for tau in (1.0, 0.5, 2.0):
        assert torch.isfinite(free_energy(e, tau=tau)).all()
        assert torch.isfinite(energy_nll(e, y, tau=tau, reduction="none")).all()
    assert torch.isfinite(free_energy_alignment_loss(e, 0.0, reduction="none")).all()


def test_large_energies_float32() -> None:
    e = torch.tensor([[1e4, 1e4 + 1.0, -1e4]], dtype=torch.float32)
    assert torch.isfinite(free_energy(e)).all()
    assert float(free_energy(e)[0]) == pytest.approx(-1e4, rel=1e-6)
    assert torch.isfinite(energy_nll(e, torch.tensor([0]))).all()


# -- input validation -----------------------------------------------------------------------------


BAD_VALUES = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("bad", BAD_VALUES)
def test_non_finite_energies_rejected(bad: float) -> None:
    e = _t([[0.0, 1.0, 2.0], [0.0, bad, 1.0]])
    y = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="NaN"):
        free_energy(e)
    with pytest.raises(ValueError, match="NaN"):
        mvsm(e)
    with pytest.raises(ValueError, match="NaN"):
        free_energy_alignment_loss(e, 0.0)
    for tau in (1.0, 2.0):
        with pytest.raises(ValueError, match="NaN"):
            energy_nll(e, y, tau=tau)


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4), ()])
def test_wrong_ndim_rejected(shape: tuple[int, ...]) -> None:
    e = torch.zeros(shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        free_energy(e)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        mvsm(e)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        free_energy_alignment_loss(e, 0.0)


def test_energy_nll_wrong_ndim_rejected() -> None:
    # a 1-D energy vector would silently be accepted by cross_entropy as "unbatched"
    for tau in (1.0, 2.0):
        with pytest.raises(ValueError, match=r"\(N, C\)"):
            energy_nll(torch.zeros(3, dtype=torch.float64), torch.tensor(0), tau=tau)


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_nonpositive_tau_rejected(tau: float) -> None:
    with pytest.raises(ValueError, match="tau"):
        free_energy(E3, tau=tau)
    with pytest.raises(ValueError, match="tau"):
        energy_nll(E3, torch.tensor([0, 1]), tau=tau)
    with pytest.raises(ValueError, match="tau"):
        free_energy_alignment_loss(E3, 0.0, tau=tau)


# -- free-energy alignment ------------------------------------------------------------------------


def test_alignment_loss_hand_computed() -> None:
    f = [
        -math.log(math.exp(0.0) + math.exp(-1.0) + math.exp(-3.0)),  # ~ -0.349
        -math.log(math.exp(-2.0) + math.exp(1.0) + math.exp(-0.5)),  # ~ -1.12
    ]
    delta = -0.8
    expected = [max(0.0, fi - delta) for fi in f]
    assert expected[0] > 0 and expected[1] == 0.0  # one active, one inactive sample
    got = free_energy_alignment_loss(E3, delta, reduction="none")
    assert got.tolist() == pytest.approx(expected, abs=1e-12)
    assert float(free_energy_alignment_loss(E3, delta, reduction="sum")) == pytest.approx(
        sum(expected), abs=1e-12
    )
    assert float(free_energy_alignment_loss(E3, delta)) == pytest.approx(
        sum(expected) / 2, abs=1e-12
    )


def test_alignment_loss_with_tau() -> None:
    tau = 2.0
    f0 = -math.log(1 + math.exp(-2.0) + math.exp(-6.0)) / tau
    got = free_energy_alignment_loss(E3[:1], -1.0, tau=tau, reduction="none")
    assert got.tolist() == pytest.approx([f0 + 1.0], abs=1e-12)


def test_alignment_loss_zero_when_all_below_delta() -> None:
    e = E3.clone().requires_grad_(True)
    delta = float(free_energy(E3).max()) + 0.01
    loss = free_energy_alignment_loss(e, delta)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert e.grad is not None and (e.grad == 0).all()


def test_alignment_loss_gradient_reaches_energies_not_delta() -> None:
    e = E3.clone().requires_grad_(True)
    delta = torch.tensor(-5.0, dtype=torch.float64, requires_grad=True)
    loss = free_energy_alignment_loss(e, delta, reduction="sum")
    loss.backward()
    assert delta.grad is None
    # both rows are above -5: gradient = dF/dE = p(c|x)
    assert e.grad is not None
    assert torch.allclose(e.grad, torch.softmax(-E3, dim=1), atol=1e-12)


def test_alignment_loss_tensor_and_float_delta_agree() -> None:
    a = free_energy_alignment_loss(E3, -0.8, reduction="none")
    b = free_energy_alignment_loss(E3, torch.tensor(-0.8, dtype=torch.float64), reduction="none")
    assert torch.allclose(a, b)


# -- Delta estimator ------------------------------------------------------------------------------


BATCHES = [[1.0, 3.0], [4.0], [-2.0, 0.0, 5.0], [10.0, 10.5], [0.25]]


def _feed(est: DeltaEstimator, batches: list[list[float]]) -> list[float]:
    return [est.update(torch.tensor(b, dtype=torch.float64)) for b in batches]


def _uniform_reference(batches: list[list[float]], seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    out: list[float] = []
    value: float | None = None
    for b in batches:
        d = sum(b) / len(b)
        if value is None:
            value = d
        else:
            lam = float(rng.uniform())
            value = lam * value + (1.0 - lam) * d
        out.append(value)
    return out


def test_delta_first_update_is_batch_mean() -> None:
    for mode in ("uniform", "momentum"):
        est = DeltaEstimator(mode=mode, seed=3)  # type: ignore[arg-type]
        assert est.value is None
        assert est.update(torch.tensor([1.0, 2.0, 6.0])) == pytest.approx(3.0)
        assert est.value == pytest.approx(3.0)
        assert est.steps == 1


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_delta_uniform_matches_seeded_reference(seed: int) -> None:
    got = _feed(DeltaEstimator(mode="uniform", seed=seed), BATCHES)
    assert got == pytest.approx(_uniform_reference(BATCHES, seed), rel=1e-12)


def test_delta_uniform_seed_reproducibility() -> None:
    a = _feed(DeltaEstimator(mode="uniform", seed=5), BATCHES)
    b = _feed(DeltaEstimator(mode="uniform", seed=5), BATCHES)
    c = _feed(DeltaEstimator(mode="uniform", seed=6), BATCHES)
    assert a == b
    assert a[0] == c[0]  # the first batch only initialises
    assert a[1:] != c[1:]


def test_delta_momentum_exact() -> None:
    est = DeltaEstimator(mode="momentum", momentum=0.9)
    assert est.update(torch.tensor([1.0, 3.0])) == pytest.approx(2.0)
    assert est.update(torch.tensor([4.0])) == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)
    assert est.update(torch.tensor([-1.0, 0.0])) == pytest.approx(0.9 * 2.2 + 0.1 * -0.5)
    assert est.steps == 3
    zero = DeltaEstimator(mode="momentum", momentum=0.0)
    _feed(zero, [[1.0], [7.0]])
    assert zero.value == pytest.approx(7.0)


def test_delta_ignores_gradients() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    est = DeltaEstimator()
    value = est.update(x * 2)
    assert isinstance(value, float)
    assert value == pytest.approx(3.0)


@pytest.mark.parametrize("kwargs", [{"mode": "ema"}, {"momentum": 1.0}, {"momentum": -0.1}])
def test_delta_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        DeltaEstimator(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD_VALUES)
def test_delta_non_finite_batch(bad: float) -> None:
    est = DeltaEstimator()
    with pytest.raises(FloatingPointError):
        est.update(torch.tensor([1.0, bad]))
    est.update(torch.tensor([2.0]))
    with pytest.raises(FloatingPointError):
        est.update(torch.tensor([bad]))
    assert est.value == pytest.approx(2.0)  # a rejected batch leaves the state alone
    assert est.steps == 1


@pytest.mark.parametrize("mode", ["uniform", "momentum"])
def test_delta_state_dict_round_trip(mode: str) -> None:
    est = DeltaEstimator(mode=mode, seed=11)  # type: ignore[arg-type]
    _feed(est, BATCHES[:3])
    state = json.loads(json.dumps(est.state_dict()))  # serialisable
    expected = _feed(est, BATCHES[3:])

    fresh = DeltaEstimator(mode=mode, seed=999)  # type: ignore[arg-type]
    fresh.load_state_dict(state)
    assert fresh.steps == 3
    assert _feed(fresh, BATCHES[3:]) == expected

    empty = DeltaEstimator(mode=mode, seed=0)  # type: ignore[arg-type]
    state0 = copy.deepcopy(empty.state_dict())
    other = DeltaEstimator(mode=mode, seed=1)  # type: ignore[arg-type]
    _feed(other, BATCHES[:2])
    other.load_state_dict(state0)
    assert other.value is None and other.steps == 0
    assert _feed(other, BATCHES) == _feed(DeltaEstimator(mode=mode, seed=0), BATCHES)  # type: ignore[arg-type]


# -- gradient identity (appendix) -----------------------------------------------------------------


def test_free_energy_gradient_is_posterior_weighted_energy_gradient() -> None:
    """dF/dtheta = sum_c p(c|x) dE(x, c)/dtheta (appendix, gradient of the free energy)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)
    ).double()
    params = list(model.parameters())
    for _ in range(5):
        x = torch.randn(1, 4, dtype=torch.float64)
        e = model(x)
        grad_f = torch.autograd.grad(free_energy(e).sum(), params, retain_graph=True)
        p = torch.softmax(-e.detach(), dim=1)[0]
        expected = [torch.zeros_like(q) for q in params]
        for c in range(3):
            grad_e = torch.autograd.grad(e[0, c], params, retain_graph=True)
            for acc, g in zip(expected, grad_e, strict=True):
                acc += p[c] * g
        for g, want in zip(grad_f, expected, strict=True):
            assert torch.allclose(g, want, atol=1e-12)
        # and it is not the plain average of the energy gradients (p is not uniform)
        assert not torch.allclose(p, torch.full_like(p, 1 / 3))


# -- L_fea scale runaway -------------------------------------------------------------------------

# per-epoch means of committed runs (benchmarks/results/lfea_runaway, MNIST->MNIST-M, LeNet, seed 0)
# Adam, gamma 0.01: Delta runs away geometrically
RUNAWAY_DELTA = [-8.8, -30.1, -58.9, -133.5, -503.6, -3038.4, -16527.5]
RUNAWAY_ALIGN = [4.7, 17.8, 30.8, 64.7, 228.6, 1303.6, 6989.1]
# Adam, gamma 0.001: Delta settles while L_fea still rises in most epochs
STABLE_DELTA = [-7.4, -21.0, -24.2, -24.9, -27.8, -29.8, -36.0]
STABLE_ALIGN = [4.0, 13.1, 13.7, 13.0, 13.5, 13.9, 16.5]
# SGD, gamma 0.01: Delta grows x4.5 and x2.1 in epochs 1-3 (the floor keeps that out), then slowly
SGD_DELTA = [-5.5, -24.7, -52.9, -93.9, -148.0, -170.3, -290.7]
SGD_ALIGN = [2.3, 13.3, 22.3, 28.2, 33.4, 27.0, 47.9]
LFEA_RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "lfea_runaway"


def test_runaway_found_at_the_first_epoch_with_two_doublings() -> None:
    first = next(
        k
        for k in range(1, len(RUNAWAY_DELTA) + 1)
        if alignment_runaway(RUNAWAY_DELTA[:k], RUNAWAY_ALIGN[:k])
    )
    assert first == 5  # epochs 3->4 (x2.3) and 4->5 (x3.8); epoch 2->3 was x1.96
    msg = alignment_runaway(RUNAWAY_DELTA[:5], RUNAWAY_ALIGN[:5])
    assert msg is not None and "-58.9 -> -133.5 -> -503.6" in msg and "train.gamma" in msg
    assert "last 2 epochs" in msg
    windows = alignment_runaway(RUNAWAY_DELTA[:5], RUNAWAY_ALIGN[:5], unit="log windows")
    assert windows is not None and "last 2 log windows" in windows


def test_no_runaway_when_delta_settles_or_align_falls() -> None:
    rising = [float(k) for k in range(1, 8)]  # the loss condition holds: Delta alone decides
    for k in range(1, len(STABLE_DELTA) + 1):
        assert alignment_runaway(STABLE_DELTA[:k], STABLE_ALIGN[:k]) is None
        assert alignment_runaway(STABLE_DELTA[:k], rising[:k]) is None
    falling = [5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.2]  # Delta explodes but the hinge is being met
    assert alignment_runaway(RUNAWAY_DELTA, falling) is None
    assert alignment_runaway(RUNAWAY_DELTA, rising) is not None  # the same Delta does fire
    assert alignment_runaway([8.0, 20.0, 500.0], [1.0, 2.0, 3.0]) is None  # positive energies
    for k in range(1, len(SGD_DELTA) + 1):
        assert alignment_runaway(SGD_DELTA[:k], SGD_ALIGN[:k]) is None
    assert alignment_runaway(SGD_DELTA[:3], SGD_ALIGN[:3], floor=50.0) is not None


def test_runaway_span_and_growth_are_honoured() -> None:
    assert alignment_runaway(RUNAWAY_DELTA[:5], RUNAWAY_ALIGN[:5], growth=4.0) is None
    assert alignment_runaway(RUNAWAY_DELTA[:4], RUNAWAY_ALIGN[:4], span=1) is not None
    assert alignment_runaway(RUNAWAY_DELTA[:5], RUNAWAY_ALIGN[:5], span=4) is None


@pytest.mark.parametrize(
    ("deltas", "aligns", "kw", "match"),
    [
        ([-1.0, -2.0], [1.0], {}, "2 deltas but 1 alignment"),
        ([-1.0], [1.0], {"growth": 1.0}, "growth > 1"),
        ([-1.0], [1.0], {"span": 0}, "span >= 1"),
        ([-1.0], [1.0], {"floor": -1.0}, "floor >= 0"),
    ],
)
def test_runaway_bad_input(deltas, aligns, kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        alignment_runaway(deltas, aligns, **kw)


def test_runaway_verdicts_on_the_committed_runs() -> None:
    """The claims of BENCHMARKS.md ("Why L_fea collapses"): on the 22 committed runs the
    thresholds were set on, the detector fires on 5 (3 seeds at gamma 0.01, 2 with weight decay)
    and is silent on 17; on the 4 held-out runs (seeds 3-4, gamma 0.01 and 0.003) it fires on
    the 2 at gamma 0.01. Each run's stored warning names the Delta path it finds now."""
    fired, silent = [], []
    for path in find_jsonl(LFEA_RESULTS):
        for rec in read_jsonl(path):
            ep = [e for e in rec["epochs"] if "loss_align" in e]
            found = None
            for k in range(1, len(ep) + 1):
                msg = alignment_runaway(
                    [e["delta"] for e in ep[:k]], [e["loss_align"] for e in ep[:k]]
                )
                if msg is not None:
                    found = (k, msg)
                    break
            name = f"{path.parent.name}/{rec['variant']}/{rec['seed']}"
            if found is None:
                assert rec["warnings"] == [], name
                silent.append(name)
            else:
                (stored,) = rec["warnings"]
                assert stored.split(" and ")[0] == found[1].split(" and ")[0], name
                fired.append((name, found[0]))
    held_out = [n for n, _ in fired if n.startswith("holdout/")]
    assert held_out == ["holdout/['train.gamma=0.01']/3", "holdout/['train.gamma=0.01']/4"]
    assert len(fired) == 7 and len(silent) == 19
    assert sorted(k for _, k in fired) == [4, 5, 5, 5, 5, 5, 6]


# -- alignment variants (train.alignment) --------------------------------------------------------


def test_centered_free_energy_ignores_a_per_sample_shift() -> None:
    g = torch.Generator().manual_seed(0)
    e = torch.randn(6, 5, generator=g, dtype=torch.float64)
    shift = 100 * torch.randn(6, 1, generator=g, dtype=torch.float64)
    assert torch.allclose(free_energy(e + shift), free_energy(e) + shift[:, 0])
    assert torch.allclose(centered_free_energy(e + shift), centered_free_energy(e))
    assert torch.allclose(centered_free_energy(e), free_energy(e) - e.mean(1))


@pytest.mark.parametrize("tau", [0.5, 1.0, 2.0])
def test_centered_free_energy_is_at_most_minus_log_c_over_tau(tau: float) -> None:
    e = 3 * torch.randn(200, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    bound = -math.log(7) / tau
    assert (centered_free_energy(e, tau) <= bound + 1e-12).all()
    flat = torch.zeros(1, 7, dtype=torch.float64)
    assert centered_free_energy(flat, tau).item() == pytest.approx(bound)


def test_alignment_gradients_paper_pushes_the_common_mode_centered_does_not() -> None:
    e = torch.randn(8, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for alignment, row_sum in (("paper", 1.0), ("centered", 0.0)):
        x = e.clone().requires_grad_(True)
        free_energy_alignment_loss(x, delta=-50.0, reduction="sum", alignment=alignment).backward()
        assert x.grad is not None
        assert torch.allclose(x.grad.sum(1), torch.full((8,), row_sum, dtype=torch.float64))


def test_alignment_free_energy_unknown_variant() -> None:
    with pytest.raises(ValueError, match="alignment must be one of paper, centered"):
        alignment_free_energy(E3, "shifted")


def test_balanced_gradient_cannot_move_the_class_marginal_or_the_common_mode() -> None:
    e = 3 * torch.randn(16, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = e.clone().requires_grad_(True)
    free_energy_alignment_loss(x, delta=-2.0, reduction="sum", alignment="balanced").backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert torch.allclose(x.grad.sum(1), torch.zeros(16, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(x.grad.sum(0), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    shifted = e + torch.randn(1, 5, dtype=torch.float64) + torch.randn(16, 1, dtype=torch.float64)
    assert torch.allclose(balanced_free_energy(shifted), balanced_free_energy(e))
    assert (balanced_free_energy(e) <= -math.log(5) + 1e-12).all()


def test_normalized_alignment_is_scale_free_and_gives_the_scale_no_gradient() -> None:
    g = torch.Generator().manual_seed(4)
    es = 4 * torch.randn(12, 5, generator=g, dtype=torch.float64)
    et = 2 * torch.randn(10, 5, generator=g, dtype=torch.float64)

    def loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        s = alignment_scale(a, b)
        return free_energy_alignment_loss(b, -2.0, reduction="sum", alignment="normalized", scale=s)

    for k in (3.0, 10.0):  # the value does not change when every energy is scaled
        assert torch.allclose(loss(k * es, k * et), loss(es, et))
    assert not torch.allclose(  # unlike the balanced variant's
        balanced_free_energy(3 * et), balanced_free_energy(et)
    )
    a, b = es.clone().requires_grad_(True), et.clone().requires_grad_(True)
    loss(a, b).backward()
    assert a.grad is not None and b.grad is not None and b.grad.abs().sum() > 0
    # Euler: the derivative along E -> kE (both batches) is zero; no common mode, no marginal
    along_scale = (a.grad * es).sum() + (b.grad * et).sum()
    assert abs(float(along_scale)) < 1e-9
    for grad in (a.grad, b.grad):
        assert torch.allclose(grad.sum(1), torch.zeros_like(grad.sum(1)), atol=1e-12)
        assert torch.allclose(grad.sum(0), torch.zeros_like(grad.sum(0)), atol=1e-12)
    assert (normalized_free_energy(et, alignment_scale(es, et)) <= -math.log(5) + 1e-12).all()


def test_normalized_alignment_is_finite_when_every_recentred_energy_is_zero() -> None:
    """A zero-initialised head (or one-sample batches) gives recentred energies of exactly 0:
    the scale sits at its floor and the gradient is 0, not NaN (sqrt's slope at 0 is inf)."""
    w = torch.zeros(3, 4, requires_grad=True)
    e = torch.randn(8, 4, generator=torch.Generator().manual_seed(6)) @ w.t() + torch.ones(3)
    s = alignment_scale(e[:4], e[4:])
    assert s.item() == 1.0
    free_energy_alignment_loss(e[4:], -2.0, alignment="normalized", scale=s).backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_normalized_free_energy_stays_within_its_bounds() -> None:
    """``-log C >= N >= -log C - sqrt(n C)``, ``n`` the samples ``sigma`` is taken over."""
    g = torch.Generator().manual_seed(7)
    for n_s, n_t, c, spread in ((2, 1, 2, 1e3), (4, 4, 10, 50.0), (1, 3, 31, 1e4)):
        es = spread * torch.randn(n_s, c, generator=g, dtype=torch.float64)
        et = spread * torch.randn(n_t, c, generator=g, dtype=torch.float64)
        et[0, 0] -= 100 * spread  # one very confident sample
        s = alignment_scale(es, et)
        values = torch.cat([normalized_free_energy(es, s), normalized_free_energy(et, s)])
        assert (values <= -math.log(c) + 1e-9).all()
        assert (values >= -math.log(c) - math.sqrt((n_s + n_t) * c)).all()


def test_normalized_alignment_below_one_nat_is_the_balanced_one() -> None:
    e = 0.01 * torch.randn(6, 3, generator=torch.Generator().manual_seed(5))
    assert alignment_scale(e, e).item() == 1.0
    assert torch.allclose(
        alignment_free_energy(e, "normalized", scale=1.0), balanced_free_energy(e)
    )
    with pytest.raises(ValueError, match="needs the joint energy scale"):
        alignment_free_energy(e, "normalized")
    with pytest.raises(ValueError, match="at least one batch"):
        alignment_scale()
