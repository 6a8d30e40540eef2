"""``eada report PROJECT``: one self-contained HTML page for an annotation project store.

It shows the rounds (strategy, epoch, selected/labeled/pending), the labels over time (every
import and its new/corrected/unchanged counts, cumulative labels), the accuracy wherever it can
be measured (a labeled held-out split; the target's own labels where the data carries them;
the queried samples' labels, named as biased) and, for image projects, the queried images of
every round with their rank, the model's prediction at query time and the human label
(mispredictions in a red frame). Nothing is computed from an unlabeled target's placeholder
labels.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from eada.reports.figures_runs import PALETTE, plot_image_grid
from eada.reports.html import _e, _Figures, _table, write_html
from eada.store.unlabeled import QUERIED_NOTE, audit_headline

THUMB = 160  # pixels of the square the images are decoded into


def is_project(path: Path) -> bool:
    """Whether ``path`` is a project store folder (holds ``eada.sqlite``)."""
    return (Path(path) / "eada.sqlite").is_file()


def _thumbnail(path: str) -> np.ndarray | None:
    from PIL import Image

    try:
        with Image.open(path) as raw:
            im = raw.convert("RGB")
        side = min(im.size)
        left, top = (im.width - side) // 2, (im.height - side) // 2
        im = im.crop((left, top, left + side, top + side)).resize((THUMB, THUMB))
        return np.asarray(im, dtype=np.uint8)
    except OSError:
        return None


def _labels_figure(times: list[_dt.datetime], counts: list[int]) -> Figure:
    fig = Figure(figsize=(5.6, 3.0))
    ax = fig.add_subplot()
    ax.step(times, counts, where="post", color=PALETTE[0], lw=1.8)  # type: ignore[arg-type]
    ax.plot(times, counts, "o", color=PALETTE[0], ms=4)  # type: ignore[arg-type]
    ax.set_ylabel("labels in force")
    ax.set_xlabel("time (UTC)")
    ax.set_ylim(0, max(counts) * 1.08 + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if len(times) == 1 or times[0] == times[-1]:  # matplotlib would span years around it
        hour = _dt.timedelta(hours=1)
        ax.set_xlim(times[0] - hour, times[0] + hour)  # type: ignore[arg-type]
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def _accuracy_figure(series: dict[str, tuple[list[int], list[float]]]) -> Figure:
    fig = Figure(figsize=(5.6, 3.4))
    ax = fig.add_subplot()
    for i, (name, (x, y)) in enumerate(series.items()):
        ax.plot(x, y, marker="o", ms=4, lw=1.6, color=PALETTE[i % len(PALETTE)], label=name)
    ax.set_xlabel("target labels")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _queried_grid(project: Any, figs: _Figures, per_round: int) -> str:
    answers = {r["sample_id"]: r for r in project.store.answers()}
    labels = {k: r["class_name"] for k, r in answers.items() if r["class_name"] is not None}
    rows: list[tuple[Any, ...]] = []
    table: list[list[Any]] = []
    for rnd in project.store.rounds():
        name = f"{'audit ' if rnd['strategy'] == 'audit' else ''}round {rnd['number']}"
        imgs: list[np.ndarray] = []
        caps: list[str] = []
        wrong: list[bool] = []
        for s in project.store.selected(rnd["id"]):
            pred = json.loads(s["scores"])["predicted"]
            label = labels.get(s["sample_id"])
            ans = answers.get(s["sample_id"])
            shown = label or (f"skipped: {ans['skip_reason']}" if ans is not None else "-")
            who = "-" if ans is None else ans["annotator"]
            table.append([name, s["rank"] + 1, s["sample_id"], s["path"] or "-", pred, shown, who])
            if len(imgs) >= per_round or not s["path"]:
                continue
            img = _thumbnail(s["path"])
            if img is None:
                continue
            imgs.append(img)
            skip = ans is not None and label is None
            caps.append(f"#{s['rank'] + 1} p={pred} y={'skipped' if skip else label or '?'}")
            wrong.append(label is not None and label != pred)
        if imgs:
            rows.append((name, np.stack(imgs), caps, wrong))
    out = []
    if rows:
        out.append(
            figs.html(
                plot_image_grid(rows, max_cols=per_round),
                "queried images",
                f"The first {per_round} images queried in each round, in the strategy's order "
                "(#rank; p = the model's prediction when it selected them; y = the label in "
                "force, ? = not labeled yet; red frame: p differs from y).",
            )
        )
    elif table:
        out.append('<p class="note">The samples are feature rows: no images to show.</p>')
    if table:
        out.append(
            f"<details><summary>{len(table)} queried samples</summary>"
            + _table(["round", "rank", "sample id", "path", "predicted", "label", "by"], table)
            + "</details>"
        )
    return "".join(out)


def counts_of(row: Any) -> list[int]:
    """An import's new / corrected / skipped / unchanged counts."""
    return [row["n_new"], row["n_corrections"], row["n_skipped"], row["n_unchanged"]]


