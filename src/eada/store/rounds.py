"""Query rounds of a project store: score the unlabeled pool, select, record the round with
its checkpoint in one transaction, export the batch (CSV, JSON, Label Studio)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from eada.store import attention, labelstudio
from eada.store.agreement import awaiting_counts, open_disputes
from eada.store.checkpoints import crash_point
from eada.store.db import AUDIT, PRIVATE_DIR, StoreError, how, now, q
from eada.store.labelfiles import (
    export_rows_csv,
    label_studio_config,
    label_studio_tasks,
    write_atomic,
)
from eada.store.labels import ProjectLabels, stamps_on_success
from eada.store.roots import NO_DOCUMENT_ROOT
from eada.store.unlabeled import predicted_scores, round_rows_extra

if TYPE_CHECKING:
    import torch

    from eada.train import ActiveDATrainer


class ProjectRounds(ProjectLabels):
    """A project store's query rounds (see :class:`~eada.store.project.Project`)."""

    @stamps_on_success
    def query(
        self, budget: int | None = None, export: bool = True, mode: str = "human"
    ) -> dict[str, Any]:
        """Score the unlabeled pool with the current model, select the next round's batch,
        record it (scores of the whole pool, selection, a checkpoint holding the advanced
        strategy random state) in one transaction, and export it. When the last round still
        awaits labels, nothing is selected: its batch is exported again."""
        import torch

        from eada.train import ActiveDATrainer

        self.store.check_writable()
        self.export_missing()
        self.check_labeled_files()
        rounds = self.store.active_rounds()
        if self.pending():
            last = rounds[-1]
            paths = self.export_round(last["number"]) if export else {}
            return {
                "round": last["number"],
                "reexported": True,
                "files": paths,
                **self.round_counts(last["id"]),
            }
        ck = self.store.latest_checkpoint()
        epoch = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch":
            raise StoreError(
                "a training segment was interrupted: run "
                f"{how('eada train', 'project.train()')} to finish it"
            )
        plan = self.plan()
        r = len(rounds) + 1  # the schedule's round
        n_all = len(self.store.rounds())  # its number counts the audit rounds too
        if budget is None:
            if r > len(plan):
                raise StoreError(
                    f"the config plans {len(plan)} rounds and all were queried; "
                    f"query another round with "
                    f"{how('eada query --budget N', 'project.query(budget=N)')}"
                )
            if plan[r - 1]["epoch"] > epoch:
                raise StoreError(
                    f"round {r} is planned after epoch {plan[r - 1]['epoch']} but the model has "
                    f"trained {epoch}: run {how('eada train', 'project.train()')} first (or "
                    f"query now with {how('eada query --budget N', 'project.query(budget=N)')})"
                )
            budget = int(plan[r - 1]["budget"])
        trainer = ActiveDATrainer(self.cfg, self.task)
        if ck is not None:
            trainer.load_state_dict(self.load_checkpoint(ck), progress=False)
        n_label_rows = self._n_label_rows()
        trainer.set_labels(*self._labels_tensor())
        exclude = self._audit_mask()  # audit samples and skipped ones stay out of the pool
        skipped = [s["position"] for s in self.store.current_skips()]
        if skipped:
            exclude[torch.tensor(skipped, dtype=torch.long)] = True
        prop = trainer.propose(budget, exclude=exclude)
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
        info = dict(prop.selection.info)
        info["near_duplicates"], info["near_duplicate_threshold"] = near_duplicates(
            trainer, prop.chosen, target_ids, self.options.near_duplicate_threshold
        )

        def changed() -> str | None:
            ck_now = self.store.latest_checkpoint()
            if (
                len(self.store.rounds()) == n_all
                and (None if ck_now is None else ck_now["id"]) == (None if ck is None else ck["id"])
                and self._n_label_rows() == n_label_rows
            ):
                return None
            return (
                f"another process changed the project while this query scored (now: "
                f"{len(self.store.rounds())} round(s), {self._n_label_rows()} label rows, "
                f"latest checkpoint {None if ck_now is None else ck_now['path']}); "
                "nothing was recorded: "
                f"see {how('eada status', 'project.status()')}, then run "
                f"{how('eada query', 'project.query()')} again if a round is still due"
            )

        self._record_round(
            trainer,
            epoch,
            int(trainer.labeled_mask.sum()),
            (n_all + 1, self.cfg.active.strategy, budget),
            json.dumps(self.cfg.active.model_dump(mode="json")),
            json.dumps(info, default=_plain),
            rows,
            changed,
            mode,
            "query:before_commit",
        )
        files = self.export_round(n_all + 1) if export else {}
        pushed_error = self._push_to_label_studio()
        return {
            "round": n_all + 1,
            "reexported": False,
            "labelstudio_error": pushed_error,
            "files": files,
            "selected": budget,
            "pool": len(pool),
            "epoch": epoch,
        }

    def round_counts(self, round_id: int) -> dict[str, int]:
        """A round's ``selected`` samples and how many are ``labeled``, ``skipped`` (marked
        unusable) and ``pending`` (no answer in force yet), of those ``awaiting`` (answered,
        but by fewer annotators than ``store.answers_needed``); ``needs_attention``: without
        an answer in force because an answer could not be used (:mod:`eada.store.attention`),
        not counted as pending."""
        n_sel = n_lab = n_skip = n_wait = n_att = 0
        answers = {a["sample_id"]: a for a in self.store.answers()}
        waiting = awaiting_counts(self.store.conn)
        quarantined = attention.open_ids(self.store.conn)
        for s in self.store.selected(round_id):
            n_sel += 1
            ans = answers.get(s["sample_id"])
            if ans is not None:
                n_lab += ans["class_id"] is not None
                n_skip += ans["class_id"] is None
            elif s["sample_id"] in quarantined:
                n_att += 1
            n_wait += s["sample_id"] in waiting
        return {
            "selected": n_sel,
            "labeled": n_lab,
            "skipped": n_skip,
            "pending": n_sel - n_lab - n_skip - n_att,
            "awaiting": n_wait,
            "needs_attention": n_att,
        }

    @stamps_on_success
    def audit(self, n: int, export: bool = True, again: bool = False) -> dict[str, Any]:
        """Draw an audit round: ``n`` samples uniformly at random (without replacement) from
        the unlabeled pool, with the current model's prediction for each, recorded as a round
        of strategy ``audit`` and exported like any round. Their labels give an unbiased
        estimate of the accuracy of THAT model (the latest checkpoint at the draw) on the pool
        it was drawn from (:func:`eada.store.unlabeled.audit_summary`). Audit samples never
        enter an active round's pool and their labels are never trained on; the random draw
        uses its own generator (seed, round number), so the schedule's strategy state is
        untouched.

        A request is keyed by ``n``, the model (the latest checkpoint) and the labels (rows
        of the label table): when the last round is an audit of the same key, a retry (of a
        command killed or whose output was lost) exports that audit again instead of drawing
        a second one (``repeated`` in the result); ``again=True`` draws another deliberately.

        Raises:
            ValueError: ``n`` < 1.
            StoreError: the last active round awaits labels, a training segment was
                interrupted, or the pool holds fewer than ``n`` samples.
        """
        import torch

        from eada.train import ActiveDATrainer
        from eada.train.evaluate import predict_energies

        self.store.check_writable()
        if n < 1:
            raise ValueError(f"--audit must be >= 1, got {n}")
        redo = self.export_missing()
        last_round = self.store.rounds()[-1] if self.store.rounds() else None
        repeated = (
            last_round is not None
            and last_round["strategy"] == AUDIT
            and not again
            and last_round["number"] not in redo
            and self._same_audit_request(last_round, n)
        )
        if repeated and export and last_round is not None:
            self.export_round(last_round["number"])
        if (
            last_round is not None
            and last_round["strategy"] == AUDIT
            and (last_round["number"] in redo or repeated)
        ):
            # a retry of an audit killed after its round was recorded: the files, not a second
            # audit
            files = {
                k: str(v) for k, v in self.round_files(last_round["number"]).items() if v.exists()
            }
            return {
                "round": last_round["number"],
                "audit": True,
                "reexported": True,
                "repeated": repeated,
                "labelstudio_error": self._push_to_label_studio(),
                "files": files,
                "selected": last_round["budget"],
                "pool": json.loads(last_round["info"]).get("pool"),
                "epoch": last_round["epoch"],
            }
        self.check_labeled_files()
        pending = self.pending()
        ck = self.store.latest_checkpoint()
        epoch = 0 if ck is None else ck["epoch"]
        if ck is not None and ck["kind"] == "epoch":
            raise StoreError(
                "a training segment was interrupted: finish it first "
                f"({how(f'eada train --store {q(self.folder)}', 'project.train()')})"
            )
        trainer = ActiveDATrainer(self.cfg, self.task)
        if ck is not None:
            trainer.load_state_dict(self.load_checkpoint(ck), progress=False)
        n_label_rows = self._n_label_rows()
        trainer.set_labels(*self._labels_tensor())
        free = ~trainer.labeled_mask & ~self._audit_mask()
        skipped = [s["position"] for s in self.store.current_skips() if s["position"] >= 0]
        if skipped:
            free[torch.tensor(skipped, dtype=torch.long)] = False
        # samples out for labeling in the open round are not drawn (their answers will come
        # from the active round): the estimate is for the pool without them, and says so
        out_now = [p["position"] for p in pending if p["position"] >= 0]
        if out_now:
            free[torch.tensor(out_now, dtype=torch.long)] = False
        pool = torch.nonzero(free).squeeze(1)
        if n > len(pool):
            raise StoreError(f"--audit {n}: the unlabeled pool holds only {len(pool)} samples")
        n_all = len(self.store.rounds())
        rng = np.random.default_rng([int(self.cfg.seed), n_all + 1, 0xA0D1])
        chosen = pool[torch.from_numpy(rng.choice(len(pool), size=n, replace=False))]
        e = predict_energies(
            trainer.model,
            trainer.task.target,
            chosen,
            self.cfg.train.eval_batch_size,
            trainer.device,
        )
        prob = torch.softmax(-self.cfg.train.tau * e, dim=1).max(dim=1).values
        pred = e.argmin(dim=1)
        target_ids = self._target_ids()
        rows = [
            (
                target_ids[int(pos)],
                k,
                json.dumps(
                    {"predicted": self.classes[int(pred[k])], "score": round(float(prob[k]), 6)}
                ),
            )
            for k, pos in enumerate(chosen.tolist())
        ]
        # the labels the model (the checkpoint) was trained on, not the labels in force now:
        # after `eada train --partial` more may have come in since
        n_trained = 0 if ck is None else int(ck["n_labeled"])
        info: dict[str, Any] = {"pool": len(pool), "epoch": epoch, "n_labeled_trained": n_trained}
        info["request"] = {"n": n, "label_rows": n_label_rows}  # with its checkpoint: the key
        if out_now:
            info["excluded_pending"] = len(out_now)
            info["pending_round"] = self.store.active_rounds()[-1]["number"]

        def changed() -> str | None:
            if len(self.store.rounds()) == n_all and self._n_label_rows() == n_label_rows:
                return None
            return (
                "another process changed the project while this audit was drawn; nothing "
                "was recorded: see "
                + how(f"eada status --store {q(self.folder)}", "project.status()")
                + " and draw it again"
            )

        self._record_round(
            trainer,
            epoch,
            n_trained,
            (n_all + 1, AUDIT, n),
            json.dumps({"audit": n}),
            json.dumps(info),
            rows,
            changed,
            "human",
        )
        files = self.export_round(n_all + 1) if export else {}
        pushed_error = self._push_to_label_studio()
        return {
            "round": n_all + 1,
            "audit": True,
            "reexported": False,
            "labelstudio_error": pushed_error,
            "files": files,
            "selected": n,
            "pool": len(pool),
            "epoch": epoch,
            "excluded_pending": info.get("excluded_pending", 0),
            "pending_round": info.get("pending_round"),
        }

    def _same_audit_request(self, audit_round: Any, n: int) -> bool:
        """Whether ``audit_round`` answered a request of ``n`` samples with the model and the
        labels the store holds now (no checkpoint and no label row since it was drawn)."""
        ck = self.store.latest_checkpoint()
        request = json.loads(audit_round["info"] or "{}").get("request")
        return (
            ck is not None
            and ck["id"] == audit_round["checkpoint_id"]
            and request == {"n": n, "label_rows": self._n_label_rows()}
        )

    def _record_round(
        self,
        trainer: ActiveDATrainer,
        epoch: int,
        n_trained: int,
        head: tuple[int, str, int],
        config: str,
        info: str,
        rows: Sequence[tuple[int, int | None, str]],
        changed: Callable[[], str | None],
        mode: str,
        crash: str | None = None,
    ) -> None:
        """Record a round: write ``trainer``'s state as a ``query`` checkpoint, then in one
        transaction the checkpoint, the round (``head`` = number, strategy, budget; its
        ``config`` and ``info`` JSON) and its ``rows`` (sample id, rank, scores JSON).

        ``changed()`` runs inside that writing transaction and returns a message when
        another process changed what the round was scored from: a concurrent ``eada query``
        or ``eada train`` that committed meanwhile wins, this one records nothing (a
        :class:`StoreError` with that message; the checkpoint file is deleted).
        ``crash``: the fault-injection point just before the commit, if any."""
        rel, sha = self._write_checkpoint(trainer.state_dict(), "query", epoch)
        with self._unused_if_failed(rel), self.store.transaction() as c:
            why = changed()
            if why is not None:
                raise StoreError(why)
            self._set_mode(mode)
            ck_id = self._record_checkpoint(
                c, rel, sha, "query", epoch, (epoch, epoch), n_trained, None
            )
            number, strategy, budget = head
            cur = c.execute(
                "INSERT INTO rounds (number, strategy, epoch, budget, config, info, "
                "checkpoint_id, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (number, strategy, epoch, budget, config, info, ck_id, now()),
            )
            c.executemany(
                "INSERT INTO round_samples (round_id, sample_id, rank, scores) VALUES (?, ?, ?, ?)",
                [(cur.lastrowid, *row) for row in rows],
            )
            if crash is not None:
                crash_point(crash)

    def _push_to_label_studio(self) -> str | None:
        """Push the rounds not pushed yet to the connected Label Studio project, if any;
        its error message when Label Studio did not take them (the round stands: push it
        later with ``eada labelstudio push``), else ``None``."""
        if labelstudio.connection(self) is None:
            return None
        try:
            labelstudio.push_pending(self)
        except labelstudio.LabelStudioError as err:
            return str(err)
        return None

    def round_rows(self, number: int) -> list[dict[str, Any]]:
        """Round ``number``'s selected samples in rank order: ids, path, the model's class and
        score, the strategy's scores and the answer in force (``label``, ``annotator``,
        ``skip``), ``dispute`` (each annotator's answer where they disagree) and
        ``near_duplicate_of`` (an earlier-ranked sample of the round whose features are
        near-identical). An audit round's rows (``audit`` true) are blind: no model guess,
        score or strategy score (the estimate reads them from the store, not the files)."""
        rnd = self.store.conn.execute("SELECT * FROM rounds WHERE number = ?", (number,)).fetchone()
        if rnd is None:
            raise StoreError(f"no round {number} in this project")
        rows = []
        extra = round_rows_extra(self.store.conn)
        answers = {a["sample_id"]: a for a in self.store.answers()}
        dups = {d["sample_id"]: d for d in json.loads(rnd["info"]).get("near_duplicates", [])}
        disputed = {d["sample_id"]: d for d in open_disputes(self.store.conn)}
        audit = rnd["strategy"] == AUDIT
        for s in self.store.selected(rnd["id"]):
            ans = answers.get(s["sample_id"])
            sc = json.loads(s["scores"])
            pred = sc.pop("predicted")
            if audit:  # blind: no model guess where an annotator sees an audit sample
                pred, sc = None, {}
            dup = dups.get(s["sample_id"])
            dis = disputed.get(s["sample_id"])
            rows.append(
                {
                    "audit": audit,
                    "dispute": None
                    if dis is None
                    else "; ".join(f"{a}: {v}" for a, v in dis["answers"].items()),
                    "near_duplicate_of": None
                    if dup is None
                    else f"{dup['of']} (cosine {dup['cosine']:.3f})",
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
                    "label": None if ans is None else ans["class_name"],
                    "annotator": None if ans is None else ans["annotator"],
                    "skip": None if ans is None else ans["skip_reason"],
                }
            )
        return rows

    def round_files(self, number: int) -> dict[str, Any]:
        """The export files of round ``number`` (paths; they may not exist)."""
        out = self.folder / "exports"
        stem = out / f"round-{number:03d}"
        return {
            "csv": stem.with_suffix(".csv"),
            "json": stem.with_suffix(".json"),
            "label_studio": stem.with_name(stem.name + ".labelstudio.json"),
            "label_studio_config": out / "labelstudio-config.xml",
        }

    def export_missing(self) -> list[int]:
        """Export every round whose CSV or JSON is missing (a process killed between recording
        a round and writing its files); returns their numbers. A store this user may not
        write is left as it is."""
        if self.store.readonly or self.store.get_meta("mode") == "simulated":
            return []  # a simulated run exports nothing (``eada train --simulate``)
        done = []
        for r in self.store.rounds():
            f = self.round_files(r["number"])
            if not f["csv"].is_file() or not f["json"].is_file():
                self.export_round(r["number"])
                done.append(r["number"])
        return done

    def export_round(self, number: int) -> dict[str, str]:
        """Write round ``number``'s batch as CSV, JSON and Label Studio tasks (+ config)."""
        rows = self.round_rows(number)
        rnd = self.store.conn.execute("SELECT * FROM rounds WHERE number = ?", (number,)).fetchone()
        score_names = list(rows[0]["scores"]) if rows else []
        out = self.folder / "exports"
        out.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        files = self.round_files(number)
        write_atomic(files["csv"], export_rows_csv(rows, score_names))
        doc = {
            "round": number,
            "strategy": rnd["strategy"],
            "epoch": rnd["epoch"],
            "classes": self.classes,
            "samples": rows,
        }
        images = any(r["path"] for r in rows)
        root = labelstudio.document_root_or_none(self) if images else None
        roots = [] if root is None else [root]
        doc["label_studio_document_root"] = None if root is None else str(root)
        tasks: list[dict[str, Any]] | None = None
        if images and root is None:
            doc["label_studio_note"] = NO_DOCUMENT_ROOT + (
                f"; {files['label_studio'].name} is not written (its image URLs would not resolve)"
            )
        else:
            try:
                tasks = label_studio_tasks(rows, roots, number)
            except ValueError as err:
                doc["label_studio_note"] = f"{err}; {files['label_studio'].name} is not written"
        if tasks is None:  # never a Label Studio file with URLs that do not resolve
            files["label_studio"].unlink(missing_ok=True)
            del files["label_studio"]
        write_atomic(files["json"], json.dumps(doc, indent=1))
        if tasks is not None:
            write_atomic(files["label_studio"], json.dumps(tasks, indent=1))
        write_atomic(files["label_studio_config"], label_studio_config(self.classes, images))
        return {k: str(v) for k, v in files.items()}


