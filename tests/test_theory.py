"""The paper's theory (appendix) as property tests, in float64.

Toy model: E(x, j) = w_j^T x with W in R^{C x D} (no bias), L_nll = E(x, y) - F(x).

* Lemma 1: for a correct strict prediction, <grad_W L_nll, grad_W F> > 0, and in closed form the
  inner product is ||x||^2 (p_y - ||p||^2) with p = softmax(-W x).
* Lemma 2: for any eta > 0, F(x; W - eta grad L_nll) < F(x; W).
* Theorem 1 (first-order spot check on a small MLP): a small gradient step on L_nll lowers F
  whenever <grad L_nll, grad F> is clearly positive.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from eada.energy import energy_nll, free_energy

BOUND = 5.0
ELEM = st.floats(-BOUND, BOUND, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def toy_problem(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    c = draw(st.integers(2, 6))
    d = draw(st.integers(1, 8))
    w = draw(arrays(np.float64, (c, d), elements=ELEM))
    x = draw(arrays(np.float64, (d,), elements=ELEM))
    return w, x


def _grads(w_np: np.ndarray, x_np: np.ndarray, y: int) -> tuple[torch.Tensor, torch.Tensor]:
    """grad_W L_nll(x, y; W) and grad_W F(x; W) by autograd."""
    w = torch.tensor(w_np, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(x_np, dtype=torch.float64)
    e = (w @ x)[None, :]
    (g_f,) = torch.autograd.grad(free_energy(e).sum(), w, retain_graph=True)
    (g_l,) = torch.autograd.grad(energy_nll(e, torch.tensor([y]), reduction="sum"), w)
    return g_l, g_f


def _free_energy(w: np.ndarray | torch.Tensor, x: np.ndarray) -> float:
    w_t = torch.as_tensor(w, dtype=torch.float64)
    return float(free_energy((w_t @ torch.as_tensor(x, dtype=torch.float64))[None, :])[0])


def _closed_form(w: np.ndarray, x: np.ndarray, y: int) -> tuple[float, np.ndarray]:
    e = w @ x
    p = np.exp(-(e - e.min()))
    p /= p.sum()
    return float(x @ x) * float(p[y] - p @ p), p


def _correct_label(w: np.ndarray, x: np.ndarray) -> int | None:
    """The class of strictly lowest energy, or None when the minimum is tied."""
    e = w @ x
    y = int(np.argmin(e))
    others = np.delete(e, y)
    return y if (others > e[y]).all() else None


@settings(max_examples=200, deadline=None)
@given(toy_problem())
def test_lemma1_positive_gradient_inner_product(problem: tuple[np.ndarray, np.ndarray]) -> None:
    w, x = problem
    assume(float(x @ x) > 1e-6)
    y = _correct_label(w, x)
    assume(y is not None)
    assert y is not None
    expected, p = _closed_form(w, x, y)
    assume(p[y] - p @ p > 1e-9)  # above float64 resolution

    g_l, g_f = _grads(w, x, y)
    inner = float((g_l * g_f).sum())
    assert inner > 0
    assert inner == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # the appendix's explicit gradients: grad F = p x^T, grad L = (e_y - p) x^T
    onehot = np.eye(len(p))[y]
    assert np.allclose(g_f.numpy(), np.outer(p, x), atol=1e-12)
    assert np.allclose(g_l.numpy(), np.outer(onehot - p, x), atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(toy_problem(), st.floats(1e-3, 10.0))
def test_lemma2_gradient_step_lowers_free_energy(
    problem: tuple[np.ndarray, np.ndarray], eta: float
) -> None:
    w, x = problem
    y = _correct_label(w, x)
    assume(y is not None)
    assert y is not None
    inner, p = _closed_form(w, x, y)
    assume(p[y] - p @ p > 1e-9)
    f_before = _free_energy(w, x)
    # F is concave in W, so F(W - eta g) <= F(W) - eta <g, grad F>: require that guaranteed drop
    # to be well above float64 resolution of F.
    assume(eta * inner > 1e-9 * (1.0 + abs(f_before)))

    g_l, _ = _grads(w, x, y)
    w_new = torch.tensor(w) - eta * g_l
    f_after = _free_energy(w_new, x)
    assert f_after < f_before
    # at least the first-order drop (up to rounding of F)
    assert f_after <= f_before - eta * inner + 1e-12 * (1.0 + abs(f_before))


def test_lemma1_needs_a_correct_prediction() -> None:
    """Negative control: for a misclassified sample the inner product is negative and a small
    step on L_nll RAISES the free energy, so the lemmas' assumption is not decorative."""
    x = np.array([1.0, 0.5])
    w = np.array([[-2.0, 0.0], [1.0, 1.0], [0.5, -0.5]])  # energies -2, 1.5, 0.25 -> class 0 wins
    y = 1  # the true label is a high-energy class
    assert _correct_label(w, x) == 0 != y
    expected, _ = _closed_form(w, x, y)
    assert expected < 0

    g_l, g_f = _grads(w, x, y)
    inner = float((g_l * g_f).sum())
    assert inner < 0
    assert inner == pytest.approx(expected, rel=1e-9)

    eta = 1e-3
    f_before = _free_energy(w, x)
    f_after = _free_energy(torch.tensor(w) - eta * g_l, x)
    assert f_after > f_before
    # the label-y version of the same sample, now correctly classified, behaves as Lemma 2 says
    g_l0, _ = _grads(w, x, 0)
    assert _free_energy(torch.tensor(w) - eta * g_l0, x) < f_before


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)
    ).double()


@pytest.mark.parametrize("seed", range(6))
def test_theorem1_small_step_lowers_free_energy_when_inner_product_positive(seed: int) -> None:
    model = _mlp(seed)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(100 + seed)
    eps, eta = 1e-2, 1e-4
    checked = 0
    for _ in range(20):
        x = torch.randn(1, 5, generator=g, dtype=torch.float64) * 2
        y = torch.randint(0, 4, (1,), generator=g)
        e = model(x)
        grads_l = torch.autograd.grad(energy_nll(e, y), params, retain_graph=True)
        grads_f = torch.autograd.grad(free_energy(e).sum(), params)
        inner = sum(float((a * b).sum()) for a, b in zip(grads_l, grads_f, strict=True))
        if inner <= eps:
            continue
        checked += 1
        with torch.no_grad():
            f_before = float(free_energy(model(x))[0])
            for q, gl in zip(params, grads_l, strict=True):
                q -= eta * gl
            f_after = float(free_energy(model(x))[0])
            for q, gl in zip(params, grads_l, strict=True):  # undo the step
                q += eta * gl
        assert f_after < f_before
        # first order: the drop is eta * <grad L, grad F> up to O(eta^2)
        assert f_before - f_after == pytest.approx(eta * inner, rel=0.05)
    assert checked > 0  # the check is never vacuous
