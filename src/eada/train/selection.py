"""Selection: score the unlabeled pool with the current model, let the strategy choose, ask the
oracle, move the chosen samples to the labeled set (a part of
:class:`~eada.train.loop.ActiveDATrainer`; simulated rounds and a project's human rounds share
:meth:`SelectionMixin.propose`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from eada import distributed as dist_ops
from eada.strategies import TWO_STEP_STRATEGIES, PoolOutputs, Selection, get_strategy
from eada.train.base import Proposal, TrainerBase
from eada.train.evaluate import embed_samples, score_pool


class SelectionMixin(TrainerBase):
    """Pool scoring and selection rounds."""

    # -- selection --------------------------------------------------------------------------
    def propose(self, budget: int, exclude: torch.Tensor | None = None) -> Proposal:
        """Score the unlabeled pool with the current model and let the strategy choose
        ``budget`` samples; asks no labels. The one selection path: simulated rounds
        (:meth:`select_round`) and human rounds (``eada query``) both call it. ``exclude``: a
        boolean mask over the target of unlabeled samples kept out of the pool (a project's
        audit samples, samples a human marked unusable, files that vanished); they still train
        as unlabeled data."""
        a = self.cfg.active
        spec = get_strategy(a.strategy)
        free = ~self.labeled_mask if exclude is None else ~self.labeled_mask & ~exclude
        pool_idx = torch.nonzero(free).squeeze(1)
        t0 = time.perf_counter()
        needs = tuple(spec.needs)
        if self.aux is not None and "embeddings" not in needs:
            needs += ("embeddings",)  # the training components score the pool's embeddings
        outputs = self._score(pool_idx, needs)
        if self.rank == 0:  # labeled/source embeddings, training components' scores
            outputs = self.complete_pool_outputs(outputs, needs)
        t1 = time.perf_counter()
        params = dict(a.params)
        share = a.budget_per_round if isinstance(a.budget_per_round, float) else None
        if a.strategy in TWO_STEP_STRATEGIES:
            params.update(alpha1=a.alpha1, rule=a.selection_rule, budget_share=share)
        elif "budget_share" in spec.options:  # DUC's stage 1: ceil(N_T * share * kappa)
            params.update(budget_share=share)
        params = spec.own_params(params)  # not the components' settings, unless **params
        if self.world == 1:
            sel = spec.fn(outputs, budget, self.strategy_rng, **params)
        else:  # rank 0 selects ONCE; every rank receives the same positions
            mine = spec.fn(outputs, budget, self.strategy_rng, **params) if self.rank == 0 else None
            idx = dist_ops.broadcast_indices(mine.indices if mine is not None else None)
            sel = mine if mine is not None else Selection(idx, info={"from_rank": 0})
        t2 = time.perf_counter()
        chosen = pool_idx[torch.from_numpy(sel.indices)]
        if self.labeled_mask[chosen].any() or len(set(chosen.tolist())) != len(chosen):
            raise RuntimeError("strategy returned an already-labeled or duplicate sample")
        return Proposal(pool_idx, chosen, outputs, sel, t1 - t0, t2 - t1)

    def complete_pool_outputs(self, outputs: PoolOutputs, needs: tuple[str, ...]) -> PoolOutputs:
        """Add what some strategies need beyond :func:`~eada.train.evaluate.score_pool`:
        embeddings of the labeled target set and of the source (``labeled_embeddings`` /
        ``source_embeddings`` in ``needs``) and the training components' pool scores
        (``outputs.extra``)."""
        bs, dev = self.cfg.train.eval_batch_size, self.device
        if "labeled_embeddings" in needs:
            lab = torch.nonzero(self.labeled_mask).squeeze(1)
            outputs.labeled_embeddings = embed_samples(self.model, self.task.target, lab, bs, dev)
        if "source_embeddings" in needs:
            src = self.task.source
            outputs.source_embeddings = embed_samples(
                self.model, src, torch.arange(len(src)), bs, dev
            )
        if self.aux is not None and len(outputs):
            outputs.extra.update(
                self.aux.pool_scores(outputs.require_embeddings("training components"), dev)
            )
        return outputs

    @property
    def selection_tau(self) -> float:
        """The reverse temperature of the pool's free energies at selection. ``train.tau != 1``
        tempers them as training does: the paper's ``F_tau = -(1/tau) logsumexp(-tau E)``, or
        under ``active.selection_rule: reference`` the authors' selection placement
        ``-tau logsumexp(-E / tau)`` (i.e. ``F`` at reverse temperature ``1/tau``). Both are the
        plain ``F`` at ``tau = 1``."""
        tau = self.cfg.train.tau
        return 1.0 / tau if self.cfg.active.selection_rule == "reference" else tau

    def _score(self, pool_idx: torch.Tensor, needs: tuple[str, ...]) -> PoolOutputs:
        """:func:`~eada.train.evaluate.score_pool` over the pool; distributed, every rank scores
        its shard and the per-sample outputs are gathered back into pool order on every rank."""
        bs = self.cfg.train.eval_batch_size
        if self.world == 1:
            return score_pool(
                self.model, self.task.target, pool_idx, needs, bs, self.device, self.selection_tau
            )
        dist_ops.sync_buffers(self.model)  # same batch-norm statistics on every rank
        n = len(pool_idx)
        part = pool_idx[dist_ops.shard(n, self.rank, self.world)]
        local = score_pool(
            self.model, self.task.target, part, needs, bs, self.device, self.selection_tau
        )

        def gather(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else dist_ops.gather_rows(a, n)

        return PoolOutputs(
            energies=gather(local.energies),
            free_energy=gather(local.free_energy),
            mvsm=gather(local.mvsm),
            embeddings=gather(local.embeddings),
            predictions=gather(local.predictions),
            n_target=local.n_target,
        )

    def set_labels(self, indices: torch.Tensor, labels: torch.Tensor) -> None:
        """Replace the labeled target set by ``indices`` with class ids ``labels`` (e.g. labels
        that exist before training starts); the streams start a new pass."""
        indices, labels = torch.as_tensor(indices).long(), torch.as_tensor(labels).long()
        if len(indices) and (labels.min() < 0 or labels.max() >= self.task.target.num_classes):
            raise ValueError(f"labels must lie in [0, {self.task.target.num_classes})")
        self.labeled_mask.zero_()
        self.target_labels.fill_(-1)
        self.labeled_mask[indices] = True
        self.target_labels[indices] = labels
        self.labeled_stream.set_indices(torch.nonzero(self.labeled_mask).squeeze(1))
        self.unlabeled_stream.set_indices(torch.nonzero(~self.labeled_mask).squeeze(1))

    def select_round(self, r: int, epoch: int, budget: int) -> dict[str, Any]:
        """Score the unlabeled pool, select, ask the oracle, move samples to the labeled set."""
        a = self.cfg.active
        prop = self.last_proposal = self.propose(budget)
        chosen, outputs, sel = prop.chosen, prop.outputs, prop.selection
        pool_idx = prop.pool_idx
        labels = torch.from_numpy(self.oracle.label(chosen.numpy()))
        self.labeled_mask[chosen] = True
        self.target_labels[chosen] = labels
        labeled = torch.nonzero(self.labeled_mask).squeeze(1)
        self.labeled_stream.set_indices(labeled)
        self.unlabeled_stream.set_indices(torch.nonzero(~self.labeled_mask).squeeze(1))
        pred = torch.from_numpy(outputs.get_predictions()[sel.indices]).long()
        return {
            "round": r,
            "epoch": epoch,
            "strategy": a.strategy,
            "budget": len(chosen),
            "n_labeled": int(self.labeled_mask.sum()),
            "pool_before": len(pool_idx),
            "selected": chosen.tolist(),
            "selected_labels": labels.tolist(),
            "selected_error_rate": float(100 * (pred != labels).double().mean()),
            "scoring_seconds": prop.scoring_seconds,
            "selection_seconds": prop.selection_seconds,
            "selection_info": sel.info,
            "pool_mean_free_energy": float(outputs.get_free_energy().mean()),
        }
