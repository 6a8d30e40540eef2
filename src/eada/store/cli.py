"""The annotation-round subcommands of ``eada`` (a project store in a folder):

eada init --store DIR (--preset NAME [--method M] | --config FILE.yaml
                       | --source-dir D --target-dir D) [--seed S] [--set k=v ...]
                       [--allow-root DIR ...] [--threads N]
eada query --store DIR [--budget N] [--threads N]
                                               score the pool, select, export CSV/JSON/Label Studio
eada query --store DIR --audit N               N uniformly random samples: an accuracy estimate
eada label import FILE --store DIR [--annotator NAME] [--allow-unqueried] [--force]
eada train --store DIR [--epochs N | --partial] [--simulate]
eada labelstudio connect --store DIR --url URL [--project ID]   a live Label Studio project
eada labelstudio pull --store DIR [--force] | push --store DIR
eada labelstudio reopen SAMPLE... --store DIR   serve a task that needs attention again
eada serve --store DIR [--host H] [--port P]  Label Studio ML backend (health/setup/predict/webhook)
eada target scan --store DIR                   register new target files/rows, leave out vanished
eada status --store DIR [--json]
eada export --store DIR --out DIR [--force]    labels (CSV) and the final model (weights + JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from shlex import quote
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
FALLBACK_STORE = "eada-project"
MAX_LISTED = 20  # disputes printed one a line (the JSON and the report hold them all)
DEFAULT_STORE = os.environ.get("EADA_STORE", FALLBACK_STORE)  # as the help shows it


def default_store() -> str:
    """``--store`` when none is given: ``$EADA_STORE``, else the current folder when it holds
    a project store (``eada.sqlite``), else ``eada-project``."""
    env = os.environ.get("EADA_STORE")
    if env:
        return env
    return "." if Path("eada.sqlite").is_file() else FALLBACK_STORE


def _say_next(command: str) -> None:
    """``next: COMMAND`` on one unwrapped line (a command one can paste)."""
    console.print(f"next: {command}", soft_wrap=True, highlight=False)


def next_command(action: str, store: str, proj: Any = None) -> str:
    """The full command (one can paste it) for the schedule's next ``action`` (``label``,
    ``query``, ``train``, ``done``) of the project at ``store``."""
    s = quote(store)
    if action == "label":
        from eada.store import labelstudio
        from eada.store.agreement import awaiting_answers, awaiting_text

        waiting = ""
        if proj is not None:
            needed = proj.options.answers_needed
            waiting = awaiting_text(awaiting_answers(proj.store.conn, needed), needed)
        waiting = f"; {waiting}" if waiting else ""
        ls = labelstudio.connection(proj) if proj is not None else None
        if ls is not None:
            return (
                f"eada labelstudio pull --store {s}   (once the round is labeled in Label Studio, "
                f"{ls['url']}/projects/{ls['project']}{waiting})"
            )
        rounds = proj.store.active_rounds() if proj is not None else []
        f = quote(f"{store}/exports/round-{rounds[-1]['number']:03d}.csv") if rounds else "FILE"
        return f"eada label import {f} --store {s}   (once its label column is filled{waiting})"
    if action == "done":
        return (
            f"eada export --store {s} --out {quote(store + '/final')}   (the schedule is complete)"
        )
    return f"eada {action} --store {s}"


def _log(msg: str) -> None:
    """A progress line on stderr, plain and unwrapped (logs and CI read it whole)."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _project(args: argparse.Namespace) -> Any:
    from eada.store import Project

    if args.store is None:
        args.store = default_store()
    return Project(args.store)


