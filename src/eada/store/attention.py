"""Samples that *need attention*: an answer that cannot be used stops that one sample, not the
import or the team.

An answer is unusable when it names a class the project does not have, when one annotator
gave two different answers for the same sample (a file's duplicate rows, two duplicate tasks),
when it is an empty submission (Label Studio counts the task as done without a choice), or
when the task it should come from is gone (deleted in Label Studio while answers are still
needed). Such an answer is recorded in the ``attention`` table (why, the annotator, the
task where there is one, the one action that clears it) and everything else imports; the
sample is left out of training and of the round's pending count until the action is
followed: the annotator's usable answer for the sample arrives (a fixed file imported again,
the task answered again in Label Studio after ``eada labelstudio reopen``), which clears
the entry.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

ATTENTION_COLUMNS = (
    "sample_id",
    "path",
    "external_id",
    "why",
    "annotator",
    "task",
    "origin",
    "source",
    "action",
    "opened",
)


@dataclass
class Problem:
    """One unusable answer found by an import.

    Attributes:
        sample_id: the sample it was for.
        annotator: who gave it.
        why: what is wrong (``unknown class 'caat'``, ``answers 'a' (row 2) and 'b' (row 5)``).
        action: the one action that clears it, in the words of the interface in use.
        origin: where it came from (``row 3``, ``Label Studio task 17 (sample 4)``).
        task: the Label Studio task id, where there is one.
    """

    sample_id: int
    annotator: str
    why: str
    action: str
    origin: str = ""
    task: int | None = None


def record(conn: sqlite3.Connection, problems: list[Problem], source: str, stamp: str) -> list[int]:
    """Open (or renew) an entry for each problem, inside the caller's write transaction: one
    open entry per sample and annotator, its text replaced by the newest import's. Returns
    the sample ids."""
    for p in problems:
        conn.execute(
            "INSERT INTO attention (sample_id, annotator, why, task, origin, source, action, "
            "opened) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sample_id, annotator) WHERE "
            "cleared IS NULL DO UPDATE SET why = excluded.why, task = excluded.task, origin = "
            "excluded.origin, source = excluded.source, action = excluded.action",
            (p.sample_id, p.annotator, p.why, p.task, p.origin, source, p.action, stamp),
        )
    return sorted({p.sample_id for p in problems})


def clear(conn: sqlite3.Connection, answered: dict[tuple[int, str], str], stamp: str) -> list[int]:
    """Clear the open entries of ``answered`` (``{(sample id, annotator): where the usable
    answer came from}``) inside the caller's write transaction. Returns the samples cleared."""
    cleared = []
    for (sid, who), where in answered.items():
        cur = conn.execute(
            "UPDATE attention SET cleared = ?, how = ? WHERE sample_id = ? AND annotator = ? "
            "AND cleared IS NULL",
            (stamp, f"answered ({where})" if where else "answered", sid, who),
        )
        if cur.rowcount:
            cleared.append(sid)
    return sorted(set(cleared))


def open_ids(conn: sqlite3.Connection) -> set[int]:
    """The samples that need attention now."""
    try:
        rows = conn.execute("SELECT DISTINCT sample_id FROM attention WHERE cleared IS NULL")
        return {int(r[0]) for r in rows}
    except sqlite3.OperationalError:  # a read-only store of an older schema: none
        return set()


def needs_attention(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The open entries, by sample id then annotator: ``[{"sample_id", "path",
    "external_id", "why", "annotator", "task" (or None), "origin", "source", "action",
    "opened"}]`` (:data:`ATTENTION_COLUMNS`)."""
    try:
        rows = list(
            conn.execute(
                "SELECT a.*, s.path FROM attention a JOIN samples s ON s.id = a.sample_id "
                "WHERE a.cleared IS NULL ORDER BY a.sample_id, a.annotator"
            )
        )
    except sqlite3.OperationalError:
        return []
    try:
        ext = {
            int(r[0]): r[1] for r in conn.execute("SELECT sample_id, external_id FROM sample_info")
        }
    except sqlite3.Error:
        ext = {}
    return [
        {
            "sample_id": int(r["sample_id"]),
            "path": r["path"],
            "external_id": ext.get(int(r["sample_id"])),
            "why": r["why"],
            "annotator": r["annotator"],
            "task": r["task"],
            "origin": r["origin"] or "",
            "source": r["source"] or "",
            "action": r["action"],
            "opened": r["opened"],
        }
        for r in rows
    ]


def attention_line(a: dict[str, Any]) -> str:
    """``sample 7 (/data/x.jpg) needs attention: unknown class 'caat', task 12, annotator
    alice; ACTION``.

    >>> attention_line({"sample_id": 7, "path": None, "why": "unknown class 'caat'",
    ...     "task": None, "annotator": "alice", "action": "fix row 3"})
    "sample 7 needs attention: unknown class 'caat', annotator alice; fix row 3"
    """
    where = a.get("path") or (f"id {a['external_id']!r}" if a.get("external_id") else None)
    task = f", task {a['task']}" if a.get("task") is not None else ""
    return (
        f"sample {a['sample_id']}"
        + (f" ({where})" if where else "")
        + f" needs attention: {a['why']}{task}, annotator {a['annotator']}; {a['action']}"
    )
