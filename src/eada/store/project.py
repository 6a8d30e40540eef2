"""Annotation rounds on a project store: init, query, label import, train, status, export.

One code path for human and simulated labeling. A project follows its config's schedule
(``train.epochs``, ``active.rounds_at``, ``active.budget_per_round``) in steps:

* **train** -- :class:`~eada.train.ActiveDATrainer` trains from the last checkpoint, with every
  label in force, up to the next round's epoch (or the end);
* **query** -- the same trainer's :meth:`~eada.train.ActiveDATrainer.propose` scores the
  unlabeled pool and the strategy selects; the round (scores of the whole pool, selection) is
  recorded and exported as CSV, JSON and Label Studio tasks;
* **label** -- labels come back through :meth:`Project.import_labels` (a human's file) or
  :meth:`Project.label_simulated` (a :class:`~eada.train.SimulatedOracle` revealing ground
  truth); both go through the same validation and the same write.

Each step commits in ONE transaction together with the checkpoint it produced (written first to
a temporary file and moved into place with ``os.replace``; its SHA-256 is recorded), and
training also checkpoints after every epoch, so a process killed at any point resumes from the
last commit: :meth:`Project.run_simulated` continues a killed simulated run and ends with the
same labeled set as an uninterrupted run with the same seed (the same as ``eada run``'s).

:class:`Project` is built by concern, each module on the one before: :mod:`eada.store.base`
(the open store, its domains, the schedule), :mod:`eada.store.checkpoints`,
:mod:`eada.store.labels`, :mod:`eada.store.rounds` (query and export of a round); this module
adds init, training, the simulated driver, status and export. The schema and transactions are
:mod:`eada.store.db`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eada.config import ExperimentConfig, FeatureData
from eada.runs import check_not_store
from eada.store import labelstudio
from eada.store.agreement import (
    VOTE_COLUMNS,
    answers_by_annotator,
    awaiting_answers,
    awaiting_text,
    open_disputes,
    pairwise_agreement,
    vote_rows,
)
from eada.store.attention import needs_attention
from eada.store.checkpoints import crash_point, save_atomic
from eada.store.checkpoints import file_sha256 as _file_sha256
from eada.store.config import (
    SETTABLE,
    StoreOptions,
    absolute_config,
    check_label_studio_root_exists,
    resolved_config,
)
from eada.store.data import confine, default_roots, load_project_data, row_hashes
from eada.store.db import Store, StoreError, check_creatable, how
from eada.store.labelfiles import ImportFileError, csv_safe
from eada.store.labels import ImportValidationError, stamps_on_success
from eada.store.pool import changes_note, scan_target
from eada.store.roots import check_within_roots, label_studio_root
from eada.store.rounds import ProjectRounds
from eada.store.targets import read_unlabeled_features, record_sample_info
from eada.store.unlabeled import (
    accuracy_summary,
    audit_summary,
    class_coverage,
    options_json,
    pool_predictions,
    resolve_target,
)

if TYPE_CHECKING:
    from eada.train import ActiveDATrainer

Progress = Callable[[str], None] | None
MAX_EPOCHS = 1_000_000  # one `eada train --epochs N` segment (epochs are SQLite integers)


def init_project(
    folder: str | Path,
    cfg: ExperimentConfig,
    roots: list[Path] | None = None,
    options: StoreOptions | None = None,
    progress: Progress = None,
) -> Project:
    """Register a project: config, data roots, classes and every source/target/held-out sample
    (content hash; file path for image folders). Everything is loaded and validated (data
    readable, no corrupt image, round plan feasible, every file inside the data roots) before
    the store is created.

    The data roots are the folders the config names plus ``roots`` (``--allow-root``), and
    nothing else: a file that resolves outside them (absolute path, ``..``, symlink) is an
    :class:`~eada.store.roots.OutsideRootsError`. Every root is recorded in the store (the
    ``roots`` table; the allowed ones also in meta ``allowed_roots``).

    Example:
        >>> import tempfile
        >>> from eada.hparams import preset_config
        >>> p = init_project(Path(tempfile.mkdtemp()) / "proj", preset_config("toy"))
        >>> p.status()["n_target"]
        1000
    """
    from eada.train import ActiveDATrainer

    folder = Path(folder)
    check_creatable(folder)  # a half-made store (a killed or failed init) is replaced
    cfg = absolute_config(cfg)  # later commands may run from another folder
    options, labeled = resolve_target(cfg, options)
    task, paths, info = load_project_data(cfg, labeled, progress)
    ActiveDATrainer(cfg, task)  # validates domains and the round plan before any write
    allowed = [Path(r).absolute().resolve() for r in roots or []]
    all_roots = [Path(r).resolve() for r in default_roots(cfg)] + allowed
    for r in all_roots:
        if not r.is_dir():
            raise FileNotFoundError(f"data root not found: {r}")
    check_within_roots(paths, all_roots)  # the store never widens its roots by itself
    label_studio_root(all_roots, options.label_studio_root)  # refuses an unsafe one early
    rows: list[tuple[str, str, int, str | None, str]] = []
    domains = [("source", task.source), ("target", task.target)]
    if task.heldout is not None:
        domains.append(("heldout", task.heldout))
    for role, dom in domains:
        files = paths.get(role)
        if files is not None:
            for i, p in enumerate(files):
                rp = confine(Path(p).absolute(), all_roots)  # relative to the working dir
                rows.append((role, dom.name, i, str(rp), _file_sha256(rp)))
        else:
            rows += [(role, dom.name, i, None, h) for i, h in enumerate(row_hashes(dom))]
    # schema, registration and config in ONE transaction: a failure or a kill leaves no store
    with Store.creating(folder) as store:
        c = store.conn
        store.set_meta(
            "config", json.dumps({**resolved_config(cfg), "store": options_json(options)})
        )
        store.set_meta("eada_version", _eada_version())
        store.set_meta("allowed_roots", json.dumps([str(r) for r in dict.fromkeys(allowed)]))
        c.executemany(
            "INSERT INTO roots (path) VALUES (?)", [(str(r),) for r in dict.fromkeys(all_roots)]
        )
        c.executemany(
            "INSERT INTO classes (id, name) VALUES (?, ?)", list(enumerate(task.target.classes))
        )
        c.executemany(
            "INSERT INTO samples (role, domain, position, path, content_hash) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        record_sample_info(c, [r["id"] for r in store.samples("target")], info)
        stats = target_statistics(cfg, labeled)
        if stats is not None:  # frozen: rows a scan adds later never change these
            store.set_meta("target_statistics", json.dumps(stats))
        crash_point("init:before_commit")
    return Project(folder, store=store, task=task)


def target_statistics(cfg: ExperimentConfig, labeled: bool) -> dict[str, Any] | None:
    """The normalisation statistics of an unlabeled feature-row target's rows
    (:func:`eada.data.features.domain_statistics`), which a project store freezes at init;
    ``None`` for any other target."""
    from eada.data.features import domain_statistics

    data: Any = cfg.data
    if labeled or not isinstance(data, FeatureData):
        return None
    x, _ = read_unlabeled_features(Path(data.target), data.features_key)
    return domain_statistics(x, data.normalize)


class Project(ProjectRounds):
    """An existing project store, with the operations of the ``eada`` commands.

    Args:
        folder: the project folder.
        store: an already open :class:`Store` (internal).
        task: already loaded domains (internal; otherwise loaded and checked on first use).
    """

    @stamps_on_success
    def train(
        self, epochs: int | None = None, progress: Progress = None, partial: bool = False
    ) -> dict[str, Any]:
        """Train with every label in force: from the last checkpoint up to the next round's
        epoch (or the end of the schedule), or ``epochs`` more epochs. An interrupted training
        segment continues from its last epoch checkpoint. ``partial``: the last round still
        awaits some answers; train with the labels it has so far up to the next round's epoch
        (the rest stay pending). A store connected to Label Studio pulls its annotations
        first. Returns the segment's measurements."""
        self.store.check_writable()
        if labelstudio.connection(self) is not None:
            got = labelstudio.pull(self)
            if progress is not None:
                still = awaiting_text(got.get("awaiting") or [], self.options.answers_needed)
                progress(
                    f"pulled from Label Studio: {got['new']} new, {got['corrections']} "
                    f"corrections, {got['skipped']} skipped, {got['unchanged']} unchanged"
                    + (f", {still}" if still else "")
                )
        self.check_labeled_files()
        self.export_missing()  # a round recorded by a killed command gets its files
        ck = self.store.latest_checkpoint()
        e0 = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch" and epochs is None:
            start, end = ck["segment_start"], ck["segment_end"]
            state = self.load_checkpoint(ck)
            return self._train_segment(start, end, state, resume=True, progress=progress)
        if epochs is not None:
            if epochs < 1:
                raise ValueError(f"--epochs must be >= 1, got {epochs}")
            if epochs > MAX_EPOCHS:
                raise ValueError(
                    f"--epochs {epochs} is more than {MAX_EPOCHS:,} epochs in one segment; "
                    "train in steps of at most that"
                )
            end = e0 + epochs
        else:
            action = self.next_action()
            rounds = self.store.active_rounds()  # audit rounds are outside the schedule
            if action == "label" and not partial:
                c = self.round_counts(rounds[-1]["id"])
                n_disputed = len(open_disputes(self.store.conn))
                disputed = (
                    f"; {n_disputed} disputed by their annotators (listed by "
                    f"{how('eada status', 'project.status()')}; `store.conflicts` settles them)"
                    if n_disputed
                    else ""
                )
                waiting = awaiting_answers(self.store.conn, self.options.answers_needed)
                more = awaiting_text(waiting, self.options.answers_needed)
                answer = (
                    "label them in Label Studio, then pull with "
                    f"{how('eada labelstudio pull', 'eada.store.labelstudio.pull(project)')}"
                    if labelstudio.connection(self) is not None
                    else "import labels or skips with "
                    f"{how('eada label import FILE', 'project.import_labels(FILE)')} (a `skip` "
                    "column marks a sample unusable)"
                )
                raise StoreError(
                    f"round {rounds[-1]['number']} awaits an answer for {c['pending']} of its "
                    f"{c['selected']} samples ({c['labeled']} labeled, {c['skipped']} skipped"
                    f"{'; ' + more if more else ''}{disputed}): {answer}, "
                    "or train with the labels so far: "
                    f"{how('eada train --partial', 'project.train(partial=True)')} (or "
                    f"{how('eada train --epochs N', 'project.train(epochs=N)')})"
                )
            if action == "label":  # partial: train up to the round after the open one
                plan = self.plan()
                r = len(rounds) + 1
                end = plan[r - 1]["epoch"] if r <= len(plan) else self.cfg.train.epochs
                if end <= e0:
                    c = self.round_counts(rounds[-1]["id"])
                    raise StoreError(
                        f"the model has trained {e0} epochs, as far as the schedule goes before "
                        f"round {rounds[-1]['number']} is answered ({c['pending']} pending, "
                        f"{c['labeled']} labeled, {c['skipped']} skipped): label or skip the "
                        "pending samples (or pass --epochs N)"
                    )
                start_state = self.load_checkpoint(ck) if ck is not None else None
                return self._train_segment(e0, end, start_state, resume=False, progress=progress)
            if action == "query":
                raise StoreError(
                    f"the model has trained {e0} epochs, the schedule's next round is due: "
                    f"run {how('eada query', 'project.query()')} (or train anyway with "
                    f"{how('eada train --epochs N', 'project.train(epochs=N)')})"
                )
            if action == "done":
                raise StoreError(
                    f"the schedule ({self.cfg.train.epochs} epochs) is complete; "
                    f"train more with {how('eada train --epochs N', 'project.train(epochs=N)')}"
                )
            plan = self.plan()
            r = len(rounds) + 1
            end = plan[r - 1]["epoch"] if r <= len(plan) else self.cfg.train.epochs
        start_state = self.load_checkpoint(ck) if ck is not None else None
        return self._train_segment(e0, end, start_state, resume=False, progress=progress)

    def _train_segment(
        self, start: int, end: int, state: dict[str, Any] | None, resume: bool, progress: Progress
    ) -> dict[str, Any]:
        from eada.train import ActiveDATrainer, GateSchedule

        seg_cfg = self.cfg.model_copy(
            update={
                "train": self.cfg.train.model_copy(update={"epochs": end - start}),
                "active": self.cfg.active.model_copy(update={"rounds_at": []}),
            }
        )
        latest = self.store.latest_checkpoint()
        expected = [None if latest is None else latest["id"]]  # what this segment builds on

        def check_unchanged() -> None:  # inside the recording transaction
            now_ck = self.store.latest_checkpoint()
            if (None if now_ck is None else now_ck["id"]) != expected[0]:
                raise StoreError(
                    f"another process recorded checkpoint {now_ck['path'] if now_ck else None} "
                    "while this training ran; this one records nothing more: see "
                    + how("eada status", "project.status()")
                )

        def checkpoint(event: str, tr: ActiveDATrainer, info: dict[str, Any]) -> None:
            if event != "epoch_end" or info["epoch"] == end - start:
                return
            epoch = start + info["epoch"]
            rel, sha = self._write_checkpoint(tr.state_dict(), "epoch", epoch)
            crash_point(f"epoch_end:{epoch}")
            with self._unused_if_failed(rel), self.store.transaction() as c:
                check_unchanged()
                expected[0] = self._record_checkpoint(
                    c,
                    rel,
                    sha,
                    "epoch",
                    epoch,
                    (start, end),
                    int(tr.labeled_mask.sum()),
                    {"epoch": epoch, **self._measured(info.get("metrics", {}))},
                )

        trainer = ActiveDATrainer(seg_cfg, self.task, callbacks=[checkpoint])
        trainer.gate_schedule = GateSchedule(  # the gates count over the whole schedule
            epochs_before=start,
            epochs=self.cfg.train.epochs,
            planned_labels=sum(p["budget"] for p in self.plan()),
        )
        if state is not None:
            trainer.load_state_dict(state, progress=resume)
        if not resume:
            trainer.set_labels(*self._labels_tensor())

        def prog(msg: str) -> None:
            if progress is not None:
                progress(f"[epochs {start}->{end}] {self._measured_line(msg)}")

        result = trainer.run(progress=prog)
        last = self._measured(result.final["last_epoch"])
        rel, sha = self._write_checkpoint(trainer.state_dict(), "train", end)
        crash_point("train:before_commit")
        with self._unused_if_failed(rel), self.store.transaction() as c:
            check_unchanged()
            self._record_checkpoint(
                c,
                rel,
                sha,
                "train",
                end,
                (start, end),
                int(trainer.labeled_mask.sum()),
                {**last, "epoch": end},
            )
        return {
            "from_epoch": start,
            "epoch": end,
            "n_labeled": int(trainer.labeled_mask.sum()),
            "metrics": last,
            "warnings": result.warnings,  # e.g. the L_fea runaway, found over all segments
        }

    def run_simulated(self, progress: Progress = None) -> dict[str, Any]:
        """Follow the schedule to its end with a simulated oracle: train, query, label, ...
        Resumes wherever a killed run stopped."""
        if not self.target_labeled:
            self.label_simulated()  # raises: an unlabeled target has nothing to reveal
        if self.store.get_meta("mode") == "human":
            raise StoreError("this project has human labels; --simulate runs on a fresh project")
        with self.store.transaction():
            self._set_mode("simulated")
        while (action := self.next_action()) != "done":
            if action == "train":
                self.train(progress=progress)
            elif action == "query":
                out = self.query(export=False, mode="simulated")
                if progress is not None:
                    progress(
                        f"round {out['round']}: selected {out['selected']} at epoch {out['epoch']}"
                    )
            else:
                self.label_simulated()
        return self.status()

    def scan_target(self, progress: Progress = None) -> dict[str, Any]:
        """``eada target scan``: register the files added to an unlabeled image target (or
        the rows with new ids of a feature-row target) and leave out the ones that vanished
        (:func:`eada.store.pool.scan_target`)."""
        return scan_target(self, progress)

    def pool_note(self) -> str | None:
        """A line naming ``eada target scan`` when the target's files changed since they were
        registered (:func:`eada.store.pool.changes_note`), else ``None``."""
        return changes_note(self)

    def status(self) -> dict[str, Any]:
        """Rounds, budget spent and accuracy history."""
        conn = self.store.conn
        n_target = len(self.store.samples("target"))
        rounds = []
        for r in self.store.rounds():
            rounds.append(
                {
                    "round": r["number"],
                    "epoch": r["epoch"],
                    "strategy": r["strategy"],
                    **self.round_counts(r["id"]),
                    "near_duplicates": json.loads(r["info"]).get("near_duplicates", []),
                }
            )
        labels = self.store.current_labels()
        skips = self.store.current_skips()
        by_reason: dict[str, int] = {}
        for sk in skips:
            by_reason[sk["skip_reason"]] = by_reason.get(sk["skip_reason"], 0) + 1
        by_annotator: dict[str, dict[str, int]] = {}
        for a in self.store.answers():
            who = by_annotator.setdefault(a["annotator"], {"labeled": 0, "skipped": 0})
            who["labeled" if a["class_id"] is not None else "skipped"] += 1
        n_fix = conn.execute("SELECT COUNT(*) FROM labels WHERE supersedes IS NOT NULL").fetchone()[
            0
        ]
        history = []
        for ck in self.store.checkpoints():
            if ck["kind"] == "query" or ck["metrics"] is None:
                continue
            m = json.loads(ck["metrics"])
            entry = {"epoch": ck["epoch"], "n_labeled": ck["n_labeled"], "kind": ck["kind"]}
            for split in ("target", "heldout"):
                if isinstance(m.get(split), dict):
                    entry[f"{split}_accuracy"] = m[split]["accuracy"]
            history.append(entry)
        last = self.store.latest_checkpoint()
        return {
            "mode": self.store.get_meta("mode") or "new",
            "n_target": n_target,
            "n_labeled": len(labels),
            "budget_spent_percent": 100.0 * len(labels) / n_target,
            "corrections": n_fix,
            "n_skipped": len(skips),
            "skipped_by_reason": dict(sorted(by_reason.items())),
            "annotators": dict(sorted(by_annotator.items())),
            "by_source": {
                s: sum(1 for r in labels if r["source"] == s) for s in ("human", "simulated")
            },
            "epoch": 0 if last is None else last["epoch"],
            "rounds": rounds,
            "history": history,
            "accuracy": accuracy_summary(self, history),
            "disputes": open_disputes(conn),
            "needs_attention": needs_attention(conn),
            "answers_needed": self.options.answers_needed,
            "awaiting": awaiting_answers(conn, self.options.answers_needed),
            "answers_by_annotator": answers_by_annotator(conn),
            "agreement": pairwise_agreement(conn),
            "conflicts": {
                "policy": self.options.conflicts,
                "tie": self.options.conflict_tie,
                "reviewer": self.options.reviewer,
            },
            "audit": audit_summary(conn),
            "coverage": class_coverage(conn),
            "pool_predicted": pool_predictions(conn),
            "pool": {
                "left_out": conn.execute(
                    "SELECT COUNT(*) FROM samples WHERE role = 'target' AND position < 0"
                ).fetchone()[0],
                "scans": self.store.get_json("target_scans") or [],
            },
            "next": self.next_action(),
            "read_only": self.store.readonly,
            # the file's older schema version when this read-only store was upgraded in memory
            "upgraded_in_memory_from": self.store.upgraded_in_memory,
        }

    SETTABLE = tuple(SETTABLE)  # eada.store.config.SETTABLE: one entry a setting

    def set_options(self, updates: dict[str, Any], yes: bool = False) -> dict[str, Any]:
        """Change keys of the project's ``store:`` section after ``eada init`` (``eada config
        set``; the keys of :data:`eada.store.config.SETTABLE`): ``conflicts``,
        ``conflict_tie``, ``reviewer``, ``label_studio_root`` (every target image must lie
        under it), ``near_duplicate_threshold``, ``answers_needed``. Validated as at init; a new
        conflicts policy (or fewer answers needed) settles the open disputes (and the samples
        awaiting answers) it can at once.

        A change of ``conflicts``, ``conflict_tie``, ``reviewer`` or ``answers_needed``
        re-settles, in the same transaction, every sample whose annotators disagree
        (``_write_labels(resettle=True)``): the result's ``settled["changed"]`` lists every
        label that changed. A change that would overwrite a reviewer's decision, or more than
        :data:`CONFIRM_SHARE` of the settled labels (those in force on samples not disputed),
        is refused unless ``yes`` (nothing is written; the error lists the changes).

        Read, validate, write and settle are ONE write transaction (``BEGIN IMMEDIATE``): two
        processes changing different keys at once both keep theirs, and nothing changes when
        the new section is invalid.

        Returns:
            ``store``: the new section; ``settled``: the import result of the settling;
            ``warnings``: e.g. a ``reviewer`` who has never answered a sample (still set).

        Raises:
            ConfigError: a key that may not change after init, or an invalid value.
        """
        from eada.config import ConfigError
        from eada.store.config import split_store_section

        self.store.check_writable()
        bad = sorted(set(updates) - set(self.SETTABLE))
        if bad:
            settable = ", ".join(f"store.{k}" for k in self.SETTABLE)
            if bad[0] in StoreOptions.model_fields:
                raise ConfigError(
                    f"store.{bad[0]} cannot change after `eada init`; settable: {settable}"
                )
            raise ConfigError(
                f"store.{bad[0]} is not a store setting (unknown key); settable: {settable}"
            )
        with self.store.transaction():  # the config is read under the write lock
            raw = self.store.get_json("config") or {}
            section = {**(raw.get("store") or {}), **updates}
            _, options = split_store_section({"store": section})  # an absolute folder
            if "label_studio_root" in updates:
                check_label_studio_root_exists(options)
            if options.label_studio_root is not None:
                root = label_studio_root([], options.label_studio_root)
                assert root is not None
                outside = [
                    r["path"]
                    for r in self.store.samples("target")
                    if r["path"] and root not in Path(r["path"]).parents
                ]
                if outside:
                    raise ConfigError(
                        f"store.label_studio_root {root}: {len(outside)} target image(s) lie "
                        f"outside it (first: {outside[0]}); name a folder that holds them all"
                    )
            self.store.set_meta(
                "config", json.dumps({**raw, "store": options_json(options)}, default=str)
            )
            self.options = options
            n_settled = self.store.conn.execute(
                "SELECT COUNT(*) FROM labels l WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE "
                "n.supersedes = l.id) AND NOT EXISTS (SELECT 1 FROM disputes d WHERE "
                "d.sample_id = l.sample_id AND d.resolved IS NULL)"
            ).fetchone()[0]
            settled = self._write_labels(  # in this transaction: the policy just written
                [],
                "(store.conflicts changed)",
                "",
                "policy",
                "config",
                "human",
                False,
                resettle=bool(set(updates) & set(POLICY_KEYS)),
            )
            over = [ch for ch in settled["changed"] if ch["old"] is not None]
            undisputed = [ch for ch in over if not ch["was_disputed"]]
            reviewed = [ch for ch in over if "reviewer" in str(ch["old_decided"] or "")]
            if not yes and (reviewed or len(undisputed) > CONFIRM_SHARE * n_settled):
                from eada.store.agreement import change_line

                why = (
                    f"it would overwrite {len(reviewed)} reviewer decision(s)"
                    if reviewed
                    else f"it would change {len(undisputed)} of the {n_settled} settled labels "
                    f"(more than {CONFIRM_SHARE:.0%})"
                )
                shown = "; ".join(change_line(ch) for ch in settled["changed"][:20])
                more = len(settled["changed"]) - 20
                raise ConfirmationNeeded(
                    f"store.{', store.'.join(updates)} not changed: {why}: {shown}"
                    + (f"; and {more} more" if more > 0 else "")
                    + ". Nothing was written; to apply it, run it again with "
                    + how("--yes", "yes=True")
                )
            warnings = []
            if "reviewer" in updates and options.reviewer is not None:
                who = options.reviewer
                answered = self.store.conn.execute(
                    "SELECT 1 FROM votes WHERE annotator = ? UNION ALL "
                    "SELECT 1 FROM labels WHERE annotator = ? LIMIT 1",
                    (who, who),
                ).fetchone()
                if answered is None:
                    names = [
                        str(r[0])
                        for r in self.store.conn.execute(
                            "SELECT DISTINCT annotator FROM votes ORDER BY annotator LIMIT 9"
                        )
                    ]
                    seen = ", ".join(repr(n) for n in names[:8])
                    seen += " ..." if len(names) > 8 else ""
                    warnings.append(
                        f"store.reviewer {who!r} has not answered any sample yet (set anyway; "
                        f"annotators so far: {seen or 'none'}): their answers count once imports "
                        "name them so (--annotator NAME, label-studio:EMAIL)"
                    )
        return {"store": options_json(options), "settled": settled, "warnings": warnings}

    def export(self, out: str | Path, force: bool = False) -> dict[str, str]:
        """Write ``labels.csv`` (labels in force), ``labels_history.csv`` (every row,
        corrections and skips included: ``skip`` holds the reason), ``disputes.csv`` (each
        annotator's answer of every open dispute), ``votes.csv`` (every answer of every
        annotator, agreeing ones too: :func:`~eada.store.agreement.vote_rows`),
        ``model.pt`` (the last checkpoint's model weights, a plain ``state_dict``),
        ``model.json`` (config, classes, SHA-256 of ``model.pt``), ``model.onnx`` (the whole
        inference path for ONNX Runtime: raw rows or pixels in, probabilities and energies
        out, class names in its metadata: :func:`~eada.store.exports.onnx_export`; left out
        without the ``fast`` extra) and ``predictions.csv``.

        Everything is read in ONE read transaction (:meth:`Store.snapshot`), so the files
        agree with each other whatever commits meanwhile, then written into a staging folder
        beside ``out`` and moved into place (:func:`~eada.store.exports.write_export`): a
        killed or failed export leaves the previous one whole and no partial file. An ``out``
        that already holds an export is replaced only with ``force``; one holding other files
        never (:func:`~eada.store.exports.check_export_target`)."""
        import csv
        import hashlib
        import io

        import torch

        from eada.store.exports import (
            check_export_target,
            model_meta,
            onnx_export,
            predictions_csv,
            write_export,
        )

        out = Path(out)
        check_not_store(out)  # never the store's own folder or files
        check_export_target(out, force)
        cols = [
            "label_id",
            "sample_id",
            "domain",
            "index",
            "path",
            "label",
            "annotator",
            "source",
            "round",
            "created",
            "supersedes",
            "skip",
        ]
        query = (
            "SELECT l.id AS label_id, l.sample_id, s.domain, s.position AS idx, s.path, "
            "c.name, l.annotator, l.source, r.number AS round, l.created, l.supersedes, "
            "l.skip_reason FROM labels l JOIN samples s ON s.id = l.sample_id LEFT JOIN "
            "classes c ON c.id = l.class_id LEFT JOIN rounds r ON r.id = l.round_id {where} "
            "ORDER BY l.id"
        )
        current = (  # labels in force (skips are in the history, with their reason)
            "WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id) "
            "AND l.class_id IS NOT NULL"
        )
        files: dict[str, bytes] = {}
        with self.store.snapshot() as conn:
            for name, where in (("labels.csv", current), ("labels_history.csv", "")):
                buf = io.StringIO(newline="")
                w = csv.writer(buf, lineterminator="\n")
                w.writerow(cols)
                for row in conn.execute(query.format(where=where)):
                    w.writerow(["" if v is None else csv_safe(v) for v in tuple(row)])
                files[name] = buf.getvalue().encode("utf-8")
            buf = io.StringIO(newline="")
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(["sample_id", "path", "annotator", "answer", "origin", "in_force", "opened"])
            for d in open_disputes(conn):  # one row per annotator of each open dispute
                for who, answer in d["answers"].items():
                    w.writerow(
                        [
                            csv_safe(v)
                            for v in (
                                d["sample_id"],
                                d["path"] or d.get("external_id") or "",
                                who,
                                answer,
                                d["origins"].get(who, ""),
                                d["in_force"] or "",
                                d["opened"],
                            )
                        ]
                    )
            files["disputes.csv"] = buf.getvalue().encode("utf-8")
            buf = io.StringIO(newline="")  # every answer of every annotator, agreeing ones too
            vw = csv.DictWriter(buf, fieldnames=VOTE_COLUMNS, lineterminator="\n")
            vw.writeheader()
            for v in vote_rows(conn):
                vw.writerow({k: "" if x is None else csv_safe(x) for k, x in v.items()})
            files["votes.csv"] = buf.getvalue().encode("utf-8")
            ck = self.store.latest_checkpoint()
            state = self.load_checkpoint(ck) if ck is not None else None  # refused: nothing written
            if ck is not None and state is not None:
                model = io.BytesIO()
                torch.save(state["model"], model)
                files["model.pt"] = model.getvalue()
                meta = {
                    "config": resolved_config(self.cfg),
                    "classes": self.classes,
                    "epoch": ck["epoch"],
                    "n_labeled": ck["n_labeled"],
                    "sha256": hashlib.sha256(files["model.pt"]).hexdigest(),
                    "load": "eada.load_model(FOLDER), or torch.load('model.pt', weights_only=True)",
                    **model_meta(self),
                }
                files["predictions.csv"] = predictions_csv(self, state["model"]).encode("utf-8")
        if "model.pt" in files and state is not None:  # the deployable model, outside the
            # read transaction
            data, info = onnx_export(
                self.cfg,
                self.classes,
                tuple(meta["input_shape"]),
                state["model"],
                meta.get("feature_statistics"),
            )
            if data is not None:
                files["model.onnx"] = data
                info["sha256"] = hashlib.sha256(data).hexdigest()
            meta["onnx"] = info
            files["model.json"] = json.dumps(meta, indent=1, default=str).encode("utf-8")
        return write_export(out, files)


POLICY_KEYS = ("conflicts", "conflict_tie", "reviewer", "answers_needed")
"""The ``store:`` keys whose change re-settles every disagreement at once."""
CONFIRM_SHARE = 0.2
"""``eada config set`` asks for ``--yes`` before it changes more than this share of the
settled labels (or any reviewer's decision)."""


class ConfirmationNeeded(StoreError):
    """A settings change that would rewrite many settled labels (or a reviewer's decision),
    refused until confirmed (``--yes``); nothing was written."""


def _eada_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("eada")
    except metadata.PackageNotFoundError:
        return "unknown"


__all__ = [
    "ImportFileError",
    "ImportValidationError",
    "Project",
    "crash_point",
    "init_project",
    "save_atomic",
]
