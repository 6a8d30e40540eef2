"""Source-vs-target statistics recorded during a run, for the report's figures
(:mod:`eada.reports` draws them; :mod:`eada.reports.domain_stats` re-exports these names).

:class:`DomainStatsRecorder` is a trainer callback. Before every selection round and after the
last epoch it takes a *snapshot* of the current model on fixed random subsamples of the source
and the target domain:

* the free energies ``F(x) = -(1/tau) log sum_y exp(-tau E(x, y))`` of up to ``n_free_energy``
  samples per domain (paper Fig. 1: free-energy distributions of source vs target);
* the proxy A-distance and the RBF-kernel MMD^2 between the two domains' penultimate features
  (``EnergyNet.embed``) on up to ``n_features`` samples per domain (paper appendix);
* for a two-dimensional input with a linear energy head (the toy example) the head's weights,
  so the decision boundary before each round can be drawn without re-training (paper Fig. 5).

After every round it also stores the scores of the samples just queried (free energy, MvSM,
predicted class). Snapshot ``k`` is "before round k+1"; the snapshot after it is the model after
the training that followed that round, so consecutive snapshots are "before" and "after" a round.
Everything is a few thousand floats a snapshot and goes into the run record under
``domain_stats`` (see :func:`eada.experiment.run_once`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from eada import energy as energy_ops
from eada.data.batches import chunks, iterate_inputs
from eada.data.tasks import Domain
from eada.models.base import EnergyNet
from eada.threads import blas_limits

if TYPE_CHECKING:
    from eada.train.loop import ActiveDATrainer

STATS_VERSION = 1


def proxy_a_distance(
    source: np.ndarray, target: np.ndarray, seed: int = 0, folds: int = 2
) -> dict[str, float]:
    """Proxy A-distance ``2 (1 - 2 err)`` of a linear domain classifier (Ben-David et al. 2007).

    ``err`` is the ``folds``-fold cross-validated error of a logistic regression (scikit-learn,
    on standardised features) that tells source rows (label 0) from target rows (label 1).
    ``2`` means perfectly separable domains, ``0`` indistinguishable ones; the value is not
    clipped, so a classifier worse than chance gives a small negative number.

    Args:
        source: ``(n_s, D)`` source features.
        target: ``(n_t, D)`` target features.
        seed: seed of the fold split.
        folds: number of cross-validation folds (>= 2).

    Returns:
        ``{"a_distance": 2 (1 - 2 err), "error": err}``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> far = proxy_a_distance(rng.normal(0, 1, (200, 5)), rng.normal(5, 1, (200, 5)))
        >>> round(far["a_distance"], 2)
        2.0
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    source, target = np.asarray(source, float), np.asarray(target, float)
    if source.ndim != 2 or target.ndim != 2 or source.shape[1] != target.shape[1]:
        raise ValueError(
            f"A-distance needs (n, D) features of equal width, got {source.shape} and "
            f"{target.shape}"
        )
    if min(len(source), len(target)) < folds:
        raise ValueError(f"A-distance needs at least {folds} samples per domain")
    x = np.concatenate([source, target])
    y = np.concatenate([np.zeros(len(source), int), np.ones(len(target), int)])
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=300))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    err = 1.0 - float(np.mean(cross_val_score(clf, x, y, cv=cv)))
    return {"a_distance": 2.0 * (1.0 - 2.0 * err), "error": err}


