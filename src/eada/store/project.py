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
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eada.config import ExperimentConfig
from eada.data.tasks import Task
from eada.store.config import (
    FolderData,
    StoreOptions,
    absolute_config,
    build_config,
    resolved_config,
)
from eada.store.data import (
    confine,
    content_hash,
    decode_image,
    default_roots,
    load_project_data,
    row_hashes,
)
from eada.store.db import Store, StoreError, now, tmp_name
from eada.store.exports import model_meta, write_predictions
from eada.store.labelfiles import (
    ImportFileError,
    LabelItem,
    csv_safe,
    export_rows_csv,
    label_studio_config,
    label_studio_tasks,
    read_label_file,
    records_to_items,
    write_atomic,
)
from eada.store.targets import (
    label_studio_root,
    record_sample_info,
)
from eada.store.unlabeled import (
    accuracy_summary,
    external_ids,
    hide_guessed_accuracy,
    list_roots,
    options_json,
    predicted_scores,
    resolve_target,
    round_rows_extra,
)
from eada.train import ActiveDATrainer, SimulatedOracle

Progress = Callable[[str], None] | None
MAX_ERRORS_SHOWN = 20


class ImportValidationError(ValueError):
    """An import that failed validation; nothing was written. ``problems`` lists every one."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:MAX_ERRORS_SHOWN]
        more = len(problems) - len(shown)
        text = "\n".join(f"  - {p}" for p in shown) + (f"\n  ... and {more} more" if more else "")
        super().__init__(f"{source}: {len(problems)} problem(s), nothing was imported:\n{text}")


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: ``EADA_CRASH_AT=name`` SIGKILLs the process here."""
    if os.environ.get("EADA_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _file_sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def init_project(
    folder: str | Path,
    cfg: ExperimentConfig,
    roots: list[Path] | None = None,
    options: StoreOptions | None = None,
    progress: Progress = None,
) -> Project:
    """Register a project: config, data roots, classes and every source/target/held-out sample
    (content hash; file path for image folders). Everything is loaded and validated (data
    readable, no corrupt image, round plan feasible) before the store is created.

    Example:
        >>> import tempfile
        >>> from eada.hparams import preset_config
        >>> p = init_project(Path(tempfile.mkdtemp()) / "proj", preset_config("toy"))
        >>> p.status()["n_target"]
        1000
    """
    folder = Path(folder)
    if (folder / "eada.sqlite").exists():
        raise StoreError(f"a project store already exists at {folder}")
    cfg = absolute_config(cfg)  # later commands may run from another folder
    options, labeled = resolve_target(cfg, options)
    task, paths, info = load_project_data(cfg, labeled, progress)
    ActiveDATrainer(cfg, task)  # validates domains and the round plan before any write
    all_roots = [Path(r).resolve() for r in [*default_roots(cfg), *(roots or [])]]
    all_roots += list_roots(paths, all_roots)
    for r in all_roots:
        if not r.is_dir():
            raise FileNotFoundError(f"data root not found: {r}")
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
    store = Store(folder, create=True)
    with store.transaction() as c:
        store.set_meta(
            "config", json.dumps({**resolved_config(cfg), "store": options_json(options)})
        )
        store.set_meta("eada_version", _eada_version())
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
    return Project(folder, store=store, task=task)