def _cmd_init(args: argparse.Namespace) -> int:
    from eada.config import ConfigError
    from eada.hparams import preset_config
    from eada.store import init_project
    from eada.store.config import StoreOptions, build_config, load_project_config

    options = StoreOptions()
    given = [x for x in (args.preset, args.config, args.source_dir) if x]
    if len(given) != 1:
        raise ConfigError("give exactly one of --preset, --config, or --source-dir/--target-dir")
    if args.preset:
        cfg = preset_config(args.preset, args.method, args.seed or 0, args.set)
    elif args.config:  # the config's own seed: kept unless --seed or --set seed=N is given
        seed = [] if args.seed is None else [f"seed={args.seed}"]
        cfg, options = load_project_config(args.config, [*seed, *args.set])
    else:
        if not args.target_dir:
            raise ConfigError("--source-dir needs --target-dir")
        from eada.config import apply_overrides

        raw: dict[str, Any] = {
            "name": "folders",
            "seed": args.seed or 0,
            "data": {
                "kind": "folders",
                "source": str(Path(args.source_dir).absolute()),
                "target": str(Path(args.target_dir).absolute()),
                "image_size": args.image_size,
            },
            "model": {"name": "lenet"},
            "optim": {"name": "adam", "lr": 0.001},
            "train": {"epochs": 7, "batch_size": 32},
            "active": {"strategy": "eada", "rounds_at": [1, 2, 3, 4, 5], "budget_per_round": 0.01},
        }
        cfg = build_config(apply_overrides(raw, args.set), "--source-dir/--target-dir project")
    roots = [Path(r) for r in args.allow_root]
    if args.store is None:
        args.store = os.environ.get("EADA_STORE") or FALLBACK_STORE
    proj = init_project(args.store, cfg, roots, options, progress=_log)
    st = proj.status()
    labeled = "labeled" if proj.target_labeled else "unlabeled"
    console.print(
        f"project {args.store}: {len(proj.store.samples('source'))} source and "
        f"{st['n_target']} {labeled} target samples, {len(proj.classes)} classes; "
        f"plan: {len(proj.plan())} rounds"
    )
    _say_next(f"eada train --store {quote(args.store)}")
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    proj = _project(args)
    _note_pool(proj)
    if args.again and args.audit is None:
        raise ValueError("--again draws another audit: give it with --audit N")
    if args.audit is not None:
        if args.budget is not None:
            raise ValueError("--audit N draws N random samples; drop --budget")
        out = proj.audit(args.audit, again=args.again)
        if out.get("repeated"):
            _say(
                f"round {out['round']}: this audit (--audit {args.audit}) was drawn already "
                "with the same model and labels; its files are exported again and no second "
                "audit is drawn (add --again to draw another)"
            )
        elif out["reexported"]:
            _say(
                f"round {out['round']}: the audit round recorded by an interrupted `eada query "
                "--audit` is exported now (no second audit is drawn)"
            )
        else:
            minus = ""
            if out.get("excluded_pending"):
                minus = (
                    f" (the unlabeled pool minus the {out['excluded_pending']} samples round "
                    f"{out['pending_round']} has out for labeling)"
                )
            _say(
                f"round {out['round']}: {out['selected']} samples drawn uniformly at random from "
                f"a pool of {out['pool']}{minus} (audit round; blind: no model guess in its "
                "files or tasks)"
            )
    else:
        out = proj.query(budget=args.budget)
        if out["reexported"]:
            waiting = (
                f", {out['awaiting']} of them awaiting more answers" if out.get("awaiting") else ""
            )
            console.print(
                f"round {out['round']}: {out['pending']} of its {out['selected']} samples still "
                f"await an answer ({out['labeled']} labeled, {out['skipped']} skipped{waiting}); "
                "exported again"
            )
        else:
            console.print(f"round {out['round']}: {out['selected']} samples selected")
    if out.get("labelstudio_error"):
        _log(
            f"warning: the round is recorded and exported, but Label Studio did not take it: "
            f"{out['labelstudio_error']}; retry with "
            f"`eada labelstudio push --store {quote(args.store)}`"
        )
    for k, v in out["files"].items():
        console.print(f"  {k:<20} {v}")
    if "json" in out["files"]:
        doc = json.loads(Path(out["files"]["json"]).read_text())
        root = doc.get("label_studio_document_root")
        if root is not None:  # None: feature rows (no files served), or no safe folder
            console.print(
                f"  Label Studio: LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={quote(root)}",
                soft_wrap=True,
                highlight=False,
            )
        elif doc.get("label_studio_note"):
            console.print(f"  Label Studio: {doc['label_studio_note']}")
    from eada.store import labelstudio

    ls = labelstudio.connection(proj)
    pushed = ls is not None and out["round"] in (ls.get("pushed") or [])
    if pushed:
        assert ls is not None
        where = f"{ls['url']}/projects/{ls['project']}"
        _say(
            f"  pushed to Label Studio: round {out['round']}'s tasks are in project "
            f"{ls['project']} ({where}/data); do not import its Label Studio JSON there by "
            "hand (that makes duplicate tasks)"
        )
        _say_next(
            f"eada labelstudio pull --store {quote(args.store)}   (once the round is labeled "
            f"in Label Studio, {where})"
        )
    elif "csv" in out["files"]:
        _say_next(
            f"eada label import {quote(out['files']['csv'])} --store {quote(args.store)}   "
            "(once its label column is filled)"
        )
    return 0


