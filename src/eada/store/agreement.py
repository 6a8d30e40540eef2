"""Several annotators on one sample: their answers (``votes``), the policy that settles a
disagreement (``store.conflicts``), the disputes left open, and the agreement between every
pair of annotators.

A *vote* is one annotator's newest answer for a sample: a class, or a skip (any reason: a skip
is one answer, "unusable"). Where the newest votes of a sample disagree, the project's policy
decides (:func:`decide`):

* ``refuse`` -- nobody wins: the sample is *disputed* (listed by every import, ``eada status``,
  the report and the round exports) until the annotators agree, the policy changes or a
  reviewer answers under ``reviewer``;
* ``newest-wins`` -- the newest vote;
* ``majority`` -- the answer most annotators gave; a tie is settled by ``store.conflict_tie``
  (``dispute``: stays disputed, ``newest-wins``, or ``reviewer``: the reviewer's answer when it
  is one of the tied ones);
* ``reviewer`` -- the answer of ``store.reviewer`` (a disagreement stays disputed until the
  reviewer has answered).

Agreement (:func:`pairwise_agreement`): for every pair of annotators who both answered some
samples, the percent of those samples they gave the same answer, and Cohen's kappa
(:func:`sklearn.metrics.cohen_kappa_score`: agreement corrected for the agreement expected
from each annotator's own answer frequencies; ``None`` where it is undefined, e.g. both gave
one and the same answer throughout).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass
from itertools import combinations
from typing import Any

POLICIES = ("refuse", "newest-wins", "majority", "reviewer")
SKIP = "(skip)"  # a skip's answer in agreement tables and dispute listings


@dataclass
class Vote:
    """One annotator's newest answer for a sample.

    Attributes:
        annotator: who answered.
        class_id: the class (``None`` for a skip).
        skip: the skip reason (``None`` for a label).
        created: when (ISO time), for ``newest-wins``.
        seq: order among votes of the same time (a file's row order).
        origin: where it came from (``row 3``, ``Label Studio task 17``).
    """

    annotator: str
    class_id: int | None
    skip: str | None
    created: str
    seq: int = 0
    origin: str = ""

    @property
    def answer(self) -> int | None:
        """The answer compared between annotators: the class id, ``None`` for any skip."""
        return self.class_id

    def newer_key(self) -> tuple[str, int]:
        """Sort key: later votes compare greater."""
        return (self.created, self.seq)


def decide(
    votes: list[Vote], policy: str, tie: str = "dispute", reviewer: str | None = None
) -> tuple[Vote | None, str]:
    """The vote that settles a sample under ``policy``, and how (``agreed``, the policy's
    name, ``majority, tie: ...``), or ``(None, why)`` when the sample stays disputed.

    Example:
        >>> a, b, c = (Vote(n, k, None, "t", i) for i, (n, k) in enumerate(
        ...     [("alice", 1), ("bob", 2), ("carol", 1)]))
        >>> decide([a, b], "refuse")[0] is None
        True
        >>> decide([a, b, c], "majority")[0].annotator, decide([a, b], "newest-wins")[0].annotator
        ('carol', 'bob')
        >>> decide([a, b], "majority", tie="reviewer", reviewer="alice")[0].annotator
        'alice'
    """
    if not votes:
        return None, "no answer"
    newest = max(votes, key=Vote.newer_key)
    if len({v.answer for v in votes}) == 1:
        return newest, "agreed"
    if policy == "newest-wins":
        return newest, "newest-wins"
    if policy == "reviewer":
        mine = [v for v in votes if v.annotator == reviewer]
        return (mine[0], f"reviewer {reviewer}") if mine else (None, f"awaits {reviewer}")
    if policy == "majority":
        counts = Counter(v.answer for v in votes)
        top = max(counts.values())
        tied = [a for a, n in counts.items() if n == top]
        if len(tied) == 1:
            return max((v for v in votes if v.answer == tied[0]), key=Vote.newer_key), "majority"
        if tie == "newest-wins":
            return max((v for v in votes if v.answer in tied), key=Vote.newer_key), (
                "majority, tie: newest-wins"
            )
        if tie == "reviewer":
            mine = [v for v in votes if v.annotator == reviewer and v.answer in tied]
            if mine:
                return mine[0], f"majority, tie: reviewer {reviewer}"
            return None, f"majority tie, awaits {reviewer}"
        return None, "majority tie"
    return None, "refused"


def latest_votes(
    conn: sqlite3.Connection, sample_ids: list[int] | None = None
) -> dict[int, list[Vote]]:
    """``{sample id: [each annotator's newest vote]}`` (of ``sample_ids``, or of every sample)."""
    where, args = "", []
    if sample_ids is not None:
        if not sample_ids:
            return {}
        where = f"AND v.sample_id IN ({','.join('?' * len(sample_ids))})"
        args = list(sample_ids)
    out: dict[int, list[Vote]] = {}
    for r in conn.execute(
        "SELECT v.* FROM votes v WHERE v.id = (SELECT MAX(w.id) FROM votes w WHERE "
        f"w.sample_id = v.sample_id AND w.annotator = v.annotator) {where} ORDER BY v.id",
        args,
    ):
        out.setdefault(int(r["sample_id"]), []).append(
            Vote(
                r["annotator"],
                r["class_id"],
                r["skip_reason"],
                r["created"],
                int(r["id"]),
                r["origin"] or "",
            )
        )
    return out


def open_disputes(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The open disputes: ``[{"sample_id", "path", "external_id", "opened", "answers":
    {annotator: class name or "(skip)"}, "origins": {annotator: where}, "in_force": the
    answer in force or None}]`` by sample id."""
    ids = [
        int(r[0])
        for r in conn.execute(
            "SELECT sample_id FROM disputes WHERE resolved IS NULL ORDER BY sample_id"
        )
    ]
    if not ids:
        return []
    names = {int(r[0]): str(r[1]) for r in conn.execute("SELECT id, name FROM classes")}
    votes = latest_votes(conn, ids)
    out = []
    for sid in ids:
        s = conn.execute("SELECT path FROM samples WHERE id = ?", (sid,)).fetchone()
        d = conn.execute("SELECT opened FROM disputes WHERE sample_id = ?", (sid,)).fetchone()
        ext = _external_id(conn, sid)
        force = conn.execute(
            "SELECT l.class_id, l.skip_reason FROM labels l WHERE l.sample_id = ? AND NOT "
            "EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id)",
            (sid,),
        ).fetchone()
        out.append(
            {
                "sample_id": sid,
                "path": None if s is None else s["path"],
                "external_id": ext,
                "opened": d["opened"],
                "answers": {v.annotator: _name(v, names) for v in votes.get(sid, [])},
                "origins": {v.annotator: v.origin for v in votes.get(sid, [])},
                "in_force": None
                if force is None
                else (SKIP if force["class_id"] is None else names[int(force["class_id"])]),
            }
        )
    return out


def _external_id(conn: sqlite3.Connection, sid: int) -> str | None:
    try:
        row = conn.execute(
            "SELECT external_id FROM sample_info WHERE sample_id = ?", (sid,)
        ).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else row[0]


def _name(v: Vote, names: dict[int, str]) -> str:
    return SKIP if v.class_id is None else names[int(v.class_id)]


def dispute_line(d: dict[str, Any]) -> str:
    """``sample 12 (/data/a.jpg): alice 'stapler' (Label Studio task 3), bob '(skip)'``."""
    where = d["path"] or (f"id {d['external_id']!r}" if d.get("external_id") else None)
    who = ", ".join(
        f"{a} {ans!r}" + (f" ({d['origins'][a]})" if d["origins"].get(a) else "")
        for a, ans in d["answers"].items()
    )
    return f"sample {d['sample_id']}" + (f" ({where})" if where else "") + f": {who}"


def change_line(ch: dict[str, Any]) -> str:
    """One changed label: ``sample 12 (/d/a.jpg): 'circle' (alice) -> 'plus' (bob,
    newest-wins)``.

    >>> change_line({"sample_id": 3, "path": None, "old": "a", "old_by": "al", "new": "b",
    ...     "new_by": "bo", "how": "newest-wins"})
    "sample 3: 'a' (al) -> 'b' (bo, newest-wins)"
    """
    where = f" ({ch['path']})" if ch.get("path") else ""
    old = "no label" if ch["old"] is None else f"{ch['old']!r} ({ch['old_by']})"
    return f"sample {ch['sample_id']}{where}: {old} -> {ch['new']!r} ({ch['new_by']}, {ch['how']})"


def cohen_kappa(a: list[str], b: list[str]) -> float | None:
    """Cohen's kappa of two annotators' answers to the same samples: the agreement ``p_o``
    corrected for the agreement ``p_e`` their answer frequencies give by chance,
    ``(p_o - p_e) / (1 - p_e)`` (the value of :func:`sklearn.metrics.cohen_kappa_score`,
    computed here so that ``eada status`` does not import scikit-learn); ``None`` where it is
    undefined (``p_e = 1``: both always gave the same one answer).

    >>> cohen_kappa(["x", "x", "y", "y"], ["x", "y", "y", "y"])
    0.5
    >>> cohen_kappa(["x", "x"], ["x", "x"]) is None
    True
    """
    n = len(a)
    if n == 0 or n != len(b):
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    count_a, count_b = Counter(a), Counter(b)
    expected = sum(count_a[k] * count_b[k] for k in count_a) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


def pairwise_agreement(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """For every pair of annotators who both answered at least one sample: ``{"annotators":
    [a, b], "n": samples both answered, "agree": how many the same, "percent", "kappa"
    (Cohen's, None where undefined)}``, a skip counting as one answer."""
    by_sample = latest_votes(conn)
    pairs: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for votes in by_sample.values():
        ans = {v.annotator: "skip" if v.class_id is None else str(v.class_id) for v in votes}
        for a, b in combinations(sorted(ans), 2):
            pairs.setdefault((a, b), []).append((ans[a], ans[b]))
    out = []
    for (a, b), got in sorted(pairs.items()):
        ya, yb = [x for x, _ in got], [y for _, y in got]
        agree = sum(x == y for x, y in got)
        kappa = cohen_kappa(ya, yb)
        kappa = None if kappa is None else round(kappa, 4)
        out.append(
            {
                "annotators": [a, b],
                "n": len(got),
                "agree": agree,
                "percent": round(100.0 * agree / len(got), 2),
                "kappa": kappa,
            }
        )
    return out


def awaiting_counts(conn: sqlite3.Connection) -> dict[int, int]:
    """``{sample id: annotators who answered it}`` of the samples that hold answers but no
    answer in force and no open dispute: under ``store.answers_needed`` N > 1, those still
    awaiting more answers (:func:`awaiting_answers`)."""
    return {
        int(r[0]): int(r[1])
        for r in conn.execute(
            "SELECT v.sample_id, COUNT(DISTINCT v.annotator) FROM votes v WHERE NOT EXISTS "
            "(SELECT 1 FROM labels l WHERE l.sample_id = v.sample_id) AND NOT EXISTS (SELECT 1 "
            "FROM disputes d WHERE d.sample_id = v.sample_id AND d.resolved IS NULL) "
            "GROUP BY v.sample_id ORDER BY v.sample_id"
        )
    }


def awaiting_answers(conn: sqlite3.Connection, needed: int) -> list[dict[str, Any]]:
    """The samples awaiting more answers (``store.answers_needed`` = ``needed``): ``[{
    "sample_id", "path", "external_id", "answers": {annotator: class name or "(skip)"},
    "origins": {annotator: where}, "more": answers still needed}]`` by sample id."""
    counts = awaiting_counts(conn)
    if not counts:
        return []
    names = {int(r[0]): str(r[1]) for r in conn.execute("SELECT id, name FROM classes")}
    votes = latest_votes(conn, list(counts))
    out = []
    for sid, n in counts.items():
        s = conn.execute("SELECT path FROM samples WHERE id = ?", (sid,)).fetchone()
        out.append(
            {
                "sample_id": sid,
                "path": None if s is None else s["path"],
                "external_id": _external_id(conn, sid),
                "answers": {v.annotator: _name(v, names) for v in votes.get(sid, [])},
                "origins": {v.annotator: v.origin for v in votes.get(sid, [])},
                "more": max(needed - n, 0),
            }
        )
    return out


def awaiting_text(awaiting: list[dict[str, Any]], needed: int) -> str:
    """``6 awaiting 1 more answer (store.answers_needed=2)``, or ``""`` when none waits.

    >>> awaiting_text([{"more": 1}, {"more": 2}], 3)
    '2 awaiting more answers (1 more: 1, 2 more: 1; store.answers_needed=3)'
    """
    if not awaiting:
        return ""
    by_more = Counter(int(a["more"]) for a in awaiting)
    if len(by_more) == 1:
        (more,) = by_more
        what = f"{more} more answer{'s' if more != 1 else ''}"
        return f"{len(awaiting)} awaiting {what} (store.answers_needed={needed})"
    parts = ", ".join(f"{m} more: {n}" for m, n in sorted(by_more.items()))
    return f"{len(awaiting)} awaiting more answers ({parts}; store.answers_needed={needed})"


def answers_by_annotator(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Every annotator's answers, agreeing ones included (one a sample: their newest):
    ``{annotator: {"answers", "labeled", "skipped", "match_in_force": answers whose class
    equals the one in force, "in_force": answers in force credited to them (every annotator
    whose answer, label or skip, is the one in force: two who agreed are both credited)}}``,
    by name."""
    force = {
        int(r["sample_id"]): (r["class_id"], r["annotator"], r["skip_reason"])
        for r in conn.execute(
            "SELECT l.sample_id, l.class_id, l.annotator, l.skip_reason FROM labels l WHERE NOT "
            "EXISTS (SELECT 1 FROM labels n WHERE n.supersedes = l.id)"
        )
    }
    out: dict[str, dict[str, int]] = {}
    zero = {"answers": 0, "labeled": 0, "skipped": 0, "match_in_force": 0, "in_force": 0}
    for sid, votes in latest_votes(conn).items():
        for v in votes:
            c = out.setdefault(v.annotator, dict(zero))
            c["answers"] += 1
            c["labeled" if v.class_id is not None else "skipped"] += 1
            if sid in force and force[sid][0] == v.class_id:
                c["match_in_force"] += 1
            if sid in force and (force[sid][0], force[sid][2]) == (v.class_id, v.skip):
                c["in_force"] += 1  # credit to every annotator whose answer is in force
    voters = {(sid, v.annotator) for sid, vs in latest_votes(conn).items() for v in vs}
    for sid, (_, who, _) in force.items():
        if (sid, who) not in voters:  # a label with no vote kept (older stores)
            out.setdefault(who, dict(zero))["in_force"] += 1
    return dict(sorted(out.items()))


VOTE_COLUMNS = [
    "vote_id",
    "sample_id",
    "external_id",
    "path",
    "annotator",
    "label",
    "skip",
    "time",
    "source",
    "origin",
    "newest",
    "updated",
    "recorded",
    "superseded_at",
    "deleted",
]


def vote_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every answer ever given, one row each in the order given (:data:`VOTE_COLUMNS`):
    ``source`` says where it came from (``file NAME``, ``Label Studio URL``, ``records``,
    ``label history`` for answers carried over from a store before votes were kept),
    ``origin`` the row or task (``row 3``, ``Label Studio task 17 (sample 4)``), ``newest``
    whether it is that annotator's newest answer for the sample (the one agreement reads).
    ``time`` is when the answer was given where its source says so (Label Studio's
    ``created_at``), else when eada recorded it; ``updated`` the source's last change
    (``updated_at``); ``recorded`` when eada stored it; ``superseded_at`` when the same
    annotator's next answer for the sample replaced it (empty for the newest); ``deleted``
    when a pull found it deleted in Label Studio."""
    newest = {
        int(r[0])
        for r in conn.execute(
            "SELECT MAX(id) FROM votes GROUP BY sample_id, annotator",
        )
    }
    try:
        got = conn.execute("SELECT sample_id, external_id FROM sample_info")
        ext = {int(r[0]): r[1] for r in got}
    except sqlite3.Error:  # a store without the table: no external ids
        ext = {}
    rows = []
    for r in conn.execute(
        "SELECT v.id, v.sample_id, s.path, v.annotator, c.name AS label, v.skip_reason, "
        "v.created, v.origin, v.answered, v.updated, v.deleted, i.file, i.format FROM votes v "
        "JOIN samples s ON s.id = "
        "v.sample_id LEFT JOIN classes c ON c.id = v.class_id LEFT JOIN imports i ON i.id = "
        "v.import_id ORDER BY v.id"
    ):
        rows.append(
            {
                "vote_id": r["id"],
                "sample_id": r["sample_id"],
                "external_id": ext.get(int(r["sample_id"])),
                "path": r["path"],
                "annotator": r["annotator"],
                "label": r["label"],
                "skip": r["skip_reason"],
                "time": r["answered"] or r["created"],
                "source": import_source(r["file"], r["format"], r["origin"]),
                "origin": r["origin"],
                "newest": int(r["id"] in newest),
                "updated": r["updated"],
                "recorded": r["created"],
                "superseded_at": None,
                "deleted": r["deleted"],
            }
        )
    last: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:  # in the order given: each answer supersedes that annotator's previous
        key = (int(row["sample_id"]), str(row["annotator"]))
        if key in last:
            last[key]["superseded_at"] = row["time"]
        last[key] = row
    return rows


def import_source(file: str | None, fmt: str | None, origin: str | None = None) -> str:
    """Where an import came from, as a person reads it: ``Label Studio URL`` for a pull,
    ``file NAME`` for a label file, ``records``, ``simulated oracle``, ``policy change``.

    >>> import_source("http://127.0.0.1:8080/projects/3", "label-studio-live")
    'Label Studio http://127.0.0.1:8080/projects/3'
    >>> import_source("/data/round-001.csv", "csv")
    'file /data/round-001.csv'
    """
    if file is None:
        return origin or ""
    if fmt == "label-studio-live":
        return f"Label Studio {file}"
    if fmt in ("records", "simulated", "policy") or file.startswith("("):
        return file.strip("()")
    return f"file {file}"