def mmd2_rbf(source: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """Unbiased squared MMD with an RBF kernel and the median heuristic (Gretton et al. 2012).

    ``k(a, b) = exp(-||a - b||^2 / h)`` with ``h`` the median squared distance between all
    pooled samples;
    ``MMD^2 = mean_{i!=j} k(s_i, s_j) + mean_{i!=j} k(t_i, t_j) - 2 mean_{i,j} k(s_i, t_j)``
    (can be slightly negative when the domains match).

    Args:
        source: ``(n_s, D)`` features, ``n_s >= 2``.
        target: ``(n_t, D)`` features, ``n_t >= 2``.

    Returns:
        ``{"mmd2": MMD^2, "bandwidth": h}``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> same = mmd2_rbf(rng.normal(size=(300, 3)), rng.normal(size=(300, 3)))["mmd2"]
        >>> far = mmd2_rbf(rng.normal(size=(300, 3)), rng.normal(3, 1, (300, 3)))["mmd2"]
        >>> abs(same) < 0.01 < far
        True
    """
    s = torch.as_tensor(np.asarray(source), dtype=torch.float64)
    t = torch.as_tensor(np.asarray(target), dtype=torch.float64)
    if s.ndim != 2 or t.ndim != 2 or s.shape[1] != t.shape[1]:
        raise ValueError(f"MMD needs (n, D) features of equal width, got {s.shape} and {t.shape}")
    n, m = len(s), len(t)
    if min(n, m) < 2:
        raise ValueError("MMD needs at least 2 samples per domain")
    z = torch.cat([s, t])
    d2 = torch.cdist(z, z).pow(2)
    off = d2[~torch.eye(len(z), dtype=torch.bool)]
    h = float(off.median())
    if h <= 0:
        h = 1.0  # all points identical: any bandwidth gives MMD = 0
    k = torch.exp(-d2 / h)
    kss, ktt, kst = k[:n, :n], k[n:, n:], k[:n, n:]
    mmd2 = (
        (kss.sum() - kss.diagonal().sum()) / (n * (n - 1))
        + (ktt.sum() - ktt.diagonal().sum()) / (m * (m - 1))
        - 2 * kst.mean()
    )
    return {"mmd2": float(mmd2), "bandwidth": h}


@torch.no_grad()
def _outputs(
    model: torch.nn.Module,
    domain: Domain,
    idx: torch.Tensor,
    batch_size: int,
    device: torch.device,
    features: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Energies (and penultimate features when asked) of ``domain[idx]``, eval mode."""
    model.eval()
    es, zs = [], []
    for x in iterate_inputs(domain.view("test"), chunks(idx, batch_size)):
        x = x.to(device)
        if features and isinstance(model, EnergyNet):
            z = model.embed(x)
            es.append(model.head(z).float().cpu())
            zs.append(z.float().cpu())
        else:
            e = model(x).float()
            es.append(e.cpu())
            if features:
                zs.append(e.cpu())  # no embedding: the energies are the features
    energies = torch.cat(es)
    return energies, (torch.cat(zs) if features else None)


def _round(values: torch.Tensor | np.ndarray, digits: int = 4) -> list[float]:
    return [float(v) for v in np.round(np.asarray(values, dtype=float), digits)]


class DomainStatsRecorder:
    """Trainer callback that stores source-vs-target statistics (see the module docstring).

    Args:
        n_free_energy: free energies kept per domain and snapshot (a fixed random subsample).
        n_features: samples per domain for the A-distance and MMD (a fixed random subsample).
        seed: seed of the subsamples and of the A-distance folds; the trainer's own random
            streams are never touched, so a run's results do not change with the recorder.
        distances: compute the A-distance and MMD (the most expensive part).

    Use it as ``run_once(cfg, callbacks=[rec])`` (``run_once`` adds one by default) and read
    :attr:`data` afterwards.

    Example:
        >>> from eada.hparams import preset_config
        >>> from eada.train import ActiveDATrainer
        >>> from eada.data.tasks import load_task
        >>> cfg = preset_config("toy", "eada", overrides=["train.epochs=2", "active.rounds_at=[1]"])
        >>> rec = DomainStatsRecorder(n_features=100)
        >>> _ = ActiveDATrainer(cfg, load_task(cfg.data), callbacks=[rec]).run()
        >>> [s["stage"] for s in rec.data["snapshots"]]
        ['before round 1', 'final']
    """

    def __init__(
        self,
        n_free_energy: int = 1000,
        n_features: int = 500,
        seed: int = 0,
        distances: bool = True,
    ) -> None:
        if n_free_energy < 2 or n_features < 4:
            raise ValueError("n_free_energy must be >= 2 and n_features >= 4")
        self.n_free_energy = n_free_energy
        self.n_features = n_features
        self.seed = seed
        self.distances = distances
        self.data: dict[str, Any] = {
            "version": STATS_VERSION,
            "snapshots": [],
            "selected": [],
            "seconds": 0.0,
        }
        self._idx: dict[str, torch.Tensor] = {}

    def __call__(self, event: str, trainer: ActiveDATrainer, info: dict[str, Any]) -> None:
        """Handle a trainer event (``before_round``, ``after_round``, ``epoch_end``)."""
        t0 = time.perf_counter()
        if event == "before_round":
            self.data["snapshots"].append(
                self.snapshot(trainer, f"before round {info['round']}", info["epoch"])
            )
        elif event == "after_round":
            self.data["selected"].append(self._selected_scores(trainer, info))
        elif event == "epoch_end" and info["epoch"] == trainer.cfg.train.epochs:
            self.data["snapshots"].append(self.snapshot(trainer, "final", info["epoch"]))
        self.data["seconds"] += time.perf_counter() - t0

    def _subsample(self, name: str, n_total: int, n: int) -> torch.Tensor:
        """The first ``n`` positions of a fixed random permutation of the domain (in that
        random order, so any prefix is a uniform subsample)."""
        key = f"{name}/{n}"
        if key not in self._idx:
            rng = np.random.default_rng([self.seed, len(self._idx), n_total])
            self._idx[key] = torch.from_numpy(rng.permutation(n_total)[: min(n, n_total)])
        return self._idx[key]

    def snapshot(self, trainer: ActiveDATrainer, stage: str, epoch: int) -> dict[str, Any]:
        """Statistics of the trainer's current model (one entry of ``data["snapshots"]``)."""
        t0 = time.perf_counter()
        tau = trainer.cfg.train.tau
        bs = trainer.cfg.train.eval_batch_size
        domains = {"source": trainer.task.source, "target": trainer.task.target}
        out: dict[str, Any] = {
            "stage": stage,
            "epoch": epoch,
            "n_labeled": int(trainer.labeled_mask.sum()),
            "free_energy": {},
        }
        feats: dict[str, np.ndarray] = {}
        for name, dom in domains.items():
            # ONE forward pass a domain: the first n_free_energy rows of a fixed random
            # permutation give the free energies, its first n_features rows the features
            idx = self._subsample(name, len(dom), max(self.n_free_energy, self.n_features))
            e, z = _outputs(trainer.model, dom, idx, bs, trainer.device, features=self.distances)
            out["free_energy"][name] = _round(energy_ops.free_energy(e[: self.n_free_energy], tau))
            if z is not None:
                feats[name] = z[: self.n_features].double().numpy()
        out["n"] = {k: len(v) for k, v in out["free_energy"].items()}
        if self.distances:
            with blas_limits():
                a = proxy_a_distance(feats["source"], feats["target"], seed=self.seed)
                m = mmd2_rbf(feats["source"], feats["target"])
            out.update(
                a_distance=a["a_distance"],
                domain_error=a["error"],
                mmd2=m["mmd2"],
                mmd_bandwidth=m["bandwidth"],
                n_features=len(feats["source"]),
            )
        if isinstance(trainer.model, EnergyNet):
            body = [*trainer.model.backbone.parameters(), *trainer.model.bottleneck.parameters()]
            out["features_fixed"] = not any(p.requires_grad for p in body)
        head = getattr(trainer.model, "head", None)
        if (
            isinstance(head, torch.nn.Linear)
            and head.in_features == 2
            and math.prod(trainer.task.source.input_shape) == 2
        ):
            out["head"] = {
                "weight": head.weight.detach().cpu().double().tolist(),
                "bias": head.bias.detach().cpu().double().tolist(),
            }
        out["seconds"] = time.perf_counter() - t0
        return out

    def _selected_scores(self, trainer: ActiveDATrainer, rec: dict[str, Any]) -> dict[str, Any]:
        idx = torch.as_tensor(rec["selected"], dtype=torch.long)
        tau = trainer.cfg.train.tau
        e, _ = _outputs(
            trainer.model,
            trainer.task.target,
            idx,
            trainer.cfg.train.eval_batch_size,
            trainer.device,
            features=False,
        )
        return {
            "round": rec["round"],
            "free_energy": _round(energy_ops.free_energy(e, tau)),
            "mvsm": _round(energy_ops.mvsm(e)),
            "predicted": e.argmin(dim=1).tolist(),
        }