def _note_pool(proj: Any) -> None:
    """Say on stderr when the target's files changed since registered (naming the command)."""
    note = proj.pool_note()
    if note is not None:
        _log(f"note: {note}")


def _cmd_target_scan(args: argparse.Namespace) -> int:
    from eada.store.roots import shown_name

    proj = _project(args)
    out = proj.scan_target(progress=_log)
    rows = out.get("unit") == "rows"
    tail = (
        ""
        if rows
        else f", {len(out['bad'])} left out (unreadable, or outside the data roots); features "
        f"extracted for {out['extracted']} image(s)"
    )
    console.print(
        f"target scan of {args.store}: {len(out['new'])} new {'row' if rows else 'file'}(s) "
        f"registered, {len(out['returned'])} returned, {len(out['vanished'])} vanished (left "
        f"out of the pool){tail}; the pool holds {out['n_target']} samples",
        soft_wrap=True,
    )
    for p in out["vanished"]:
        console.print(f"  vanished: {p}", soft_wrap=True, highlight=False)
    for p, why in ({} if rows else out["bad"]).items():
        console.print(f"  not registered: {shown_name(p)} ({why})", soft_wrap=True, highlight=False)
    _say_next(next_command(proj.next_action(), args.store, proj))
    return 0


def _cmd_label_import(args: argparse.Namespace) -> int:
    from eada.store.data import shown_name

    proj = _project(args)
    out = proj.import_labels(args.file, args.annotator, args.allow_unqueried, args.force)
    _say(f"imported {shown_name(args.file)} ({out['format']}): {import_summary(out)}")
    print_disputes(out["disputes"], args.store, proj=proj)
    print_attention(out.get("needs_attention") or [])
    _say_next(next_command(proj.next_action(), args.store, proj))
    return 0


def _say(text: str) -> None:
    """One unwrapped line on stdout (file names and annotators are never split)."""
    console.print(text, soft_wrap=True, highlight=False, markup=False)


def print_disputes(
    disputes: list[dict[str, Any]], store: str, head: str = "disputed", proj: Any = None
) -> None:
    """Each open dispute on one line (sample, file, every annotator's answer and where it
    came from) and what settles them under the project's ``store.conflicts`` policy."""
    from eada.store.agreement import dispute_line

    if not disputes:
        return
    _say(
        f"{len(disputes)} {head} sample(s): the annotators disagree; they stay unanswered "
        "(or keep the label in force) until they agree, a reviewer answers, or a policy "
        f"settles them: {settle_hint(store, None if proj is None else proj.options)}"
    )
    for d in disputes[:MAX_LISTED]:
        _say(f"  {dispute_line(d)}")
    if len(disputes) > MAX_LISTED:
        _say(f"  ... and {len(disputes) - MAX_LISTED} more (eada status --json lists them all)")


def print_attention(entries: list[dict[str, Any]], head: str = "") -> None:
    """Each sample that needs attention on one line: what is wrong, the task, the annotator
    and the one action that clears it (:func:`eada.store.attention.attention_line`)."""
    from eada.store.attention import attention_line

    if not entries:
        return
    n = len({a["sample_id"] for a in entries})
    _say(
        f"{n} {head}sample(s) need attention: an answer could not be used; everything else "
        "was imported, and training goes on without them until the action is done"
    )
    for a in entries[:MAX_LISTED]:
        _say(f"  {attention_line(a)}")
    if len(entries) > MAX_LISTED:
        _say(f"  ... and {len(entries) - MAX_LISTED} more (eada status --json lists them all)")