class Project:
    """An existing project store, with the operations of the ``eada`` commands.

    Args:
        folder: the project folder.
        store: an already open :class:`Store` (internal).
        task: already loaded domains (internal; otherwise loaded and checked on first use).
    """

    def __init__(self, folder: str | Path, store: Store | None = None, task: Task | None = None):
        self.folder = Path(folder)
        self.store = store if store is not None else Store(self.folder)
        raw = self.store.get_json("config")
        self.cfg = build_config(raw, f"config in {self.folder}")
        self.options = StoreOptions.model_validate(raw.get("store") or {"target": "labeled"})
        self.target_labeled = self.options.target != "unlabeled"
        self._task = task
        self.classes = self.store.classes()

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    # -- data ---------------------------------------------------------------------------------
    @property
    def task(self) -> Task:
        """The project's domains, loaded once and checked against the registered hashes."""
        if self._task is None:
            task, paths, _ = load_project_data(self.cfg, self.target_labeled)
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
                        raise StoreError(
                            f"{len(bad)} {role} samples differ from what was registered "
                            f"(first: sample {bad[0]}): the data changed since `eada init`"
                        )
            self._task = task
        return self._task

    def _target_ids(self) -> list[int]:
        return [r["id"] for r in self.store.samples("target")]

    # -- schedule -----------------------------------------------------------------------------
    def plan(self) -> list[dict[str, Any]]:
        """The config's rounds: ``round``, ``epoch``, ``budget``."""
        return ActiveDATrainer(self.cfg, self.task).plan

    def pending(self) -> list[sqlite3.Row]:
        """Selected samples of the last round that have no label yet."""
        rounds = self.store.rounds()
        if not rounds:
            return []
        return list(
            self.store.conn.execute(
                "SELECT rs.sample_id, s.position FROM round_samples rs "
                "JOIN samples s ON s.id = rs.sample_id WHERE rs.round_id = ? AND "
                "rs.rank IS NOT NULL AND NOT EXISTS "
                "(SELECT 1 FROM labels l WHERE l.sample_id = rs.sample_id) ORDER BY rs.rank",
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
        r = len(self.store.rounds()) + 1
        if r <= len(plan) and plan[r - 1]["epoch"] <= epoch:
            return "query"
        return "train" if epoch < self.cfg.train.epochs else "done"

    def _set_mode(self, mode: str) -> None:
        current = self.store.get_meta("mode")
        if current is not None and current != mode:
            raise StoreError(
                f"this project is a {current} run; it cannot take {mode} labels"
                + (
                    " (use `eada train --simulate` to continue it)"
                    if current == "simulated"
                    else ""
                )
            )
        if current is None:
            self.store.set_meta("mode", mode)

    # -- checkpoints --------------------------------------------------------------------------
    def _write_checkpoint(self, state: dict[str, Any], kind: str, epoch: int) -> tuple[str, str]:
        name = f"{kind}-e{epoch:04d}-{uuid.uuid4().hex[:10]}.pt"
        path = self.folder / "checkpoints" / name
        save_atomic(state, path)
        return f"checkpoints/{name}", _file_sha256(path)

    def _record_checkpoint(
        self,
        c: sqlite3.Connection,
        rel: str,
        sha: str,
        kind: str,
        epoch: int,
        segment: tuple[int, int],
        n_labeled: int,
        metrics: Any,
    ) -> int:
        cur = c.execute(
            "INSERT INTO checkpoints (kind, path, sha256, epoch, segment_start, segment_end, "
            "n_labeled, metrics, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (kind, rel, sha, epoch, *segment, n_labeled, json.dumps(metrics), now()),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @contextmanager
    def _unused_if_failed(self, rel: str) -> Iterator[None]:
        """Delete the checkpoint file ``rel`` when the transaction recording it fails."""
        try:
            yield
        except BaseException:
            (self.folder / rel).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, row: sqlite3.Row) -> dict[str, Any]:
        """A checkpoint's state, after checking its SHA-256 (``torch.load(weights_only=True)``)."""
        path = self.folder / row["path"]
        if not path.is_file():
            raise StoreError(f"checkpoint {path} is missing")
        if _file_sha256(path) != row["sha256"]:
            raise StoreError(f"checkpoint {path} does not match its recorded SHA-256")
        try:
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # pickle payloads (refused by weights_only), truncated files
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(
                f"checkpoint {path} cannot be loaded as tensors ({type(err).__name__}: {first}); "
                "it was not written by eada or is damaged, and nothing in it was run"
            ) from None
        return state

    def _n_label_rows(self) -> int:
        return int(self.store.conn.execute("SELECT COUNT(*) FROM labels").fetchone()[0])

    def _labels_tensor(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.store.current_labels()
        idx = torch.tensor([r["position"] for r in rows], dtype=torch.long)
        lab = torch.tensor([r["class_id"] for r in rows], dtype=torch.long)
        return idx, lab

    # -- train --------------------------------------------------------------------------------
    def train(self, epochs: int | None = None, progress: Progress = None) -> dict[str, Any]:
        """Train with every label in force: from the last checkpoint up to the next round's
        epoch (or the end of the schedule), or ``epochs`` more epochs. An interrupted training
        segment continues from its last epoch checkpoint. Returns the segment's measurements."""
        self.store.check_writable()
        ck = self.store.latest_checkpoint()
        e0 = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch" and epochs is None:
            start, end = ck["segment_start"], ck["segment_end"]
            state = self.load_checkpoint(ck)
            return self._train_segment(start, end, state, resume=True, progress=progress)
        if epochs is not None:
            if epochs < 1:
                raise ValueError(f"--epochs must be >= 1, got {epochs}")
            end = e0 + epochs
        else:
            action = self.next_action()
            if action == "label":
                raise StoreError(
                    f"round {len(self.store.rounds())} awaits labels for {len(self.pending())} "
                    "samples: import them with `eada label import FILE` (or pass --epochs N)"
                )
            if action == "query":
                raise StoreError(
                    f"the model has trained {e0} epochs, the schedule's next round is due: "
                    "run `eada query` (or pass --epochs N to train anyway)"
                )
            if action == "done":
                raise StoreError(
                    f"the schedule ({self.cfg.train.epochs} epochs) is complete; "
                    "pass --epochs N to train more"
                )
            plan = self.plan()
            r = len(self.store.rounds()) + 1
            end = plan[r - 1]["epoch"] if r <= len(plan) else self.cfg.train.epochs
        start_state = self.load_checkpoint(ck) if ck is not None else None
        return self._train_segment(e0, end, start_state, resume=False, progress=progress)

    def _train_segment(
        self, start: int, end: int, state: dict[str, Any] | None, resume: bool, progress: Progress
    ) -> dict[str, Any]:
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
                    "while this training ran; this one records nothing more: see `eada status`"
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

    # -- query --------------------------------------------------------------------------------
    def query(
        self, budget: int | None = None, export: bool = True, mode: str = "human"
    ) -> dict[str, Any]:
        """Score the unlabeled pool with the current model, select the next round's batch,
        record it (scores of the whole pool, selection, a checkpoint holding the advanced
        strategy random state) in one transaction, and export it. When the last round still
        awaits labels, nothing is selected: its batch is exported again."""
        self.store.check_writable()
        rounds = self.store.rounds()
        if self.pending():
            last = rounds[-1]
            paths = self.export_round(last["number"]) if export else {}
            return {
                "round": last["number"],
                "reexported": True,
                "files": paths,
                "selected": len(self.store.selected(last["id"])),
            }
        ck = self.store.latest_checkpoint()
        epoch = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch":
            raise StoreError("a training segment was interrupted: run `eada train` to finish it")
        plan = self.plan()
        r = len(rounds) + 1
        if budget is None:
            if r > len(plan):
                raise StoreError(
                    f"the config plans {len(plan)} rounds and all were queried; "
                    "pass --budget N for another round"
                )
            if plan[r - 1]["epoch"] > epoch:
                raise StoreError(
                    f"round {r} is planned after epoch {plan[r - 1]['epoch']} but the model has "
                    f"trained {epoch}: run `eada train` first (or pass --budget N to query now)"
                )
            budget = int(plan[r - 1]["budget"])
        trainer = ActiveDATrainer(self.cfg, self.task)
        if ck is not None:
            trainer.load_state_dict(self.load_checkpoint(ck), progress=False)
        n_label_rows = self._n_label_rows()
        trainer.set_labels(*self._labels_tensor())
        prop = trainer.propose(budget)
        crash_point("query:scored")
        target_ids = self._target_ids()
        pool = prop.pool_idx.tolist()
        rank = {int(i): k for k, i in enumerate(prop.selection.indices.tolist())}
        scores: dict[str, np.ndarray] = {
            "free_energy": prop.outputs.get_free_energy(),
            "mvsm": prop.outputs.get_mvsm(),
        }
        for k, v in prop.selection.scores.items():
            arr = np.asarray(v)
            if arr.shape == (len(pool),):
                scores[k] = arr
        pred = prop.outputs.get_predictions()
        chosen_score = predicted_scores(trainer, prop)  # the predicted class's probability
        rows = [
            (
                target_ids[pos],
                rank.get(j),
                json.dumps(
                    {
                        "predicted": self.classes[int(pred[j])],
                        **({"score": chosen_score[j]} if j in chosen_score else {}),
                        **{k: float(v[j]) for k, v in scores.items()},
                    }
                ),
            )
            for j, pos in enumerate(pool)
        ]
        rel, sha = self._write_checkpoint(trainer.state_dict(), "query", epoch)
        with self._unused_if_failed(rel), self.store.transaction() as c:
            # the round number and what it was scored from are checked in the writing
            # transaction: a concurrent `eada query` or `eada train` that committed meanwhile
            # wins, this one records nothing (and its checkpoint file is deleted)
            ck_now = self.store.latest_checkpoint()
            if (
                len(self.store.rounds()) + 1 != r
                or (None if ck_now is None else ck_now["id"]) != (None if ck is None else ck["id"])
                or self._n_label_rows() != n_label_rows
            ):
                raise StoreError(
                    f"another process changed the project while this query scored (now: "
                    f"{len(self.store.rounds())} round(s), {self._n_label_rows()} label rows, "
                    f"latest checkpoint {None if ck_now is None else ck_now['path']}); "
                    "nothing was recorded: "
                    "see `eada status`, then run `eada query` again if a round is still due"
                )
            self._set_mode(mode)
            ck_id = self._record_checkpoint(
                c,
                rel,
                sha,
                "query",
                epoch,
                (epoch, epoch),
                int(trainer.labeled_mask.sum()),
                None,
            )
            cur = c.execute(
                "INSERT INTO rounds (number, strategy, epoch, budget, config, info, "
                "checkpoint_id, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r,
                    self.cfg.active.strategy,
                    epoch,
                    budget,
                    json.dumps(self.cfg.active.model_dump(mode="json")),
                    json.dumps(prop.selection.info, default=_plain),
                    ck_id,
                    now(),
                ),
            )
            c.executemany(
                "INSERT INTO round_samples (round_id, sample_id, rank, scores) VALUES (?, ?, ?, ?)",
                [(cur.lastrowid, *row) for row in rows],
            )
            crash_point("query:before_commit")
        files = self.export_round(r) if export else {}
        return {
            "round": r,
            "reexported": False,
            "files": files,
            "selected": budget,
            "pool": len(pool),
            "epoch": epoch,
        }

    def export_round(self, number: int) -> dict[str, str]:
        """Write round ``number``'s batch as CSV, JSON and Label Studio tasks (+ config)."""
        rnd = self.store.conn.execute("SELECT * FROM rounds WHERE number = ?", (number,)).fetchone()
        if rnd is None:
            raise StoreError(f"no round {number} in this project")
        rows = []
        extra = round_rows_extra(self.store.conn)
        for s in self.store.selected(rnd["id"]):
            sc = json.loads(s["scores"])
            pred = sc.pop("predicted")
            rows.append(
                {
                    **extra.get(s["sample_id"], {}),
                    "score": sc.pop("score", None),
                    "sample_id": s["sample_id"],
                    "round": number,
                    "rank": s["rank"] + 1,
                    "domain": s["domain"],
                    "index": s["position"],
                    "path": s["path"],
                    "predicted": pred,
                    "scores": sc,
                }
            )
        score_names = list(rows[0]["scores"]) if rows else []
        out = self.folder / "exports"
        out.mkdir(exist_ok=True)
        stem = out / f"round-{number:03d}"
        files = {
            "csv": stem.with_suffix(".csv"),
            "json": stem.with_suffix(".json"),
            "label_studio": stem.with_name(stem.name + ".labelstudio.json"),
            "label_studio_config": out / "labelstudio-config.xml",
        }
        write_atomic(files["csv"], export_rows_csv(rows, score_names))
        doc = {
            "round": number,
            "strategy": rnd["strategy"],
            "epoch": rnd["epoch"],
            "classes": self.classes,
            "samples": [{**r, "label": None, "annotator": None} for r in rows],
        }
        roots = [label_studio_root(self.store.roots(), self.options.label_studio_root)]
        doc["label_studio_document_root"] = str(roots[0])
        write_atomic(files["json"], json.dumps(doc, indent=1))
        write_atomic(
            files["label_studio"], json.dumps(label_studio_tasks(rows, roots, number), indent=1)
        )
        images = any(r["path"] for r in rows)
        write_atomic(files["label_studio_config"], label_studio_config(self.classes, images))
        return {k: str(v) for k, v in files.items()}

    # -- labels -------------------------------------------------------------------------------
    def import_labels(
        self, file: str | Path, annotator: str = "unknown", allow_unqueried: bool = False
    ) -> dict[str, Any]:
        """Import a CSV/JSON/Label Studio label file: everything is validated first, then
        written in one transaction. A label differing from the one in force is a correction
        (a new row superseding the old); an identical one changes nothing."""
        self.store.check_writable()
        if self.store.get_meta("mode") == "simulated":
            self._set_mode("human")  # raises: a simulated run takes no human labels
        path = Path(file)
        fmt, items, raw = read_label_file(path)
        return self._write_labels(
            items, str(path), content_hash(raw), fmt, annotator, "human", allow_unqueried
        )

    def import_records(
        self, records: list[Any], annotator: str = "notebook", allow_unqueried: bool = False
    ) -> dict[str, Any]:
        """Import labels from in-memory records (see :func:`eada.api.import_labels`), with
        the same validation and write as a file import."""
        self.store.check_writable()
        if self.store.get_meta("mode") == "simulated":
            self._set_mode("human")  # raises: a simulated run takes no human labels
        items = records_to_items(records)
        raw = json.dumps(records, sort_keys=True, default=str).encode()
        return self._write_labels(
            items, "(records)", content_hash(raw), "records", annotator, "human", allow_unqueried
        )

    def label_simulated(self) -> dict[str, Any]:
        """Label the open round's pending samples with ground truth (a
        :class:`~eada.train.SimulatedOracle`), through the same validation and write as an
        import."""
        if not self.target_labeled:
            raise StoreError(
                "the target of this project is unlabeled: a simulated oracle has no labels to "
                "reveal (label the queried samples with `eada label import`)"
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
    ) -> dict[str, Any]:
        problems: list[str] = []
        conn = self.store.conn
        class_id = {n: i for i, n in enumerate(self.classes)}
        roots = self.store.roots()
        chosen: dict[int, tuple[LabelItem, int]] = {}
        by_external = external_ids(conn) if any(it.external_id for it in items) else {}
        for it in items:
            sample = None
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
            if sample["role"] != "target":
                problems.append(
                    f"{it.where}: sample {sample['id']} is a {sample['role']} sample; only "
                    "target samples take labels"
                )
                continue
            if it.label not in class_id:
                known = ", ".join(self.classes[:12]) + (" ..." if len(self.classes) > 12 else "")
                problems.append(f"{it.where}: unknown class name {it.label!r} (known: {known})")
                continue
            k = class_id[it.label]
            prev = chosen.get(sample["id"])
            if prev is not None and prev[1] != k:
                problems.append(
                    f"{it.where}: sample {sample['id']} labeled {it.label!r} but {prev[0].where} "
                    f"labels it {prev[0].label!r} (conflicting duplicates)"
                )
                continue
            chosen[sample["id"]] = (it, k)
        for sid, (it, _) in chosen.items():
            s = conn.execute("SELECT * FROM samples WHERE id = ?", (sid,)).fetchone()
            if s["path"] is not None:
                problems += self._check_file(s, it.where)
        if problems:
            raise ImportValidationError(source_name, problems)
        n_new = n_fix = n_same = 0
        stamp = now()
        # Everything that another writer can change (rounds, the labels in force, the mode)
        # is read inside the transaction that writes: a concurrent import waits for this one
        # and sees its labels, so two labels are never in force for one sample.
        with self.store.transaction() as c:
            round_of: dict[int, int] = {}
            if chosen:
                q = ",".join("?" * len(chosen))
                for row in c.execute(
                    f"SELECT rs.sample_id, MAX(rs.round_id) AS round_id FROM round_samples rs "
                    f"WHERE rs.rank IS NOT NULL AND rs.sample_id IN ({q}) GROUP BY rs.sample_id",
                    list(chosen),
                ):
                    round_of[row["sample_id"]] = row["round_id"]
            problems = [
                f"{it.where}: sample {sid} was never queried (pass --allow-unqueried to "
                "label it anyway)"
                for sid, (it, _) in chosen.items()
                if sid not in round_of and not allow_unqueried
            ]
            if problems:
                raise ImportValidationError(source_name, problems)
            current = {r["sample_id"]: r for r in self.store.current_labels()}
            changes = []
            for sid, (it, k) in sorted(chosen.items()):
                old = current.get(sid)
                if old is not None and old["class_id"] == k:
                    n_same += 1
                    continue
                if old is None:
                    n_new += 1
                else:
                    n_fix += 1
                changes.append((sid, it, k, old))
            if changes:  # a file that changes nothing (re-imported, header only) leaves no trace
                self._set_mode(source)
                cur = c.execute(
                    "INSERT INTO imports (file, sha256, format, n_new, n_corrections, "
                    "n_unchanged, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (source_name, sha, fmt, n_new, n_fix, n_same, stamp),
                )
                c.executemany(
                    "INSERT INTO labels (sample_id, class_id, annotator, created, round_id, "
                    "source, supersedes, import_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            sid,
                            k,
                            it.annotator or annotator,
                            stamp,
                            round_of.get(sid),
                            source,
                            None if old is None else old["id"],
                            cur.lastrowid,
                        )
                        for sid, it, k, old in changes
                    ],
                )
            crash_point("import:before_commit")
        return {
            "file": source_name,
            "format": fmt,
            "new": n_new,
            "corrections": n_fix,
            "unchanged": n_same,
            "pending": len(self.pending()),
        }

    def _check_file(self, sample: sqlite3.Row, where: str) -> list[str]:
        path = Path(sample["path"])
        if not path.is_file():
            return [f"{where}: image {path} of sample {sample['id']} is missing"]
        if _file_sha256(path) != sample["content_hash"]:
            return [f"{where}: image {path} of sample {sample['id']} changed since `eada init`"]
        data: Any = self.cfg.data
        size = data.image_size if isinstance(data, FolderData) else 32
        try:
            decode_image(path, size, 3)
        except ValueError as err:
            return [f"{where}: {err}"]
        return []

    # -- the simulated driver -----------------------------------------------------------------
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

    # -- status / export ----------------------------------------------------------------------
    def _measured(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Metrics without any accuracy computed from labels nobody gave (unlabeled target)."""
        return metrics if self.target_labeled else hide_guessed_accuracy(metrics)

    def _measured_line(self, line: str) -> str:
        return line if self.target_labeled else hide_guessed_accuracy(line)

    def status(self) -> dict[str, Any]:
        """Rounds, budget spent and accuracy history."""
        conn = self.store.conn
        n_target = len(self.store.samples("target"))
        rounds = []
        for r in self.store.rounds():
            n_sel = conn.execute(
                "SELECT COUNT(*) FROM round_samples WHERE round_id = ? AND rank IS NOT NULL",
                (r["id"],),
            ).fetchone()[0]
            n_lab = conn.execute(
                "SELECT COUNT(DISTINCT l.sample_id) FROM labels l JOIN round_samples rs ON "
                "rs.sample_id = l.sample_id AND rs.round_id = ? AND rs.rank IS NOT NULL",
                (r["id"],),
            ).fetchone()[0]
            rounds.append(
                {
                    "round": r["number"],
                    "epoch": r["epoch"],
                    "strategy": r["strategy"],
                    "selected": n_sel,
                    "labeled": n_lab,
                    "pending": n_sel - n_lab,
                }
            )
        labels = self.store.current_labels()
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
            "by_source": {
                s: sum(1 for r in labels if r["source"] == s) for s in ("human", "simulated")
            },
            "epoch": 0 if last is None else last["epoch"],
            "rounds": rounds,
            "history": history,
            "accuracy": accuracy_summary(self, history),
            "next": self.next_action(),
        }

    def export(self, out: str | Path) -> dict[str, str]:
        """Write ``labels.csv`` (labels in force), ``labels_history.csv`` (every row,
        corrections included), ``model.pt`` (the last checkpoint's model weights, a plain
        ``state_dict``) and ``model.json`` (config, classes, SHA-256 of ``model.pt``)."""
        import csv
        import io

        out = Path(out)
        if out.exists() and not out.is_dir():
            raise StoreError(f"--out {out} is an existing file; give a folder to export into")
        ck = self.store.latest_checkpoint()
        state = self.load_checkpoint(ck) if ck is not None else None  # refused: nothing written
        out.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
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
        ]
        query = (
            "SELECT l.id AS label_id, l.sample_id, s.domain, s.position AS idx, s.path, "
            "c.name, l.annotator, l.source, r.number AS round, l.created, l.supersedes "
            "FROM labels l JOIN samples s ON s.id = l.sample_id JOIN classes c ON "
            "c.id = l.class_id LEFT JOIN rounds r ON r.id = l.round_id {where} ORDER BY l.id"
        )
        current = "WHERE NOT EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id)"
        for name, where in (("labels.csv", current), ("labels_history.csv", "")):
            buf = io.StringIO(newline="")
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(cols)
            for row in self.store.conn.execute(query.format(where=where)):
                w.writerow(["" if v is None else csv_safe(v) for v in tuple(row)])
            write_atomic(out / name, buf.getvalue())
            files[name] = str(out / name)
        if ck is not None and state is not None:
            save_atomic(state["model"], out / "model.pt")
            meta = {
                "config": resolved_config(self.cfg),
                "classes": self.classes,
                "epoch": ck["epoch"],
                "n_labeled": ck["n_labeled"],
                "sha256": _file_sha256(out / "model.pt"),
                "load": "eada.load_model(FOLDER), or torch.load('model.pt', weights_only=True)",
                **model_meta(self),
            }
            files["predictions.csv"] = str(write_predictions(self, state["model"], out))
            write_atomic(out / "model.json", json.dumps(meta, indent=1, default=str))
            files["model.pt"] = str(out / "model.pt")
            files["model.json"] = str(out / "model.json")
        return files


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file (fsynced, then ``os.replace``): ``path`` is
    whole or absent, and a failed write (disk full) leaves no temporary file behind.

    Raises:
        StoreError: the write failed for lack of space (or quota), naming ``path``.
    """
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        crash_point("checkpoint:tmp_written")
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreError(
                f"no space left on the device writing {path}: free disk space and retry; "
                "nothing was recorded and no partial file was left"
            ) from None
        raise


def _eada_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("eada")
    except metadata.PackageNotFoundError:
        return "unknown"


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


__all__ = [
    "ImportFileError",
    "ImportValidationError",
    "Project",
    "crash_point",
    "init_project",
    "save_atomic",
]
