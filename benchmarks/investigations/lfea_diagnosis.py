"""Where the free-energy alignment loss goes wrong: per-epoch measurements of one EADA run.

The energy NLL ``E(x, y) - F(x)`` does not change when a constant is added to all energies of a
sample, so every energy vector splits into a *common mode* ``m(x) = mean_y E(x, y)`` that no
supervised term constrains and a *shape* ``E(x, .) - m(x)`` that decides the prediction. The
free energy splits the same way: ``F(x) = m(x) + G(x)`` with ``G = F - m`` a function of the
shape only (:func:`eada.energy.centered_free_energy`). At the end of every epoch this script
records, on a fixed random subset of the source and the target (test view, ``eval`` mode):

* the mean and spread of ``m``, ``G`` and ``F`` per domain, and quantiles (5/25/50/75/95 %) of
  ``F`` and ``G`` (the histograms over epochs), the mean per-sample spread of the shape
  (``std_y`` of ``E - m``), the target accuracy of the subset and the share of each predicted
  class on the target (a collapse onto few classes shows there);
* the energy scale: the joint RMS of both domains' recentred energies
  (:func:`eada.energy.alignment_scale` without its floor), what the ``normalized`` alignment
  divides by and what the confidence feedback grows;
* the energy head's common-mode parameters: the mean row ``w_bar`` (norm) and mean bias
  ``b_bar`` of the last linear layer (``m(x) = w_bar . h(x) + b_bar``);
* gradient norms, on a fixed batch, of each loss term: ``NLL(source)`` and ``gamma * L_fea``
  (the run's variant, against the trainer's current ``Delta``), and the share of the
  ``L_fea`` gradient's squared norm that falls on the head's common-mode parameters.

Usage (repository root; one torch thread):

    python benchmarks/investigations/lfea_diagnosis.py digits/mnist-mnistm --method eada \
        [--set train.alignment=centered] [--seed 0] [--subset 4000] --out FILE.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eada import energy as E
from eada.bench import make_config
from eada.data.tasks import load_task
from eada.runs import environment_info, write_json
from eada.train.evaluate import predict_energies
from eada.train.loop import ActiveDATrainer

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def _head(model: nn.Module) -> nn.Linear:
    """The last linear layer (the energy head)."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not last:
        raise ValueError("model has no linear layer")
    return last[-1]


def domain_stats(e: torch.Tensor) -> dict[str, Any]:
    """Common mode, shape spread, F and G of a domain's energies."""
    m = e.mean(1)
    f = E.free_energy(e)
    g = f - m
    q = torch.tensor(QUANTILES)
    return {
        "common_mean": float(m.mean()),
        "common_std": float(m.std()),
        "shape_std": float((e - m[:, None]).std(1).mean()),
        "F_mean": float(f.mean()),
        "G_mean": float(g.mean()),
        "F_quantiles": [round(float(v), 3) for v in torch.quantile(f, q)],
        "G_quantiles": [round(float(v), 3) for v in torch.quantile(g, q)],
    }


def _align_loss(
    model: nn.Module, xs: torch.Tensor, xt: torch.Tensor, delta: float, alignment: str
) -> torch.Tensor:
    """``L_fea`` on the fixed target batch; ``normalized`` takes its scale from the source and
    target batches together, as the trainer does."""
    et = model(xt)
    scale = E.alignment_scale(model(xs), et) if alignment == "normalized" else None
    return E.free_energy_alignment_loss(et, delta, alignment=alignment, scale=scale)


