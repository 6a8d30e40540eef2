"""Labels into a project store: a human's file, in-memory records or a simulated oracle, all
through one validation (every problem listed, nothing written) and one transaction that writes
the labels in force, corrections superseding older rows."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from eada.store import attention
from eada.store.agreement import (
    SKIP,
    Vote,
    awaiting_answers,
    awaiting_counts,
    decide,
    latest_votes,
    open_disputes,
)
from eada.store.checkpoints import ProjectCheckpoints, crash_point, file_sha256
from eada.store.config import check_annotator
from eada.store.data import check_image, confine, content_hash, shown_name
from eada.store.db import StoreError, how, now, q
from eada.store.labelfiles import LabelItem, read_label_file, records_to_items
from eada.store.unlabeled import external_ids

if TYPE_CHECKING:
    import torch


MAX_ERRORS_SHOWN = 20


class ImportValidationError(ValueError):
    """An import that failed validation; nothing was written. ``problems`` lists every one."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:MAX_ERRORS_SHOWN]
        more = len(problems) - len(shown)
        text = "\n".join(f"  - {p}" for p in shown) + (f"\n  ... and {more} more" if more else "")
        super().__init__(f"{source}: {len(problems)} problem(s), nothing was imported:\n{text}")


def _answer(it: LabelItem, present: bool = False) -> str:
    """``labels it 'bag'`` / ``skips it ('blurred')`` for messages."""
    if it.skip is not None:
        return f"skips it ({it.skip!r})" if present else f"skipped ({it.skip!r})"
    return f"labels it {it.label!r}" if present else f"labeled {it.label!r}"


def _where(conn: sqlite3.Connection, sid: int) -> str:
    row = conn.execute("SELECT path FROM samples WHERE id = ?", (sid,)).fetchone()
    return "" if row is None or row["path"] is None else f" ({row['path']})"


POLICY_DECIDED = ("newest-wins", "majority", "reviewer", "force")
"""How a label decided among disagreeing answers starts (``labels.decided``)."""


def _before_policy(c: sqlite3.Connection, old: sqlite3.Row) -> Vote | None:
    """The answer that was in force before a policy decided among disagreeing answers of
    ``old``'s sample (the newest earlier label of its chain decided without one), when
    ``old`` itself was decided by a policy and that answer differs; else ``None``."""
    if not str(old["decided"] or "").startswith(POLICY_DECIDED):
        return None
    rows = {
        int(r["id"]): r
        for r in c.execute("SELECT * FROM labels WHERE sample_id = ?", (old["sample_id"],))
    }
    prev_id = old["supersedes"]
    while prev_id is not None and int(prev_id) in rows:
        r = rows[int(prev_id)]
        if not str(r["decided"] or "").startswith(POLICY_DECIDED):
            if (r["class_id"], r["skip_reason"]) == (old["class_id"], old["skip_reason"]):
                return None
            return Vote(r["annotator"], r["class_id"], r["skip_reason"], r["created"])
        prev_id = r["supersedes"]
    return None


def _changed_rows(
    c: sqlite3.Connection, changes: list[tuple[Any, ...]], open_ids: set[int]
) -> list[dict[str, Any]]:
    """Each label a write changed: ``{"sample_id", "path", "old", "old_by", "new",
    "new_by", "how", "was_disputed", "old_decided"}`` (answers as class names or
    ``(skip)``; ``old`` None for a first label)."""
    names = {int(r[0]): str(r[1]) for r in c.execute("SELECT id, name FROM classes")}

    def shown(class_id: Any) -> str:
        return SKIP if class_id is None else names[int(class_id)]

    out = []
    for sid, w, old, _, decided in changes:
        row = c.execute("SELECT path FROM samples WHERE id = ?", (sid,)).fetchone()
        out.append(
            {
                "sample_id": sid,
                "path": None if row is None else row["path"],
                "old": None if old is None else shown(old["class_id"]),
                "old_by": None if old is None else old["annotator"],
                "old_decided": None if old is None else old["decided"],
                "new": shown(w.class_id),
                "new_by": w.annotator,
                "how": decided,
                "was_disputed": sid in open_ids,
            }
        )
    return out