def build_project_report(folder: Path, out: Path | None = None, per_round: int = 8) -> Path:
    """Write the HTML report of the project store at ``folder`` (default
    ``folder/report.html``) and return its path. Everything is read in one read transaction
    (:meth:`eada.store.db.Store.snapshot`) and the page is written atomically: a killed or
    failed report (a full disk) leaves the previous page whole, and its error names ``out``."""
    from eada.runs import check_not_store
    from eada.store import Project

    out = Path(out) if out is not None else Path(folder) / "report.html"
    check_not_store(out)  # before any work: never over the store's own files
    project = Project(folder)
    try:
        with project.store.snapshot():  # one read transaction: every section agrees
            parts, name = _project_parts(project, folder, per_round)
    finally:
        project.close()
    return write_html(out, f"eada project {name}", parts)  # atomic; errors name out


def _project_parts(project: Any, folder: Path, per_round: int) -> tuple[list[str], str]:
    """The sections of a project's report (read inside the caller's read transaction)."""
    figs = _Figures(None)
    st = project.status()
    acc = st["accuracy"]
    name = Path(folder).resolve().name
    parts = [
        f"<h1>eada project report: {_e(name)}</h1>",
        f'<p class="meta">project {_e(Path(folder).resolve())}; mode {_e(st["mode"])}; '
        f"target {'labeled' if project.target_labeled else 'unlabeled'} "
        f"({st['n_target']} samples, {len(project.classes)} classes); epoch {st['epoch']}; "
        f"generated {_dt.datetime.now().isoformat(timespec='seconds')}</p>",
        "<h2>Rounds</h2>",
    ]
    q_by_round = {r["round"]: r for r in (acc["queried"] or {}).get("rounds", [])}
    rounds = [
        [
            r["round"],
            r["epoch"],
            r["strategy"],
            r["selected"],
            r["labeled"],
            r["skipped"],
            r["pending"],
            "-"
            if q_by_round.get(r["round"], {}).get("accuracy") is None
            else f"{q_by_round[r['round']]['accuracy']:.1f}",
            ", ".join(
                f"{d['sample_id']}~{d['of']} ({d['cosine']:.3f})" for d in r["near_duplicates"]
            )
            or "-",
        ]
        for r in st["rounds"]
    ]
    head = ["round", "epoch", "strategy", "selected", "labeled", "skipped", "pending"]
    head.append("queried acc. %*")
    head.append("near-duplicates**")
    parts.append(_table(head, rounds) if rounds else "<p>No round queried yet.</p>")
    parts.append(f'<p class="note">* queried accuracy: {_e(QUERIED_NOTE)}</p>')
    used = sorted(
        {json.loads(r["info"]).get("near_duplicate_threshold") for r in project.store.rounds()}
        - {None}
    )
    thr = " or ".join(map(str, used)) or "the threshold"
    parts.append(
        '<p class="note">** near-duplicates: sample A~B when A\'s features have a cosine '
        f"similarity of at least {thr} (<code>store.near_duplicate_threshold</code>; by default "
        "0.94 on feature rows, 0.999 on decoded images) with B, selected before it in the "
        "same round; flagged, never removed.</p>"
    )
    if any(r["strategy"] == "audit" for r in st["rounds"]):
        parts.append(
            '<p class="note">strategy <code>audit</code>: a uniformly random audit round '
            "(<code>eada query --audit N</code>), kept out of the active rounds and of "
            "training; its estimate is under Accuracy.</p>"
        )
    parts.append("<h2>Labels over time</h2>")
    imports = list(project.store.conn.execute("SELECT * FROM imports ORDER BY id"))
    rows = [
        [
            i["id"],
            i["created"],
            # a pull names its Label Studio project (a file, its name)
            i["file"] if i["format"] == "label-studio-live" else Path(i["file"]).name,
            i["format"],
            *counts_of(i),
        ]
        for i in imports
    ]
    times, counts, total = [], [], 0
    for i in imports:
        total += i["n_new"]
        times.append(_dt.datetime.fromisoformat(i["created"]))
        counts.append(total)
    if times:
        parts.append(
            figs.html(
                _labels_figure(times, counts),
                "labels over time",
                "Target labels in force after each import.",
                svg=True,
            )
        )
        head = ["import", "time (UTC)", "file", "format", "new", "corrections", "skipped"]
        parts.append(_table([*head, "unchanged"], rows))
        parts.append("<h3>Who answered what</h3>")
        by_who = st["answers_by_annotator"]
        names = sorted(set(by_who) | set(st["annotators"]))
        zero = {"answers": 0, "labeled": 0, "skipped": 0, "match_in_force": 0}
        who = [
            [
                k,
                by_who.get(k, zero)["answers"],
                by_who.get(k, zero)["labeled"],
                by_who.get(k, zero)["skipped"],
                by_who.get(k, zero)["match_in_force"],
                st["annotators"].get(k, {}).get("labeled", 0),
                st["annotators"].get(k, {}).get("skipped", 0),
            ]
            for k in names
        ]
        parts.append(
            _table(
                [
                    "annotator",
                    "answers",
                    "labels",
                    "skips",
                    "as in force",
                    "labels in force credited",
                    "skips in force credited",
                ],
                who,
            )
        )
        parts.append(
            '<p class="note">answers: every sample the annotator answered (their newest '
            "answer each), agreeing ones included; as in force: how many of them equal the "
            "answer in force; credited: the answers in force recorded under their name (where "
            "several agree, the newest). Every answer, older ones too, is in "
            "<code>votes.csv</code> of <code>eada export</code>.</p>"
        )
        if st["awaiting"]:
            parts.append(
                f"<p>{len(st['awaiting'])} sample(s) await more answers "
                f"(<code>store.answers_needed: {st['answers_needed']}</code>): pending, out "
                "of training, until enough annotators agree.</p>"
            )
        parts.append("<h3>Disagreements between annotators</h3>")
        pol = st["conflicts"]
        parts.append(
            f'<p class="note">policy <code>store.conflicts: {_e(pol["policy"])}</code>'
            + (f" (ties: {_e(pol['tie'])})" if pol["policy"] == "majority" else "")
            + (f"; reviewer {_e(pol['reviewer'])}" if pol["reviewer"] else "")
            + "</p>"
        )
        if st["disputes"]:
            parts.append(
                _table(
                    ["sample", "file", "answers (annotator: answer, where)", "in force"],
                    [
                        [
                            d["sample_id"],
                            d["path"] or d.get("external_id") or "-",
                            "; ".join(
                                f"{a}: {ans}"
                                + (f" ({d['origins'][a]})" if d["origins"].get(a) else "")
                                for a, ans in d["answers"].items()
                            ),
                            d["in_force"] or "-",
                        ]
                        for d in st["disputes"]
                    ],
                )
            )
        else:
            parts.append("<p>No open dispute.</p>")
        if st.get("needs_attention"):
            parts.append("<h3>Samples that need attention</h3>")
            parts.append(
                '<p class="note">an answer that could not be used; not trained on until the '
                "action is done</p>"
            )
            parts.append(
                _table(
                    ["sample", "file", "why", "annotator", "task", "action"],
                    [
                        [
                            a["sample_id"],
                            a["path"] or a.get("external_id") or "-",
                            a["why"],
                            a["annotator"],
                            "-" if a["task"] is None else a["task"],
                            a["action"],
                        ]
                        for a in st["needs_attention"]
                    ],
                )
            )
        if st["agreement"]:
            parts.append(
                _table(
                    [
                        "annotators",
                        "samples both answered",
                        "same answer",
                        "agreement %",
                        "Cohen's kappa",
                    ],
                    [
                        [
                            " / ".join(a["annotators"]),
                            a["n"],
                            a["agree"],
                            f"{a['percent']:.1f}",
                            "undefined" if a["kappa"] is None else f"{a['kappa']:.3f}",
                        ]
                        for a in st["agreement"]
                    ],
                )
            )
        if st["skipped_by_reason"]:
            parts.append("<h3>Skipped samples by reason</h3>")
            reasons = [[k, v] for k, v in st["skipped_by_reason"].items()]
            parts.append(_table(["reason", "samples"], reasons))
    else:
        parts.append("<p>No labels imported yet.</p>")
    parts.append("<h2>Accuracy where it can be measured</h2>")
    series: dict[str, tuple[list[int], list[float]]] = {}
    for key, label in (("heldout_accuracy", "held-out split"), ("target_accuracy", "target")):
        pts = [(h["n_labeled"], h[key]) for h in st["history"] if key in h and h["kind"] != "epoch"]
        if pts:
            series[label] = ([p[0] for p in pts], [p[1] for p in pts])
    lines = []
    for key, label in (("heldout", "held-out"), ("target", "target"), ("queried", "queried")):
        a = acc.get(key)
        if a is not None:
            lines.append(f"<li>{label}: <b>{a['accuracy']:.2f}%</b> ({_e(a['note'])})</li>")
    for r in st["audit"]["rounds"]:
        what = audit_headline(r)
        if r["accuracy"] is None:
            lines.append(f"<li>{_e(what)}: no label yet</li>")
        else:
            lo, hi = r["ci95"]
            lines.append(
                f"<li>{_e(what)}: <b>{r['accuracy']:.1f}%</b> (95% Wilson interval "
                f"{lo:.1f}-{hi:.1f}%; {r['predicted_right']}/{r['labeled']} right)</li>"
            )
    if st["audit"]["rounds"]:
        lines.append(f'<li class="note">audit: {_e(st["audit"]["note"])}</li>')
    cov = st["coverage"]
    lines.append(
        f"<li>labeled classes: {cov['labeled_classes']} of {cov['classes']}"
        + (f" (no label yet: {_e(', '.join(cov['missing']))})" if cov["missing"] else "")
        + "</li>"
    )
    pp = st["pool_predicted"]
    if pp is not None:
        dist = ", ".join(f"{k} {v}" for k, v in pp["counts"].items())
        lines.append(
            f"<li>predicted classes of the pool scored at round {pp['round']} ({pp['n']} "
            f"samples, model of epoch {pp['epoch']}): {_e(dist)}</li>"
        )
    if not project.target_labeled:
        lines.append(
            "<li>whole target: not measurable (the target is unlabeled; no accuracy is computed "
            "from labels nobody gave)</li>"
        )
    parts.append(f"<ul>{''.join(lines)}</ul>")
    if series:
        parts.append(
            figs.html(
                _accuracy_figure(series),
                "accuracy",
                "Accuracy after each training segment vs. the target labels it trained with.",
                svg=True,
            )
        )
    parts.append("<h2>Queried samples</h2>")
    parts.append(_queried_grid(project, figs, per_round) or "<p>No round queried yet.</p>")
    config = json.dumps(project.store.get_json("config"), indent=1)
    parts.append(f"<details><summary>config</summary><pre>{_e(config)}</pre></details>")
    return parts, name