def settle_hint(store: str, options: Any = None) -> str:
    """What settles the open disputes under the policy in force (``options``: the project's
    :class:`~eada.store.config.StoreOptions`); never the policy already set."""
    s = quote(store)
    policy = "refuse" if options is None else options.conflicts
    if policy == "majority" and options.conflict_tie == "reviewer":
        return (
            f"under store.conflicts=majority each is a tie, which the tie rule "
            f"(store.conflict_tie=reviewer) leaves to the reviewer {options.reviewer}: they await "
            f"{options.reviewer}'s answer (or another annotator's, which breaks the tie)"
        )
    if policy == "majority":
        return (
            "under store.conflicts=majority each is a tie (as many answers for each side, "
            "e.g. 1-1 with two annotators), which majority cannot settle: another annotator's "
            "answer breaks it, or set the tie rule: eada config set --store "
            f"{s} store.conflict_tie=newest-wins (or store.conflict_tie=reviewer "
            "store.reviewer=NAME), or store.conflicts=reviewer store.reviewer=NAME"
        )
    if policy == "reviewer":
        return (
            f"under store.conflicts=reviewer they await the reviewer {options.reviewer}'s "
            f"answer (or name another: eada config set --store {s} store.reviewer=NAME)"
        )
    return (
        f"eada config set --store {s} store.conflicts=reviewer store.reviewer=NAME (or "
        "majority, with three or more annotators, or newest-wins)"
    )


def import_summary(out: dict[str, Any]) -> str:
    """``3 new, 1 corrections, 1 skipped, 0 unchanged; 2 queried samples await an answer``."""
    parts = [f"{out['new']} new", f"{out['corrections']} corrections", f"{out['skipped']} skipped"]
    if out.get("unskipped"):
        parts.append(f"{out['unskipped']} skips undone by a label")
    parts.append(f"{out['unchanged']} unchanged")
    text = ", ".join(parts)
    if out.get("replaced_other_annotators"):
        n_forced = out["replaced_other_annotators"]
        text += f" ({n_forced} replaced another annotator's label by the conflicts policy)"
    if out.get("settled"):
        text += f", {out['settled']} disagreement(s) settled"
    if out.get("disputes"):
        text += f", {len(out['disputes'])} disputed"
    if out.get("awaiting"):
        from eada.store.agreement import awaiting_text

        text += f", {awaiting_text(out['awaiting'], out['answers_needed'])}"
    if out.get("needs_attention"):
        n_att = len({a["sample_id"] for a in out["needs_attention"]})
        text += f", {n_att} need attention"
    if out.get("attention_cleared"):
        text += f", {len(out['attention_cleared'])} no longer need attention"
    n = out["pending"]
    verb = "sample awaits" if n == 1 else "samples await"
    return text + f"; {n} queried {verb} an answer"


def _cmd_train(args: argparse.Namespace) -> int:
    proj = _project(args)
    _note_pool(proj)
    if args.simulate:
        if args.epochs is not None:
            raise ValueError("--simulate follows the config's schedule; drop --epochs")
        st = proj.run_simulated(progress=_log)
        _print_status(st, args.store, proj)
        return 0
    if args.partial and args.epochs is not None:
        raise ValueError("--partial trains up to the next planned round; drop --epochs")
    out = proj.train(epochs=args.epochs, progress=_log, partial=args.partial)
    m = out["metrics"]
    accs = [
        f"{name} accuracy {m[key]['accuracy']:.2f}%"
        for key, name in (("target", "target"), ("heldout", "held-out"))
        if isinstance(m.get(key), dict)
    ]
    console.print(
        f"trained epochs {out['from_epoch']}->{out['epoch']} with {out['n_labeled']} target "
        f"labels: {'; '.join(accs) or 'no labeled split to measure accuracy on'}"
    )
    _say_next(next_command(proj.next_action(), args.store, proj))
    return 0


