"""An open project store: its config, its domains (checked against what `eada init`
registered) and where the schedule stands (the rounds planned, the samples awaiting labels,
the next action). The operations build on it by concern: :mod:`eada.store.checkpoints`,
:mod:`eada.store.labels`, :mod:`eada.store.rounds`, :mod:`eada.store.project`."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eada.store.config import StoreOptions, build_config
from eada.store.data import load_project_data, row_hashes
from eada.store.db import Store, StoreError, half_made_error, how, q
from eada.store.targets import sample_info
from eada.store.unlabeled import hide_guessed_accuracy

if TYPE_CHECKING:
    import torch

    from eada.data.tasks import Task


class ProjectBase:
    """An open project store (see :class:`~eada.store.project.Project`)."""

    def __init__(self, folder: str | Path, store: Store | None = None, task: Task | None = None):
        self.folder = Path(folder)
        self.store = store if store is not None else Store(self.folder)
        raw = self.store.get_json("config")
        if not isinstance(raw, dict):  # what a killed (or an older eada's failed) init left
            self.store.close()
            raise half_made_error(self.folder)
        train = raw.get("train")
        if isinstance(train, dict) and "fea_gate" not in train:
            # a project made before train.fea_gate existed trained L_fea without a gate: it
            # keeps that, whatever the default is now
            raw = {**raw, "train": {**train, "fea_gate": "none"}}
        self.cfg = build_config(raw, f"config in {self.folder}")
        self.options = StoreOptions.model_validate(raw.get("store") or {"target": "labeled"})
        self.target_labeled = self.options.target != "unlabeled"
        self._task = task
        self.classes = self.store.classes()

    def current_options(self) -> StoreOptions:
        """The ``store:`` section as the store holds it now (read again: another process's
        ``eada config set`` may have committed since this project was opened); kept as
        :attr:`options`. Called inside a write transaction, it is what that transaction's
        commit applies."""
        raw = self.store.get_json("config")
        if isinstance(raw, dict):
            self.options = StoreOptions.model_validate(raw.get("store") or {"target": "labeled"})
        return self.options

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    @property
    def task(self) -> Task:
        """The project's domains, loaded once and checked against the registered hashes."""
        if self._task is None:
            from eada.store.pool import registered_rows

            files = self.registered_pool()
            task, paths, _ = load_project_data(
                self.cfg, self.target_labeled, target_files=files, target_rows=registered_rows(self)
            )
            for role, dom in (("source", task.source), ("target", task.target)):
                reg = self.store.samples(role)
                if len(reg) != len(dom):
                    raise StoreError(
                        f"{role} domain {dom.name!r} now has {len(dom)} samples but "
                        f"{len(reg)} were registered: the data changed since `eada init`"
                    )
                files = paths.get(role)
                if files is not None:
                    if [str(Path(p).resolve()) for p in files] != [r["path"] for r in reg]:
                        raise StoreError(f"the files of the {role} folder changed since init")
                else:
                    hashes = row_hashes(dom)
                    bad = [
                        r["id"] for r, h in zip(reg, hashes, strict=True) if r["content_hash"] != h
                    ]
                    if bad:
                        ext = sample_info(self.store.conn).get(bad[0], (None, None))[0]
                        named = f" (id {ext!r})" if ext is not None and role == "target" else ""
                        raise StoreError(
                            f"{len(bad)} {role} samples differ from what was registered "
                            f"(first: sample {bad[0]}{named}): the data changed since "
                            "`eada init`"
                        )
            self._task = task
        return self._task

    def registered_pool(self) -> list[Path] | None:
        """The files an unlabeled image target is loaded from: the registered ones in
        position order once the pool has changed (``eada target scan`` ran, or files were
        added since), ``None`` (the config's folder or list, as at init) otherwise.

        Raises:
            StoreError: registered files vanished, naming ``eada target scan``.
        """
        from eada.store.pool import pool_changes

        ch = pool_changes(self)
        if ch is None:
            return None
        if ch.vanished:
            raise StoreError(
                f"{len(ch.vanished)} registered target file(s) vanished (first: "
                f"{ch.vanished[0]}): leave them out of the pool with "
                + how(f"eada target scan --store {q(self.folder)}", "project.scan_target()")
            )
        if not ch.new and self.store.get_meta("pool_scanned") is None:
            return None
        return [Path(r["path"]) for r in self.store.samples("target")]

    def _target_ids(self) -> list[int]:
        return [r["id"] for r in self.store.samples("target")]

    def _audit_mask(self) -> torch.Tensor:
        """Boolean mask over the target of the samples audit rounds drew: kept out of the
        active rounds' pool, and their labels out of training."""
        import torch

        ids = self.store.audit_sample_ids()
        return torch.tensor([sid in ids for sid in self._target_ids()], dtype=torch.bool)

    def plan(self) -> list[dict[str, Any]]:
        """The config's rounds: ``round``, ``epoch``, ``budget``. The target's size is the
        registered count (what :attr:`task` checks its domain against), so asking for the plan
        loads no data (``eada status``, ``eada label import`` answer without it)."""
        from eada.plan import round_plan

        return round_plan(self.cfg.active, len(self.store.samples("target")))

    def pending(self) -> list[sqlite3.Row]:
        """Selected samples of the last active round (not an audit round) that have no label
        yet (those that need attention aside: :mod:`eada.store.attention`)."""
        rounds = self.store.active_rounds()
        if not rounds:
            return []
        return list(
            self.store.conn.execute(
                "SELECT rs.sample_id, s.position FROM round_samples rs "
                "JOIN samples s ON s.id = rs.sample_id WHERE rs.round_id = ? AND "
                "rs.rank IS NOT NULL AND s.position >= 0 AND NOT EXISTS "
                "(SELECT 1 FROM labels l WHERE l.sample_id = rs.sample_id) AND NOT EXISTS "
                "(SELECT 1 FROM attention a WHERE a.sample_id = rs.sample_id AND a.cleared IS "
                "NULL) ORDER BY rs.rank",
                (rounds[-1]["id"],),
            )
        )

    def next_action(self) -> str:
        """What the schedule asks for next: ``label``, ``query``, ``train`` or ``done``."""
        if self.pending():
            return "label"
        ck = self.store.latest_checkpoint()
        epoch = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch":
            return "train"  # a training segment was interrupted
        plan = self.plan()
        r = len(self.store.active_rounds()) + 1
        if r <= len(plan) and plan[r - 1]["epoch"] <= epoch:
            return "query"
        return "train" if epoch < self.cfg.train.epochs else "done"

    def _set_mode(self, mode: str) -> None:
        current = self.store.get_meta("mode")
        if current is not None and current != mode:
            raise StoreError(
                f"this project is a {current} run; it cannot take {mode} labels"
                + (
                    f" (continue it with {how('eada train --simulate', 'project.run_simulated()')})"
                    if current == "simulated"
                    else ""
                )
            )
        if current is None:
            self.store.set_meta("mode", mode)

    def _measured(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Metrics without any accuracy computed from labels nobody gave (unlabeled target)."""
        return metrics if self.target_labeled else hide_guessed_accuracy(metrics)

    def _measured_line(self, line: str) -> str:
        return line if self.target_labeled else hide_guessed_accuracy(line)