def grad_norms(
    trainer: ActiveDATrainer, xs: torch.Tensor, ys: torch.Tensor, xt: torch.Tensor
) -> dict[str, float]:
    """Gradient norms of NLL(source) and gamma*L_fea on one fixed batch (a copy of the model in
    train mode, one pass per stream as the trainer, so batch-norm statistics are untouched)."""
    t = trainer.cfg.train
    model = copy.deepcopy(trainer.model).train()
    head = _head(model)
    params = [p for p in model.parameters() if p.requires_grad]
    delta = trainer.delta.value if trainer.delta.value is not None else 0.0
    gamma = t.gamma if t.gamma > 0 else 0.01  # the no-L_fea run: the gradient it would get
    out: dict[str, float] = {}
    for name, loss_fn in (
        ("nll_source", lambda: E.energy_nll(model(xs), ys)),
        ("align", lambda: gamma * _align_loss(model, xs, xt, delta, t.alignment)),
    ):
        grads = torch.autograd.grad(loss_fn(), params, allow_unused=True)
        sq = sum(float((g**2).sum()) for g in grads if g is not None)
        out[f"grad_{name}"] = sq**0.5
        gw = dict(zip([id(p) for p in params], grads, strict=True))
        w_g, b_g = gw.get(id(head.weight)), gw.get(id(head.bias))
        common = 0.0  # squared norm of the head gradient along the common mode
        if w_g is not None:
            common += float(w_g.mean(0).pow(2).sum()) * w_g.shape[0]
        if b_g is not None:
            common += float(b_g.mean()) ** 2 * b_g.shape[0]
        out[f"grad_{name}_common_share"] = common / sq if sq > 0 else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one config with the per-epoch measurements; write them as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("task", help="preset or YAML config")
    p.add_argument("--method", default="eada")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--subset", type=int, default=4000, help="samples per domain measured")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cfg = make_config(args.task, args.method, args.seed, args.set)
    task = load_task(cfg.data, cfg.seed, cfg.model, "cpu")
    gen = torch.Generator().manual_seed(1234)
    idx_s = torch.randperm(len(task.source), generator=gen)[: args.subset]
    idx_t = torch.randperm(len(task.target), generator=gen)[: args.subset]
    bs = min(128, len(idx_s), len(idx_t))
    xs, ys = task.source.x[idx_s[:bs]], task.source.y[idx_s[:bs]]
    xt = task.target.x[idx_t[:bs]]
    epochs: list[dict[str, Any]] = []

    def measure(trainer: ActiveDATrainer, epoch: int, record: dict[str, Any]) -> None:
        model = trainer.model
        es = predict_energies(model, task.source, idx_s, 512, trainer.device)
        et = predict_energies(model, task.target, idx_t, 512, trainer.device)
        head = _head(model)
        rec: dict[str, Any] = {
            "epoch": epoch,
            "delta": trainer.delta.value if trainer.delta.value is not None else float("nan"),
            "loss_align": record.get("loss_align"),
            "loss_source": record.get("loss_source"),
            "target_accuracy_subset": float(
                100 * (et.argmin(1) == task.target.y[idx_t]).float().mean()
            ),
            "target_predicted_class_shares": [
                round(float(v), 4)
                for v in torch.bincount(et.argmin(1), minlength=et.shape[1]).float() / len(et)
            ],
            "source": domain_stats(es),
            "target": domain_stats(et),
            # the joint RMS of the recentred energies (eada.energy.alignment_scale, no floor)
            "energy_scale": float(E.alignment_scale(es, et, floor=1e-12)),
            "head_w_bar_norm": float(head.weight.detach().mean(0).norm()),
            "head_b_bar": float(head.bias.detach().mean()) if head.bias is not None else 0.0,
            **grad_norms(trainer, xs, ys, xt),
        }
        epochs.append(rec)
        print(
            f"epoch {epoch}: acc {rec['target_accuracy_subset']:.1f} delta {rec['delta']:.2f} "
            f"m_s {rec['source']['common_mean']:.2f} m_t {rec['target']['common_mean']:.2f} "
            f"G_s {rec['source']['G_mean']:.2f} G_t {rec['target']['G_mean']:.2f} "
            f"scale {rec['energy_scale']:.2f} "
            f"|g_nll| {rec['grad_nll_source']:.3g} |g_align| {rec['grad_align']:.3g} "
            f"(common {rec['grad_align_common_share']:.2f})",
            flush=True,
        )

    def callback(event: str, trainer: Any, info: dict[str, Any]) -> None:
        if event == "epoch_end":
            measure(trainer, info["epoch"], info)

    trainer = ActiveDATrainer(cfg, task, callbacks=[callback])
    t0 = time.perf_counter()
    measure(trainer, 0, {})
    result = trainer.run()
    final = result.final["last_epoch"]["target"]["accuracy"]
    out = {
        "task": args.task,
        "method": args.method,
        "seed": args.seed,
        "overrides": args.set,
        "config": cfg.model_dump(mode="json"),
        "final_target_accuracy": final,
        "seconds": time.perf_counter() - t0,
        "epochs": epochs,
        "environment": environment_info(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), out)
    print(f"final target accuracy {final:.2f}% -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
