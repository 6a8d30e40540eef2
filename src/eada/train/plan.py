"""The round plan as the trainer's modules import it: its home is :mod:`eada.plan` (torch-free,
so that a project store reads its plan without importing the trainer)."""

from eada.plan import GateSchedule, lada_budgets, round_plan

__all__ = ["GateSchedule", "lada_budgets", "round_plan"]
