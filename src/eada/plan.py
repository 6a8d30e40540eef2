"""The round plan: when each selection round happens and how many samples it labels, as a
function of the config and the target's size (validated before any model is built), and where a
trainer run sits in a longer schedule (:class:`GateSchedule`).

It sits below the trainer (config and strategies only, no torch), so a project store answers
what its next round is (``eada status``, ``eada label import``) without importing the trainer;
:mod:`eada.train.plan` re-exports it for the trainer's modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eada.config import ActiveConfig
from eada.strategies import (
    TWO_STEP_STRATEGIES,
    BudgetTooLargeError,
    reference_random_budget,
    resolve_budget,
    stage_sizes,
)


def lada_budgets(total: int | float, n_target: int, rounds: int) -> list[int]:
    """LADA's per-round budgets (``active/budget.py``): the whole budget (a count, or a share
    of the target set: NumPy's round half to even of ``n_target x share``), ``total // R`` a
    round and the remainder in the last.

    Example:
        >>> lada_budgets(0.05, 2427, 5)  # Office-Home Art: np.round(121.35) = 121
        [24, 24, 24, 24, 25]
        >>> lada_budgets(0.05, 55388, 5)  # VisDA-2017 validation: 2769
        [553, 553, 553, 553, 557]
    """
    import numpy as np

    whole = int(np.round(n_target * total)) if isinstance(total, float) else int(total)
    per = whole // rounds
    return [per] * (rounds - 1) + [whole - per * (rounds - 1)]


def round_plan(a: ActiveConfig, n_target: int) -> list[dict[str, Any]]:
    """The rounds of ``a`` on a target of ``n_target`` samples: per round ``round``,
    ``epoch``, ``pool_before``, ``stage1`` and ``budget``, validated before any work starts
    (a function of the config alone: no model is built).

    Raises:
        BudgetTooLargeError: a round's budget exceeds the pool left.
        ValueError: a round's stage sizes are impossible (its round and epoch named).
    """
    if not a.enabled:
        return []
    budget = resolve_budget(a.budget_per_round, n_target)
    share = a.budget_per_round if isinstance(a.budget_per_round, float) else None
    if a.strategy == "random" and a.selection_rule == "reference" and share is not None:
        budget = reference_random_budget(share, n_target)  # the authors' round(N share)
    budgets = [budget] * len(a.rounds_at)
    if a.budget_total is not None:  # LADA's rule: the whole budget split over the rounds
        budgets = lada_budgets(a.budget_total, n_target, len(a.rounds_at))
    pool = n_target
    plan = []
    for r, epoch in enumerate(a.rounds_at, start=1):
        budget = budgets[r - 1]
        try:
            if budget < 1:
                raise ValueError(
                    f"active.budget_total labels {budget} samples in this round (LADA's rule: "
                    f"the total // {len(a.rounds_at)} rounds); raise it or use fewer rounds"
                )
            if a.strategy in TWO_STEP_STRATEGIES:
                n1, n2 = stage_sizes(pool, budget, a.alpha1, a.selection_rule, n_target, share)
            else:
                if budget > pool:
                    raise BudgetTooLargeError(
                        f"budget {budget} is larger than the unlabeled pool ({pool} samples)"
                    )
                n1, n2 = pool, budget
        except ValueError as err:
            raise ValueError(f"round {r} (epoch {epoch}): {err}") from None
        plan.append({"round": r, "epoch": epoch, "pool_before": pool, "stage1": n1, "budget": n2})
        pool -= n2
    return plan


@dataclass(frozen=True)
class GateSchedule:
    """Where a trainer run sits in a longer schedule, for ``train.fea_gate``'s ``dann`` and
    ``labels`` weights: a project store trains its schedule in segments (one
    :class:`ActiveDATrainer` run each, with no rounds of its own), and the gates must count
    against the whole schedule, as one simulated run does.

    Attributes:
        epochs_before: epochs of the schedule trained before this run.
        epochs: the schedule's epochs (``train.epochs`` of the project's config).
        planned_labels: the target labels its rounds plan in all.
    """

    epochs_before: int
    epochs: int
    planned_labels: int