_F = TypeVar("_F", bound=Callable[..., Any])


def stamps_on_success(method: _F) -> _F:
    """A store command (``train``, ``query``, ``audit``) that records the file stamps its
    :meth:`ProjectLabels.check_labeled_files` found unchanged only when it succeeds."""

    @functools.wraps(method)
    def run(self: ProjectLabels, *args: Any, **kwargs: Any) -> Any:
        self._fresh_stamps = None
        out = method(self, *args, **kwargs)
        self.save_file_stamps()
        return out

    return cast(_F, run)


class ProjectLabels(ProjectCheckpoints):
    """A project store's labels (see :class:`~eada.store.project.Project`)."""

    def _n_label_rows(self) -> int:
        return int(self.store.conn.execute("SELECT COUNT(*) FROM labels").fetchone()[0])

    def check_labeled_files(self) -> None:
        """Refuse to train or query on a labeled image whose file changed since it was
        registered (a photo overwritten under the same name would train its old label on new
        pixels): a ``stat`` a file (size, mtime), the SHA-256 only where those moved; the
        stamps of files found unchanged are kept (meta ``file_stamps``) so the next check is
        a ``stat`` again.

        Raises:
            StoreError: naming how many labeled files changed, the first ones and what to do.
        """
        self._fresh_stamps: dict[str, list[int]] | None = None
        rows = [
            r
            for r in self.store.conn.execute(
                "SELECT s.id, s.path, s.content_hash, c.name AS class_name FROM labels l "
                "JOIN samples s ON s.id = l.sample_id JOIN classes c ON c.id = l.class_id "
                "WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id) "
                "AND s.path IS NOT NULL AND s.position >= 0"
            )
        ]
        if not rows:
            return
        stamps: dict[str, list[int]] = self.store.get_json("file_stamps") or {}
        fresh: dict[str, list[int]] = {}
        changed: list[str] = []
        for r in rows:
            path = Path(r["path"])
            try:
                st = path.stat()
            except OSError:
                continue  # a vanished file: `eada target scan` leaves it out (the pool note)
            stamp = [st.st_size, st.st_mtime_ns]
            if stamps.get(str(r["id"])) == stamp:
                fresh[str(r["id"])] = stamp
                continue
            if file_sha256(path) == r["content_hash"]:
                fresh[str(r["id"])] = stamp
            else:
                changed.append(f"{path} (sample {r['id']}, labeled {r['class_name']!r})")
        if changed:
            shown = "; ".join(changed[:5]) + (
                f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
            )
            raise StoreError(
                f"{len(changed)} labeled image(s) changed since they were registered: {shown}. "
                "Their labels would train on other pixels: put the original files back, or "
                "save a new photo under a new name (`eada target scan` registers it as a new "
                "sample; a removed file is left out of the pool)"
            )
        self._fresh_stamps = fresh if fresh != stamps and not self.store.readonly else None

    def save_file_stamps(self) -> None:
        """Record the stamps :meth:`check_labeled_files` found unchanged, once the command it
        checked for has succeeded (:func:`stamps_on_success`): a refused command writes
        nothing."""
        fresh = getattr(self, "_fresh_stamps", None)
        self._fresh_stamps = None
        if fresh is not None:
            with self.store.transaction():
                self.store.set_meta("file_stamps", json.dumps(fresh, sort_keys=True))

    def _labels_tensor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The labels training uses: every label in force but those of audit samples (kept
        out so that the audit stays an unbiased sample the model never saw a label of) and of
        samples that need attention (an annotator's answer could not be used)."""
        import torch

        audit = self.store.audit_sample_ids()
        held = attention.open_ids(self.store.conn)  # an unusable answer: kept out until fixed
        rows = [
            r
            for r in self.store.current_labels()
            if r["sample_id"] not in audit
            and r["sample_id"] not in held
            and r["position"] >= 0  # < 0: the file vanished
        ]
        idx = torch.tensor([r["position"] for r in rows], dtype=torch.long)
        lab = torch.tensor([r["class_id"] for r in rows], dtype=torch.long)
        return idx, lab

    def import_labels(
        self,
        file: str | Path,
        annotator: str = "unknown",
        allow_unqueried: bool = False,
        force: bool = False,
    ) -> dict[str, Any]:
        """Import a CSV/JSON/Label Studio label file: everything is validated first, then
        written in one transaction. A label differing from the one in force is a correction
        (a new row superseding the old); an identical one changes nothing; a ``skip`` marks
        the sample unusable (a later label undoes it). An answer contradicting ANOTHER
        annotator's label in force is settled by ``store.conflicts`` (under ``refuse``, the
        default, it opens a dispute and that label stays in force; the rest is imported)
        unless ``force`` (the newest answer wins)."""
        self.store.check_writable()
        if self.store.get_meta("mode") == "simulated":
            self._set_mode("human")  # raises: a simulated run takes no human labels
        path = Path(file)
        fmt, items, digest = read_label_file(path)
        return self._write_labels(
            items,
            shown_name(path),
            digest,
            fmt,
            annotator,
            "human",
            allow_unqueried,
            force,
        )

    def import_records(
        self,
        records: list[Any],
        annotator: str = "notebook",
        allow_unqueried: bool = False,
        force: bool = False,
    ) -> dict[str, Any]:
        """Import labels from in-memory records (see :func:`eada.api.import_labels`), with
        the same validation and write as a file import."""
        self.store.check_writable()
        if self.store.get_meta("mode") == "simulated":
            self._set_mode("human")  # raises: a simulated run takes no human labels
        items = records_to_items(records)
        raw = json.dumps(records, sort_keys=True, default=str).encode()
        return self._write_labels(
            items,
            "(records)",
            content_hash(raw),
            "records",
            annotator,
            "human",
            allow_unqueried,
            force,
        )

    def label_simulated(self) -> dict[str, Any]:
        """Label the open round's pending samples with ground truth (a
        :class:`~eada.train.SimulatedOracle`), through the same validation and write as an
        import."""
        from eada.train import SimulatedOracle

        if not self.target_labeled:
            raise StoreError(
                "the target of this project is unlabeled: a simulated oracle has no labels to "
                f"reveal (label the queried samples with "
                f"{how('eada label import FILE', 'project.import_labels(FILE)')})"
            )
        pending = self.pending()
        oracle = SimulatedOracle(self.task.target.y)
        truth = oracle.label(np.array([p["position"] for p in pending], dtype=np.int64))
        items = [
            LabelItem(f"sample {p['sample_id']}", self.classes[int(y)], p["sample_id"])
            for p, y in zip(pending, truth, strict=True)
        ]
        return self._write_labels(
            items, "(simulated oracle)", "", "simulated", "simulated-oracle", "simulated", False
        )

    def _write_labels(
        self,
        items: list[LabelItem],
        source_name: str,
        sha: str,
        fmt: str,
        annotator: str,
        source: str,
        allow_unqueried: bool,
        force: bool = False,
        resettle: bool = False,
    ) -> dict[str, Any]:
        """Validate ``items`` (every problem listed, nothing written), then in one transaction
        record each annotator's answer as a vote and settle each sample by the project's
        ``store.conflicts`` policy (:func:`eada.store.agreement.decide`): the winner becomes
        the label in force; a sample nobody wins is disputed (listed in the result's
        ``disputes``) and keeps what it had (an answer that contradicts another annotator's
        label in force opens a dispute; the rest of the import is written). ``force``: the
        newest answer wins (this import's).

        Under ``store.answers_needed`` N > 1, a sample without an answer in force counts as
        answered only once N annotators have answered it (agreeing, or settled by the
        policy); until then it is *awaiting* (the result's ``awaiting``: how many more
        answers each needs) and stays pending. ``force`` and the simulated oracle do not
        wait.

        ``resettle`` (a policy just changed: ``eada config set``): every sample whose
        annotators' newest answers disagree is settled again under the policy in force; where
        it settles none, the sample is disputed and a label that a policy had put in force
        gives way to the one it replaced (so setting the previous policy again restores its
        labels). The result's ``changed`` lists every label that changed (sample, old answer
        and who gave it, new answer, who, and how it was decided); ``opened`` the disputes
        opened."""
        check_annotator(annotator)
        problems: list[str] = []
        conn = self.store.conn
        class_id = {n: i for i, n in enumerate(self.classes)}
        roots = self.store.roots()
        chosen: dict[int, dict[str, tuple[LabelItem, int | None]]] = {}
        unusable: dict[tuple[int, str], list[tuple[LabelItem, str]]] = {}
        by_external = external_ids(conn) if any(it.external_id for it in items) else {}
        for it in items:
            sample = None
            if it.external_id is not None and (it.sample_id is not None or it.path is not None):
                if it.external_id not in by_external:
                    problems.append(f"{it.where}: unknown external_id {it.external_id!r}")
                    continue
            if it.sample_id is None and it.path is None and it.external_id is not None:
                if it.external_id not in by_external:
                    problems.append(f"{it.where}: unknown external_id {it.external_id!r}")
                    continue
                it.sample_id = by_external[it.external_id]
            if it.sample_id is not None:
                sample = conn.execute(
                    "SELECT * FROM samples WHERE id = ?", (it.sample_id,)
                ).fetchone()
                if sample is None:
                    problems.append(f"{it.where}: unknown sample id {it.sample_id}")
                    continue
            if it.path is not None:
                try:
                    rp = confine(it.path, roots)
                except ValueError as err:
                    problems.append(f"{it.where}: {err}")
                    continue
                by_path = conn.execute(
                    "SELECT * FROM samples WHERE path = ?", (str(rp),)
                ).fetchone()
                if by_path is None:
                    problems.append(f"{it.where}: path {it.path} is not a registered sample")
                    continue
                if sample is not None and sample["id"] != by_path["id"]:
                    problems.append(
                        f"{it.where}: sample id {it.sample_id} and path {it.path} name different "
                        f"samples ({sample['id']} vs {by_path['id']})"
                    )
                    continue
                sample = by_path
            assert sample is not None
            if it.external_id is not None and by_external.get(it.external_id) != sample["id"]:
                problems.append(
                    f"{it.where}: external_id {it.external_id!r} names sample "
                    f"{by_external.get(it.external_id)}, but "
                    + (f"sample_id {it.sample_id}" if it.path is None else f"path {it.path}")
                    + f" names sample {sample['id']}: fix one of them"
                )
                continue
            if sample["role"] != "target":
                problems.append(
                    f"{it.where}: sample {sample['id']} is a {sample['role']} sample; only "
                    "target samples take labels"
                )
                continue
            who = it.annotator or annotator
            try:
                check_annotator(who, f"{it.where}: annotator")
            except ValueError as err:
                problems.append(str(err))
                continue
            sid = int(sample["id"])
            k: int | None = None
            if it.problem is not None:  # an answer that cannot be used (empty submission)
                unusable.setdefault((sid, who), []).append((it, it.problem))
                continue
            if it.label is not None:
                if it.label not in class_id:
                    # an unusable answer: this sample needs attention, the rest imports
                    known = ", ".join(self.classes[:12])
                    known += " ..." if len(self.classes) > 12 else ""
                    unusable.setdefault((sid, who), []).append(
                        (it, f"unknown class name {it.label!r} (known: {known})")
                    )
                    continue
                k = class_id[it.label]
            prev = chosen.get(sid, {}).get(who)
            if prev is not None and (prev[1], prev[0].skip) != (k, it.skip):
                why = (
                    f"{_answer(prev[0])} ({prev[0].where}) and {_answer(it)} ({it.where}): "
                    "conflicting duplicates of one annotator"
                )
                unusable.setdefault((sid, who), []).extend([(prev[0], why), (it, why)])
                continue
            chosen.setdefault(sid, {})[who] = (it, k)
        for sid, who in unusable:  # none of an annotator's answers with a problem is used
            chosen.get(sid, {}).pop(who, None)
            if sid in chosen and not chosen[sid]:
                del chosen[sid]
        quarantined = [
            self._problem(sid, who, got, source_name, fmt) for (sid, who), got in unusable.items()
        ]
        for sid, by_who in chosen.items():
            s = conn.execute("SELECT * FROM samples WHERE id = ?", (sid,)).fetchone()
            labeled = [(it, k) for it, k in by_who.values() if k is not None]
            if s["path"] is not None and labeled:  # a skip may name an unreadable image
                problems += self._check_file(s, labeled[0][0].where)
        if problems:
            raise ImportValidationError(source_name, problems)
        n_new = n_fix = n_same = 0
        stamp = now()
        # Everything that another writer can change (rounds, the labels in force, the votes,
        # the mode, the conflicts policy) is read inside the transaction that writes: a
        # concurrent import waits for this one and sees its labels, so two labels are never
        # in force for one sample, and the policy applied is the one in force at the commit
        # (a `config set` that committed while this import read its file is applied).
        with self.store.transaction() as c:
            opts = self.current_options()
            policy = "newest-wins" if force else opts.conflicts
            needed = 1 if force or source == "simulated" else opts.answers_needed
            open_ids = {
                int(r[0])
                for r in c.execute("SELECT sample_id FROM disputes WHERE resolved IS NULL")
            }
            waiting = awaiting_counts(c)  # answered by too few so far (answers_needed)
            disagreeing: set[int] = set()
            if resettle:  # a policy changed: every sample whose annotators disagree
                disagreeing = {
                    sid
                    for sid, vs in latest_votes(c).items()
                    if len({(v.class_id, v.skip) for v in vs}) > 1
                }
            touched = sorted(set(chosen) | open_ids | set(waiting) | disagreeing)
            round_of: dict[int, int] = {}
            if touched:
                q = ",".join("?" * len(touched))
                for row in c.execute(
                    f"SELECT rs.sample_id, MAX(rs.round_id) AS round_id FROM round_samples rs "
                    f"WHERE rs.rank IS NOT NULL AND rs.sample_id IN ({q}) GROUP BY rs.sample_id",
                    touched,
                ):
                    round_of[row["sample_id"]] = row["round_id"]
            problems = [
                f"{next(iter(by_who.values()))[0].where}: sample {sid} was never queried (pass "
                "--allow-unqueried to label it anyway)"
                for sid, by_who in chosen.items()
                if sid not in round_of and not allow_unqueried
            ]
            if problems:
                raise ImportValidationError(source_name, problems)
            current = {r["sample_id"]: r for r in self.store.answers()}
            prior = latest_votes(c, touched)
            changes: list[tuple[int, Vote, Any, LabelItem | None, str]] = []
            new_votes: list[tuple[int, str, LabelItem, int | None]] = []
            opened: list[int] = []
            settled: dict[int, str] = {}
            n_skip = n_unskip = n_forced = n_policy = 0
            for sid in touched:
                votes = {v.annotator: v for v in prior.get(sid, [])}
                old = current.get(sid)
                if old is not None and old["annotator"] not in votes:
                    votes[old["annotator"]] = Vote(
                        old["annotator"], old["class_id"], old["skip_reason"], old["created"]
                    )
                incoming = chosen.get(sid, {})
                for seq, (who, (it, k)) in enumerate(incoming.items()):
                    had = votes.get(who)
                    if had is None or (had.class_id, had.skip) != (k, it.skip):
                        new_votes.append((sid, who, it, k))
                        votes[who] = Vote(who, k, it.skip, stamp, 10**12 + seq, it.where)
                    # an answer given again unchanged (every pull sends it) keeps its own
                    # time: it is not newer than an answer given since
                if sid not in open_ids:
                    # what stands (no dispute) stays unless an answer of this import differs
                    asked = {(k, it.skip) for it, k in incoming.values()}
                    standing = None if old is None else (old["class_id"], old["skip_reason"])
                    if asked == {standing} or (old is None and len(asked) == 1 and needed == 1):
                        votes = {w: v for w, v in votes.items() if w in incoming}
                    if old is None and len(votes) < needed:
                        continue  # awaiting more answers: no label, no dispute yet
                winner, how_ = decide(
                    list(votes.values()), policy, opts.conflict_tie, opts.reviewer
                )
                if winner is None:  # a dispute: the answer in force (if any) stays
                    if sid not in open_ids:
                        opened.append(sid)
                    back = None
                    if resettle and old is not None:
                        back = _before_policy(c, old)
                    if back is not None and old is not None:  # the replaced label comes back
                        changes.append(
                            (sid, back, old, None, f"{how_}: back to before {old['decided']}")
                        )
                        n_fix += 1
                    continue
                if sid in open_ids:
                    settled[sid] = how_  # an open dispute closes
                if old is not None and (old["class_id"], old["skip_reason"]) == (
                    winner.class_id,
                    winner.skip,
                ):
                    if sid in chosen:
                        n_same += 1
                    continue
                if how_ != "agreed" and sid not in open_ids:
                    n_policy += 1  # a new disagreement the policy settled at once
                it_w = incoming.get(winner.annotator, (None, None))[0]
                if (
                    old is not None
                    and old["class_id"] is not None
                    and old["annotator"] != winner.annotator
                    and how_ != "agreed"
                ):
                    n_forced += 1
                if winner.class_id is None:
                    n_skip += 1
                elif old is None:
                    n_new += 1
                elif old["class_id"] is None:
                    n_unskip += 1
                else:
                    n_fix += 1
                changes.append((sid, winner, old, it_w, "force" if force else how_))
            cleared = attention.clear(
                c,
                {
                    (sid, who): it.where
                    for sid, by_who in chosen.items()
                    for who, (it, _) in by_who.items()
                },
                stamp,
            )
            attention.record(c, quarantined, source_name, stamp)
            earlier = [
                (sid, who, e, None if e.label is None else class_id.get(e.label))
                for sid, by_who in chosen.items()
                for who, (it, _) in by_who.items()
                for e in it.earlier
                if e.label is None or e.label in class_id
            ]
            earlier = [  # a resubmission's earlier answers, each recorded once
                x
                for x in earlier
                if c.execute(
                    "SELECT 1 FROM votes WHERE sample_id = ? AND annotator = ? AND origin = ?",
                    (x[0], x[1], x[2].where),
                ).fetchone()
                is None
            ]
            import_id = None
            if changes or new_votes or opened or settled or quarantined or cleared or earlier:
                # a file that changes nothing (re-imported, header only) leaves no trace
                if changes:
                    self._set_mode(source)
                cur = c.execute(
                    "INSERT INTO imports (file, sha256, format, n_new, n_corrections, "
                    "n_unchanged, created, n_skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (source_name, sha, fmt, n_new + n_unskip, n_fix, n_same, stamp, n_skip),
                )
                import_id = cur.lastrowid
            c.executemany(
                "INSERT INTO votes (sample_id, annotator, class_id, skip_reason, created, "
                "import_id, origin, answered, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (sid, who, k, it.skip, stamp, import_id, it.where, it.answered, it.updated)
                    for sid, who, it, k in earlier + new_votes
                ],
            )
            c.executemany(
                "INSERT INTO labels (sample_id, class_id, annotator, created, round_id, "
                "source, supersedes, import_id, skip_reason, decided) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        sid,
                        w.class_id,
                        w.annotator,
                        stamp,
                        round_of.get(sid),
                        source,
                        None if old is None else old["id"],
                        import_id,
                        w.skip,
                        decided,
                    )
                    for sid, w, old, _, decided in changes
                ],
            )
            c.executemany(
                "INSERT INTO disputes (sample_id, opened) VALUES (?, ?) ON CONFLICT (sample_id) "
                "DO UPDATE SET opened = excluded.opened, resolved = NULL, how = NULL",
                [(sid, stamp) for sid in opened],
            )
            c.executemany(
                "UPDATE disputes SET resolved = ?, how = ? "
                "WHERE sample_id = ? AND resolved IS NULL",
                [(stamp, h, sid) for sid, h in settled.items()],
            )
            crash_point("import:before_commit")
            disputes = [d for d in open_disputes(c) if d["sample_id"] in chosen]
            awaiting = awaiting_answers(c, opts.answers_needed)
            needing = attention.needs_attention(c)
            changed = _changed_rows(c, changes, open_ids)
        quarantined_ids = [p.sample_id for p in quarantined]
        return {
            "file": source_name,
            "format": fmt,
            "new": n_new,
            "corrections": n_fix,
            "skipped": n_skip,
            "unskipped": n_unskip,
            "unchanged": n_same,
            "replaced_other_annotators": n_forced,
            "disputes": disputes,
            "settled": len(settled) + n_policy,  # only what this write changed
            "awaiting": [a for a in awaiting if a["sample_id"] in chosen],
            "awaiting_total": len(awaiting),
            "changed": changed,
            "opened": opened,
            "needs_attention": [a for a in needing if a["sample_id"] in set(quarantined_ids)],
            "needs_attention_total": len(needing),
            "attention_cleared": [sid for sid in cleared if sid not in set(quarantined_ids)],
            "answers_needed": opts.answers_needed,
            "pending": len(self.pending()),
        }

    def _problem(
        self, sid: int, who: str, got: list[tuple[LabelItem, str]], source_name: str, fmt: str
    ) -> attention.Problem:
        """The entry that puts sample ``sid`` in *needs attention* for ``who``'s unusable
        answers ``got`` (each item and what is wrong with it), with the action that clears
        it: the annotator's usable answer, from a corrected file or a re-served task."""
        whys = list(dict.fromkeys(why for _, why in got))
        wheres = list(dict.fromkeys(it.where for it, _ in got))
        tasks = [it.task for it, _ in got if it.task is not None]
        store = q(self.folder)
        if fmt == "label-studio-live":
            action = "re-serve the task to the annotator and pull their new answer: " + how(
                f"eada labelstudio reopen {sid} --store {store}",
                f"eada.store.labelstudio.reopen(project, [{sid}])",
            )
        elif fmt == "records":
            action = (
                f"import a corrected record (a class of the project, or a skip) for sample {sid} "
                f"by {who}: " + how("eada label import FILE", "project.import_labels(records)")
            )
        else:
            action = (
                f"correct {' and '.join(wheres)} of {source_name} (one answer: a class of the "
                "project, or a skip) and import it again: "
                + how(
                    f"eada label import {q(source_name)} --store {store}",
                    f"project.import_labels({source_name!r})",
                )
            )
        return attention.Problem(
            sid, who, "; ".join(whys), action, ", ".join(wheres), tasks[-1] if tasks else None
        )

    def _check_file(self, sample: sqlite3.Row, where: str) -> list[str]:
        path = Path(sample["path"])
        if not path.is_file():
            return [f"{where}: image {path} of sample {sample['id']} is missing"]
        if file_sha256(path) != sample["content_hash"]:
            return [f"{where}: image {path} of sample {sample['id']} changed since `eada init`"]
        try:
            check_image(path)
        except ValueError as err:
            return [f"{where}: {err}"]
        return []