# store.near_duplicate_threshold's defaults by what the features are
# (benchmarks/investigations/near_duplicates.py)
NEAR_DUPLICATE_DEFAULTS = {"features": 0.94, "images": 0.999}


def near_duplicates(
    trainer: Any, chosen: torch.Tensor, target_ids: list[int], threshold: float | None
) -> tuple[list[dict[str, Any]], float]:
    """The near-duplicates of a round: every selected sample whose features have a cosine
    similarity >= the threshold with a sample ranked before it, as ``{"sample_id", "of"
    (the most similar earlier-ranked sample), "cosine"}``, and the threshold used. Features:
    the target domain's rows when it holds them in memory (a frozen backbone's features,
    feature rows, decoded images), else the model's embeddings. ``threshold`` ``None``: by
    what they are (:data:`NEAR_DUPLICATE_DEFAULTS`): ``features`` for feature rows,
    ``images`` for decoded images and embeddings. Flags only: nothing is removed."""
    import torch

    from eada.data.base import TensorDomain
    from eada.train.evaluate import embed_samples

    dom = trainer.task.target
    rows = isinstance(dom, TensorDomain) and dom.x.dim() == 2
    if threshold is None:
        threshold = NEAR_DUPLICATE_DEFAULTS["features" if rows else "images"]
    if len(chosen) < 2:
        return [], threshold
    if isinstance(dom, TensorDomain):
        x = dom.x[chosen].reshape(len(chosen), -1).float()
    else:
        x = torch.as_tensor(
            embed_samples(
                trainer.model, dom, chosen, trainer.cfg.train.eval_batch_size, trainer.device
            )
        ).float()
    x = torch.nn.functional.normalize(x, dim=1)
    sim = x @ x.T
    out = []
    for j in range(1, len(chosen)):
        k = int(sim[j, :j].argmax())
        if float(sim[j, k]) >= threshold:
            out.append(
                {
                    "sample_id": target_ids[int(chosen[j])],
                    "of": target_ids[int(chosen[k])],
                    "cosine": round(float(sim[j, k]), 4),
                }
            )
    return out, threshold


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