def _cmd_ls_connect(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    out = labelstudio.connect(
        _project(args), args.url, args.project, args.title, root=args.root, overlap=args.overlap
    )
    storages = ", ".join(f"{i} ({p})" for p, i in (out.get("storage_paths") or {}).items())
    _say(
        f"connected {args.store} to Label Studio project {out['project']} at {out['url']} "
        f"(local-files storage {storages or out['storage']}, document root "
        f"{out['document_root']}"
        + (
            f", {out['overlap']} annotators a task: store.answers_needed={out['answers_needed']}"
            if out.get("overlap")
            else ""
        )
        + f"); rounds pushed: {out['pushed'] or 'none yet'}"
        + (
            f" (already pushed before: {out['already_pushed']})"
            if out.get("already_pushed")
            else ""
        )
    )
    if out["document_root"]:
        _say(
            "  Label Studio must run with LABEL_STUDIO_LOCAL_FILES_SERVING_ENABLED=true and "
            f"LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT={quote(out['document_root'])}"
        )
    console.print(f"  open {out['url']}/projects/{out['project']}/data")
    return 0


def _cmd_ls_push(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    proj = _project(args)
    pushed = labelstudio.push_pending(proj)
    console.print(f"rounds pushed to Label Studio: {pushed or 'none (all were pushed)'}")
    again = labelstudio.recreate_deleted(proj)
    if again:
        _say(
            f"tasks re-created for {len(again)} sample(s) whose task was deleted in Label "
            f"Studio: {', '.join(map(str, again))}"
        )
    return 0


def _cmd_ls_reopen(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    proj = _project(args)
    out = labelstudio.reopen(proj, args.samples)
    for r in out["reopened"]:
        _say(
            f"sample {r['sample_id']}: task {r['task']} served again"
            + (
                f" ({len(r['deleted_annotations'])} unusable annotation(s) deleted in Label "
                "Studio; eada keeps what it recorded)"
                if r["deleted_annotations"]
                else ""
            )
        )
    if out["recreated"]:
        _say(f"tasks re-created for sample(s) {', '.join(map(str, out['recreated']))}")
    _say_next(
        f"eada labelstudio pull --store {quote(args.store)}   (once the task is answered again)"
    )
    return 0


def _cmd_ls_pull(args: argparse.Namespace) -> int:
    from eada.store import labelstudio

    proj = _project(args)
    out = labelstudio.pull(proj, force=args.force)
    _say(f"pulled {out['file']}: {import_summary(out)}")
    if out.get("duplicate_tasks"):
        dup = out["duplicate_tasks"]
        _say(
            f"warning: {len(dup)} sample(s) have more than one task in Label Studio (a round's "
            "Label Studio JSON imported by hand after it was pushed?): "
            + "; ".join(f"sample {sid}: tasks {', '.join(map(str, t))}" for sid, t in dup.items())
            + f". `eada labelstudio reopen SAMPLE... --store {quote(args.store)}` keeps one "
            "task each where one annotator answered two of them differently"
        )
    if out.get("deleted_answers"):
        _say(
            f"{out['deleted_answers']} answer(s) deleted in Label Studio since the last pull "
            "(kept in the store, marked deleted in votes.csv)"
        )
    print_disputes(out["disputes"], args.store, proj=proj)
    from eada.store.attention import needs_attention

    print_attention(needs_attention(proj.store.conn))
    _say_next(next_command(proj.next_action(), args.store, proj))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from eada.store.serve import make_server

    server = make_server(_project(args), args.host, args.port)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    _log(
        f"eada serve: Label Studio ML backend for {args.store} at http://{host}:{port} "
        "(/health, /setup, /predict, /webhook); Ctrl-C stops it"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _print_status(st: dict[str, Any], store: str, proj: Any = None) -> None:
    from eada.store.unlabeled import audit_headline

    console.print(
        f"mode {st['mode']}, epoch {st['epoch']}, labeled {st['n_labeled']}/{st['n_target']} "
        f"({st['budget_spent_percent']:.2f}% of the target), skipped {st['n_skipped']}, "
        f"corrections {st['corrections']}"
    )
    if st.get("upgraded_in_memory_from") is not None:
        _say(
            f"note: this store's file has schema version {st['upgraded_in_memory_from']} and is "
            "read-only for you: it was upgraded in memory to be read, and the file is unchanged; "
            "any eada command run by a user who may write it upgrades the file"
        )
    _say_next(next_command(st["next"], store, proj))
    cols: tuple[str, ...] = ("round", "epoch", "strategy", "selected", "labeled", "skipped")
    cols += ("pending",) if st.get("answers_needed", 1) == 1 else ("pending", "awaiting")
    if any(r.get("needs_attention") for r in st["rounds"]):
        cols += ("needs_attention",)
    t = Table(title="rounds")
    for col in cols:
        t.add_column(col)
    for r in st["rounds"]:
        t.add_row(*[str(r.get(c, 0)) for c in cols])
    console.print(t)
    if st["skipped_by_reason"]:
        console.print(
            "skipped by reason: "
            + "; ".join(f"{why}: {n}" for why, n in st["skipped_by_reason"].items())
        )
    if st["annotators"]:
        console.print(
            "answers in force by annotator: "
            + "; ".join(
                f"{who}: {c['labeled']} labeled, {c['skipped']} skipped"
                for who, c in st["annotators"].items()
            )
        )
    if st.get("answers_by_annotator"):
        _say(
            "answers by annotator (each sample once, agreeing answers included): "
            + "; ".join(
                f"{who}: {c['answers']} ({c['labeled']} labels, {c['skipped']} skips; "
                f"{c['match_in_force']} as in force)"
                for who, c in st["answers_by_annotator"].items()
            )
        )
    if st.get("awaiting"):
        from eada.store.agreement import awaiting_text

        _say(
            f"answers needed per sample: {st['answers_needed']}; "
            + awaiting_text(st["awaiting"], st["answers_needed"])
            + " (pending until then; `eada train --partial` trains on what is settled)"
        )
    if st.get("disputes"):
        print_disputes(st["disputes"], store, proj=proj)
    print_attention(st.get("needs_attention") or [])
    for a in st.get("agreement") or []:
        kappa = "undefined" if a["kappa"] is None else f"{a['kappa']:.3f}"
        _say(
            f"agreement {a['annotators'][0]} / {a['annotators'][1]}: {a['agree']}/{a['n']} "
            f"samples answered alike ({a['percent']:.1f}%), Cohen's kappa {kappa}"
        )
    h = Table(title="accuracy history")
    for col in ("epoch", "labeled", "target %", "heldout %"):
        h.add_column(col, justify="right")
    for e in st["history"]:
        h.add_row(
            str(e["epoch"]),
            str(e["n_labeled"]),
            *[f"{e[k]:.2f}" if k in e else "-" for k in ("target_accuracy", "heldout_accuracy")],
        )
    console.print(h)
    acc = st.get("accuracy") or {}
    for key, name in (("heldout", "held-out"), ("target", "target"), ("queried", "queried")):
        a = acc.get(key)
        if a is not None:
            console.print(f"{name} accuracy {a['accuracy']:.2f}% ({a['note']})")
    audit = st.get("audit") or {}
    if not any(acc.get(k) for k in ("heldout", "target", "queried")) and not audit.get("latest"):
        console.print("accuracy: nothing labeled to measure it on yet")
    for a in audit.get("rounds", []):
        head = audit_headline(a)
        if a["accuracy"] is None:
            console.print(f"{head}: no label yet")
        else:
            lo, hi = a["ci95"]
            console.print(
                f"{head}: {a['predicted_right']}/{a['labeled']} right -> {a['accuracy']:.1f}% "
                f"(95% Wilson interval {lo:.1f}-{hi:.1f}%)"
                + (f", {a['pending']} await labels" if a["pending"] else "")
            )
    pool = st.get("pool") or {}
    if pool.get("scans"):
        last = pool["scans"][-1]
        console.print(
            f"target scans: {len(pool['scans'])}, the last at {last['time']} ({last['new']} new, "
            f"{last['vanished']} vanished); {pool['left_out']} vanished file(s) left out",
            soft_wrap=True,
        )
    cov = st.get("coverage")
    if cov is not None:
        missing = ", ".join(cov["missing"][:10]) + (" ..." if len(cov["missing"]) > 10 else "")
        console.print(
            f"labeled classes: {cov['labeled_classes']} of {cov['classes']}"
            + (f" (no label yet: {missing})" if cov["missing"] else "")
        )
    pp = st.get("pool_predicted")
    if pp is not None:
        top = ", ".join(f"{k} {v}" for k, v in list(pp["counts"].items())[:8])
        console.print(
            f"predicted classes of the pool scored at round {pp['round']} ({pp['n']} samples, "
            f"model of epoch {pp['epoch']}): {top}"
            + (f" ... ({len(pp['counts'])} classes)" if len(pp["counts"]) > 8 else "")
        )


def _cmd_status(args: argparse.Namespace) -> int:
    proj = _project(args)
    st = proj.status()
    if args.json:
        st["next_command"] = next_command(st["next"], args.store, proj)
        sys.stdout.write(json.dumps(st, indent=1) + "\n")
    else:
        _print_status(st, args.store, proj)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    files = _project(args).export(args.out, force=args.force)
    for k, v in files.items():
        console.print(f"{k:<20} {v}")
    return 0


def _cmd_config_set(args: argparse.Namespace) -> int:
    from eada.store.config import parse_setting

    updates = dict(parse_setting(item) for item in args.pairs)  # strings stay exact text
    proj = _project(args)
    out = proj.set_options(updates, yes=args.yes)
    _say(f"project {args.store}: " + ", ".join(f"store.{k}={out['store'][k]}" for k in updates))
    for w in out["warnings"]:
        _log(f"warning: {w}")
    got = out["settled"]
    from eada.store.agreement import change_line

    if got.get("changed"):
        _say(
            f"{len(got['changed'])} label(s) changed by the new setting "
            "(sample: old label (its annotator) -> new label (its annotator, how)):"
        )
        for ch in got["changed"]:
            _say(f"  {change_line(ch)}")
    if got.get("settled"):
        _say(f"{got['settled']} dispute(s) settled by the new policy")
    if got.get("opened"):
        _say(
            f"{len(got['opened'])} sample(s) disputed under the new setting (their annotators "
            "disagree and it settles none of them)"
        )
    now_in_force = got.get("new", 0) + got.get("skipped", 0) + got.get("unskipped", 0)
    if "answers_needed" in updates and now_in_force:
        _say(f"{now_in_force} sample(s) awaiting answers now have enough: their answer is in force")
    print_disputes(proj.status()["disputes"], args.store, head="still disputed", proj=proj)
    return 0


def add_config_set(csub: Any) -> None:
    """``eada config set --store DIR store.KEY=VALUE ...`` under ``eada config``."""
    p = csub.add_parser(
        "set",
        help="change the store: section of a project after init (store.conflicts, "
        "store.conflict_tie, store.reviewer, store.label_studio_root, "
        "store.near_duplicate_threshold, store.answers_needed)",
    )
    p.add_argument("pairs", nargs="+", metavar="store.KEY=VALUE")
    p.add_argument(
        "--yes",
        action="store_true",
        help="apply a change that overwrites a reviewer's decision or more than a fifth of "
        "the settled labels (listed, and refused without --yes)",
    )
    p.add_argument("--store", default=None, help="project folder (as for the other commands)")
    p.set_defaults(func=_cmd_config_set)


def add_store_commands(sub: Any) -> None:
    """Add ``init``, ``query``, ``label import``, ``train``, ``status`` and ``export`` to the
    ``eada`` subparsers ``sub``."""
    from eada.plugins import add_plugin_argument

    def store_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--store",
            default=None,
            help=(
                "project folder (default: $EADA_STORE, else the current folder when it holds "
                f"eada.sqlite, else {FALLBACK_STORE})"
            ),
        )

    p = sub.add_parser("init", help="create a project store: register source and target data")
    store_arg(p)
    p.add_argument("--preset", default=None, help="a preset (see `eada presets`)")
    p.add_argument("--method", default=None, help="method variant of the preset")
    p.add_argument("--config", default=None, help="a YAML experiment config")
    p.add_argument("--source-dir", default=None, help="source image folder (CLASS/*.jpg)")
    p.add_argument("--target-dir", default=None, help="target image folder (CLASS/*.jpg)")
    p.add_argument("--image-size", type=int, default=32, help="image side for folders")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the seed (default: the config's seed:, else 0; --set seed=N works too)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable)",
    )
    p.add_argument(
        "--allow-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder outside the config's data folders that the project's files (image "
        "lists, symlinks) and label imports may point into; recorded in the store "
        "(repeatable; the store never adds one by itself)",
    )
    from eada.threads import add_threads_argument

    add_threads_argument(  # eada.cli.main applies it
        p,
        "threads of the first feature extraction (ONNX Runtime or torch) and of any training "
        "init does (default: OMP_NUM_THREADS if set, else all cores)",
    )
    add_plugin_argument(p)
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("query", help="score the unlabeled pool, select a batch, export it")
    store_arg(p)
    p.add_argument("--budget", type=int, default=None, help="override the planned batch size")
    add_threads_argument(p)
    p.add_argument(
        "--audit",
        type=int,
        default=None,
        metavar="N",
        help=(
            "draw N samples uniformly at random from the unlabeled pool (an audit round, "
            "outside the schedule): their labels give an unbiased accuracy estimate"
        ),
    )
    p.add_argument(
        "--again",
        action="store_true",
        help=(
            "with --audit: draw another audit even when the last round is an audit of the "
            "same N, model and labels (without it, that audit's files are exported again)"
        ),
    )
    add_plugin_argument(p)
    p.set_defaults(func=_cmd_query)

    lab = sub.add_parser("label", help="label files")
    lsub = lab.add_subparsers(dest="label_command", required=True)
    p = lsub.add_parser("import", help="import labels (CSV, JSON, Label Studio JSON export)")
    p.add_argument("file")
    store_arg(p)
    p.add_argument(
        "--annotator",
        default=os.environ.get("USER", "unknown"),
        help="who labeled (when the file does not say)",
    )
    p.add_argument(
        "--allow-unqueried", action="store_true", help="accept labels for samples no round queried"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let a label replace ANOTHER annotator's label (else a dispute: eada status)",
    )
    p.set_defaults(func=_cmd_label_import)

    p = sub.add_parser("train", help="train with every label so far (or --simulate a run)")
    store_arg(p)
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="train N more epochs (default: up to the next planned round)",
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="run the whole schedule with a simulated oracle (resumable)",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="the last round still awaits answers: train with the labels it has so far",
    )

    add_threads_argument(p)
    add_plugin_argument(p)
    p.set_defaults(func=_cmd_train)

    ls = sub.add_parser("labelstudio", help="a live Label Studio project for the rounds")
    lssub = ls.add_subparsers(dest="labelstudio_command", required=True)
    p = lssub.add_parser(
        "connect",
        help="create (or use) a Label Studio project with the classes and the image storage, "
        "and push the rounds (token: $LABEL_STUDIO_API_KEY)",
    )
    store_arg(p)
    p.add_argument("--url", required=True, help="the Label Studio server, http://HOST:PORT")
    p.add_argument("--project", type=int, default=None, help="use this existing project id")
    p.add_argument("--title", default=None, help="title of the project to create")
    p.add_argument(
        "--root",
        default=None,
        metavar="DIR",
        help="the folder Label Studio serves files from (its "
        "LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT): recorded as store.label_studio_root; needed "
        "where the data roots share no safe folder",
    )
    p.add_argument(
        "--overlap",
        type=int,
        default=None,
        metavar="N",
        help="ask N annotators for every task (Label Studio's overlap) and set "
        "store.answers_needed=N: a sample counts once N answers agree; disagreements become "
        "disputes, settled by store.conflicts",
    )
    p.set_defaults(func=_cmd_ls_connect)
    p = lssub.add_parser(
        "push",
        help="send the rounds Label Studio has not received yet, and re-create the tasks "
        "deleted there of samples that still need answers",
    )
    store_arg(p)
    p.set_defaults(func=_cmd_ls_push)
    p = lssub.add_parser(
        "reopen",
        help="serve the tasks of samples that need attention again (their unusable "
        "annotations deleted in Label Studio; a deleted task re-created)",
    )
    p.add_argument("samples", nargs="+", type=int, metavar="SAMPLE", help="sample ids")
    store_arg(p)
    p.set_defaults(func=_cmd_ls_reopen)
    p = lssub.add_parser("pull", help="import the submitted annotations and skips")
    store_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="let an annotation replace ANOTHER annotator's label (else a dispute: eada status)",
    )
    p.set_defaults(func=_cmd_ls_pull)

    p = sub.add_parser(
        "serve", help="Label Studio's ML-backend protocol for interactive pre-annotation"
    )
    store_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9090, help="port (0: a free one)")
    p.set_defaults(func=_cmd_serve)

    tg = sub.add_parser("target", help="the target pool of a project")
    tsub = tg.add_subparsers(dest="target_command", required=True)
    p = tsub.add_parser(
        "scan",
        help="register new target files (features for the new ones only) or feature rows with "
        "new ids, leave out vanished ones",
    )
    store_arg(p)
    p.set_defaults(func=_cmd_target_scan)

    p = sub.add_parser("status", help="rounds, budget spent, accuracy history")
    store_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("export", help="export labels (CSV) and the final model")
    store_arg(p)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the export already in --out (a folder holding other files is never replaced)",
    )
    p.set_defaults(func=_cmd_export)
