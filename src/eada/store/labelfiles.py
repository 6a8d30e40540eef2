"""Query exports (CSV, JSON, Label Studio tasks) and label imports (CSV, JSON, Label Studio
JSON export). Imported files are parsed as data only (``csv``/``json``; nothing is evaluated)."""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, unquote
from xml.sax.saxutils import quoteattr

from eada.runs import write_bytes_atomic

LS_FROM_NAME = "label"  # the <Choices name=...> of the Label Studio config we write
LS_LOCAL_PREFIX = "/data/local-files/?d="
LS_SKIP_REASON = "skipped in Label Studio"  # a cancelled (skipped) Label Studio annotation
AUDIT_MARK = "AUDIT: answer without any model guess"  # an audit task's data.audit
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")  # what spreadsheets run as a formula
MAX_SAMPLE_ID = 2**63 - 1  # SQLite's INTEGER


class ImportFileError(ValueError):
    """An import file that cannot be read: malformed CSV/JSON, missing columns, bad values."""


@dataclass
class LabelItem:
    """One label an import file gives.

    Attributes:
        where: location in the file for error messages (``"row 4"``, ``"item 2"``).
        label: the class NAME, or ``None`` for a skip.
        sample_id: the store's sample id, or ``None`` when only ``path`` is given.
        path: a file path naming the sample (image projects), or ``None``.
        annotator: who labeled it (``None``: the importer's ``--annotator``).
        external_id: the user's own id of the sample (given with an unlabeled target's file
            list or feature file), used when neither ``sample_id`` nor ``path`` is given.
        skip: why the sample is unusable (out of class, unreadable, ambiguous): a skip instead
            of a label; ``None`` for a label.
        task: the Label Studio task the answer came from (``None`` for a file's row).
        answered: when the answer was given, as its source says (Label Studio's
            ``created_at``), or ``None``.
        updated: when it was last changed there (``updated_at``), or ``None``.
        problem: why the answer cannot be used (an empty submission, several choices), or
            ``None``: the sample then needs attention (:mod:`eada.store.attention`).
        earlier: the same annotator's earlier answers on the same task (a resubmission),
            oldest first, kept as superseded answers.
    """

    where: str
    label: str | None
    sample_id: int | None = None
    path: str | None = None
    annotator: str | None = None
    external_id: str | None = None
    skip: str | None = None
    task: int | None = None
    answered: str | None = None
    updated: str | None = None
    problem: str | None = None
    earlier: list[LabelItem] = field(default_factory=list)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace`` (never partial;
    a failed write, e.g. a full disk, leaves ``path`` as it was and no temporary file, and
    its error names ``path``): :func:`eada.runs.write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def csv_safe(value: Any) -> Any:
    r"""A CSV cell a spreadsheet will not run: text starting with ``=``, ``+``, ``-``, ``@``, a
    tab or a carriage return gets a leading ``'`` (numbers stay as they are). Label imports
    drop that quote again, so exported files round-trip.

    >>> csv_safe("=HYPERLINK(\"http://x\")"), csv_safe("-1.5"), csv_safe(-1.5), csv_safe("cat")
    ('\'=HYPERLINK("http://x")', "'-1.5", -1.5, 'cat')
    """
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def _unquote(text: str) -> str:
    """Undo :func:`csv_safe` on an imported cell."""
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_PREFIXES) else text


SAMPLE_ID_FORM = (
    "a whole number in ASCII digits 0-9 (57; 57.0, as spreadsheets and pandas write whole "
    "numbers, is read as 57; no sign, no separators such as 5_7, no other digits such as "
    "\u0665\u0667)"
)
"""The one form of a sample id in a label file, said in every error about one."""
_SAMPLE_ID_RE = re.compile(r"[0-9]+(?:\.0)?")


def _sample_id(value: Any, where: str) -> int | None:
    """A label file's ``sample_id`` in its one form (:data:`SAMPLE_ID_FORM`): a JSON integer
    (or a whole float), or text of ASCII digits, optionally ending in ``.0``.

    >>> _sample_id("57", "row 2"), _sample_id(" 57.0 ", "row 2"), _sample_id(57.0, "row 2")
    (57, 57, 57)
    >>> _sample_id("5_7", "row 2")
    Traceback (most recent call last):
    ...
    eada.store.labelfiles.ImportFileError: row 2: sample_id '5_7' is not an integer in the one ...
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    bad = ImportFileError(
        f"{where}: sample_id {value!r} is not an integer in the one form of a sample id: "
        f"{SAMPLE_ID_FORM}"
    )
    if isinstance(value, bool):
        raise bad
    if isinstance(value, float):
        if not value.is_integer():
            raise bad
        value = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not _SAMPLE_ID_RE.fullmatch(text):
            raise bad
        value = int(text.removesuffix(".0"))
    elif not isinstance(value, int):
        raise bad
    if not 0 <= value <= MAX_SAMPLE_ID:
        raise ImportFileError(f"{where}: sample_id {value} is out of range (no such sample)")
    return value


def _text(value: Any, where: str, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        raise ImportFileError(f"{where}: {field} must be text, got {type(value).__name__}")
    s = _unquote(str(value).strip())
    return s or None


NOT_A_SKIP = ("false", "0", "no", "n", "f", "none", "0.0")
A_BARE_SKIP = ("true", "1", "yes", "y", "t", "1.0")
BARE_SKIP_REASON = "skipped"


def _skip(value: Any, where: str) -> str | None:
    """A ``skip`` cell: a reason (text), or a yes/no answer: ``false``, ``0``, ``no`` (and
    JSON ``false``) are NOT a skip; ``true``, ``1``, ``yes`` are a skip without a reason
    (``"skipped"``)."""
    if isinstance(value, bool):
        return BARE_SKIP_REASON if value else None
    if isinstance(value, (int, float)) and value in (0, 1):
        return BARE_SKIP_REASON if value else None
    text = _text(value, where, "skip")
    if text is None or text.lower() in NOT_A_SKIP:
        return None
    return BARE_SKIP_REASON if text.lower() in A_BARE_SKIP else text


def _item(raw: dict[str, Any], where: str) -> LabelItem | None:
    label = _text(raw.get("label"), where, "label")
    skip = _skip(raw.get("skip"), where)
    if label is None and skip is None:
        return None  # not answered (yet)
    if label is not None and skip is not None:
        raise ImportFileError(
            f"{where}: gives both a label ({label!r}) and a skip reason ({skip!r}); keep one"
        )
    sid = _sample_id(raw.get("sample_id"), where)
    path = _text(raw.get("path"), where, "path")
    ext = _text(raw.get("external_id"), where, "external_id")
    if sid is None and path is None and ext is None:
        raise ImportFileError(f"{where}: needs a sample_id, a path or an external_id")
    if raw.get("annotator") is not None and not isinstance(raw["annotator"], str):
        raise ImportFileError(
            f"{where}: annotator must be text (a name in quotes), got "
            f"{type(raw['annotator']).__name__} {raw['annotator']!r}"
        )
    annotator = _text(raw.get("annotator"), where, "annotator")
    return LabelItem(where, label, sid, path, annotator, ext, skip)


MAX_LABEL_ROWS = 1_000_000
"""The most rows (CSV) or items (JSON) one label file may hold: far more than any project's
pool in our benchmarks (reading that many takes about 0.6 GB); a bigger file is split. A CSV
file without quotes is refused before it is parsed (a line is a row)."""
MAX_JSON_BYTES = 256 * 2**20
"""The largest JSON label file (it is parsed whole; CSV is read a row at a time)."""
PROGRESS_BYTES = 16 * 2**20
"""A label file over this size shows its reading progress (on standard error)."""
PROGRESS_ROWS = 200_000
MAX_CSV_COLUMNS = 10_000
"""The most columns a CSV label file may have (a round's export has about a dozen)."""


def read_csv(text: str | TextIO, tick: Callable[[int], None] | None = None) -> list[LabelItem]:
    """CSV with a header: ``label`` and ``sample_id``, ``path`` and/or ``external_id``;
    optional ``annotator`` and ``skip`` (a reason: the sample is unusable, instead of a label).
    Other columns (scores, predictions) are ignored; rows with neither a label nor a skip
    reason are not answered yet. ``text``: the CSV, or an open text file read a row at a
    time; ``tick(rows)`` is called every :data:`PROGRESS_ROWS` rows. At most
    :data:`MAX_LABEL_ROWS` rows."""
    lines = io.StringIO(text, newline="") if isinstance(text, str) else text
    reader = csv.DictReader(lines, strict=True)
    try:
        fields = reader.fieldnames or []
    except csv.Error as err:
        raise ImportFileError(f"malformed CSV header (line 1): {err}") from None
    if len(fields) > MAX_CSV_COLUMNS:
        raise ImportFileError(
            f"the CSV header names {len(fields):,} columns, more than the {MAX_CSV_COLUMNS:,} a "
            "label file may hold (it needs 'label' and a 'sample_id', 'path' or 'external_id' "
            "column); is it a label file?"
        )
    stripped = [f.strip() if isinstance(f, str) else f for f in fields]
    counts = collections.Counter(stripped)  # one pass: a list's count() a column was quadratic
    twice = sorted({f for f in stripped if counts[f] > 1 and f})
    if twice:
        raise ImportFileError(
            f"the CSV header names column(s) {twice} more than once; keep one of each"
        )
    if "label" not in fields or not ({"sample_id", "path", "external_id"} & set(fields)):
        raise ImportFileError(
            "CSV header must name a 'label' column and a 'sample_id', 'path' or 'external_id' "
            "column; "
            f"found {fields or 'no header'}"
        )
    items = []
    row_no = 1  # the header is row 1; a data row's number counts records, not lines
    try:
        for row in reader:
            row_no += 1
            where = f"row {row_no}"
            if row_no - 1 > MAX_LABEL_ROWS:
                raise ImportFileError(
                    f"more than {MAX_LABEL_ROWS:,} rows, the most one label file may hold: "
                    "split it into several files and import each"
                )
            if tick is not None and (row_no - 1) % PROGRESS_ROWS == 0:
                tick(row_no - 1)
            if None in row:
                raise ImportFileError(f"{where}: more values than header columns")
            if any(v is None for v in row.values()):
                raise ImportFileError(f"{where}: fewer values than header columns")
            item = _item(row, where)
            if item is not None:
                items.append(item)
    except csv.Error as err:
        raise ImportFileError(f"malformed CSV at row {row_no + 1}: {err}") from None
    return items


def _ls_annotator(ann: dict[str, Any]) -> str | None:
    who = ann.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("id")
    return None if who is None else f"label-studio:{who}"


def _ls_answer(
    ann: dict[str, Any], where: str = "a Label Studio task"
) -> tuple[str | None, bool, str | None]:
    """One Label Studio annotation as ``(label, skipped, problem)``: a choice is a label, a
    cancelled annotation a skip; no choice (an empty submission) or several are a problem.

    Raises:
        ImportFileError: a ``choices`` result whose value holds no list of choices.
    """
    if ann.get("was_cancelled"):
        return None, True, None
    chosen: list[Any] = []
    for res in ann.get("result") or []:
        if not isinstance(res, dict) or res.get("type") != "choices":
            continue
        value = res.get("value")
        got = value.get("choices") if isinstance(value, dict) else None
        if not isinstance(got, list):
            raise ImportFileError(f"{where}: expected exactly one choice, got {got!r}")
        chosen += got
    if not chosen:
        return (
            None,
            False,
            "an empty submission (no choice): Label Studio serves the task to nobody",
        )
    if len(chosen) > 1:
        return None, False, f"{len(chosen)} choices in one answer ({chosen!r}), one expected"
    return str(chosen[0]), False, None


def read_label_studio(tasks: list[Any]) -> list[LabelItem]:
    """Label Studio tasks with their annotations: one item per annotator of a task (their
    newest annotation: a choice is a label, a cancelled one a skip; their earlier ones on the
    task in ``earlier``), named by the task's id, the sample and the annotation
    (``Label Studio task 17 (sample 42), annotation 9``), so several annotators of one task
    are several answers (votes), settled by ``store.conflicts``. An annotation that cannot be
    used (no choice: an empty submission; several choices) is an item with a ``problem``."""
    items = []
    for i, task in enumerate(tasks, start=1):
        tid = task.get("id") if isinstance(task, dict) else None
        where = f"Label Studio task {tid}" if isinstance(tid, int) else f"task {i}"
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise ImportFileError(f"{where}: a Label Studio task needs a 'data' object")
        data = task["data"]
        if data.get("sample_id") is not None:
            where += f" (sample {data['sample_id']})"
        anns = task.get("annotations") or []
        if not isinstance(anns, list):
            raise ImportFileError(f"{where}: 'annotations' must be a list")
        by_who: dict[str | None, list[tuple[dict[str, Any], tuple[str | None, bool, str | None]]]]
        by_who = {}

        def newest_last(a: Any) -> tuple[str, int]:
            if not isinstance(a, dict):
                return ("", 0)
            when = a.get("updated_at") or a.get("created_at") or ""
            ident = a.get("id")
            return (str(when), ident if isinstance(ident, int) else 0)

        for ann in sorted(anns, key=newest_last):  # one annotator's newest answer counts
            if not isinstance(ann, dict):
                continue
            who = _ls_annotator(ann)
            got = _ls_answer(ann, where)
            if who is None and who in by_who and by_who[who][-1][1] != got:
                shown = sorted(str(a or "skip") for a in {by_who[who][-1][1][0], got[0]})
                raise ImportFileError(
                    f"{where}: conflicting annotations {shown} by annotators the export does "
                    "not name (no completed_by): export with the annotators, or keep one"
                )
            by_who.setdefault(who, []).append((ann, got))
        path = data.get("path")
        img = data.get("image")
        if path is None and isinstance(img, str) and img.startswith(LS_LOCAL_PREFIX):
            path = unquote(img[len(LS_LOCAL_PREFIX) :])
        for who, answers in by_who.items():
            made = [
                _ls_item(data, path, where, who, tid, ann, got)
                for ann, got in answers
                if got[0] is not None or got[1] or got[2] is not None
            ]
            if made:
                made[-1].earlier = [m for m in made[:-1] if m.problem is None]
                items.append(made[-1])
    return items


def _ls_item(
    data: dict[str, Any],
    path: Any,
    where: str,
    who: str | None,
    tid: Any,
    ann: dict[str, Any],
    got: tuple[str | None, bool, str | None],
) -> LabelItem:
    label, skipped, problem = got
    ident = ann.get("id")
    at = f"{where}, annotation {ident}" if isinstance(ident, int) else where
    task = tid if isinstance(tid, int) else None
    answered = ann.get("created_at") if isinstance(ann.get("created_at"), str) else None
    updated = ann.get("updated_at") if isinstance(ann.get("updated_at"), str) else None
    if problem is not None:
        item = _item({"sample_id": data.get("sample_id"), "path": path, "skip": "x"}, at)
        assert item is not None
        item.skip = None
    else:
        fields: dict[str, Any] = {"sample_id": data.get("sample_id"), "path": path}
        if skipped:
            fields["skip"] = LS_SKIP_REASON
        else:
            fields["label"] = label
        got_item = _item(fields, at)
        assert got_item is not None
        item = got_item
    item.annotator = who
    item.task = task
    item.answered = answered
    item.updated = updated
    item.problem = problem
    return item


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ImportFileError(
            f"a JSON object names the key(s) {twice} more than once (which one counts is "
            "ambiguous); keep one of each"
        )
    return dict(pairs)


def read_json(text: str) -> tuple[str, list[LabelItem]]:
    """JSON: a Label Studio export (tasks with ``annotations``), a list of
    ``{"sample_id", "label"}`` objects (also Label Studio's JSON-MIN), or our query export
    (``{"samples": [...]}``) with labels filled in. Returns ``(format, items)``."""
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ImportFileError:
        raise
    except json.JSONDecodeError as err:
        raise ImportFileError(f"malformed JSON: {err}") from None
    except RecursionError:
        raise ImportFileError("JSON nested too deeply to be a label file") from None
    if isinstance(doc, dict) and "samples" in doc:
        doc, fmt = doc["samples"], "json"
    elif (
        isinstance(doc, list)
        and doc
        and all(isinstance(t, dict) and "annotations" in t for t in doc)
    ):
        return "label-studio", read_label_studio(doc)
    else:
        fmt = "json"
    if not isinstance(doc, list):
        raise ImportFileError(
            "JSON must be a list of {sample_id, label} objects, a Label Studio export, or a "
            f"query export with 'samples'; got {type(doc).__name__}"
        )
    if len(doc) > MAX_LABEL_ROWS:
        raise ImportFileError(
            f"{len(doc):,} items, more than the {MAX_LABEL_ROWS:,} one label file may hold: "
            "split it into several files and import each"
        )
    items = []
    for i, raw in enumerate(doc, start=1):
        if not isinstance(raw, dict):
            raise ImportFileError(f"item {i}: expected an object, got {type(raw).__name__}")
        item = _item(raw, f"item {i}")
        if item is not None:
            items.append(item)
    return fmt, items


def read_label_file(
    path: Path, say: Callable[[str], None] | None = None
) -> tuple[str, list[LabelItem], str]:
    """Parse an import file by its suffix (``.csv`` or ``.json``); returns
    ``(format, items, SHA-256 of its bytes)``. A CSV file is read a row at a time (at most
    :data:`MAX_LABEL_ROWS` rows), a JSON file whole (at most :data:`MAX_JSON_BYTES`); a file
    over :data:`PROGRESS_BYTES` says how far it got (``say``, default standard error).

    Raises:
        FileNotFoundError: no such file.
        ImportFileError: unknown suffix, not UTF-8, malformed content, over a limit.
    """
    if not path.exists():
        raise FileNotFoundError(f"label file not found: {path}")
    if path.is_dir():
        raise ImportFileError(f"{path} is a folder, not a label file (name a .csv or .json file)")
    if not path.is_file():
        raise ImportFileError(
            f"{path} is not a regular file (a named pipe, socket or device): save the labels "
            "to a .csv or .json file and import that"
        )
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise ImportFileError(f"{path}: unknown label file type {suffix!r} (use .csv or .json)")
    size = path.stat().st_size
    if suffix == ".json" and size > MAX_JSON_BYTES:
        raise ImportFileError(
            f"{path}: {size / 2**20:,.0f} MiB of JSON, over the {MAX_JSON_BYTES // 2**20} MiB "
            "a JSON label file may hold (it is read whole): split it, or write CSV"
        )
    h = hashlib.sha256()
    lines, quoted = 0, False
    with open(path, "rb") as raw:
        for chunk in iter(lambda: raw.read(2**20), b""):
            h.update(chunk)
            lines += chunk.count(b"\n")
            quoted = quoted or b'"' in chunk
    if suffix == ".csv" and not quoted and lines > MAX_LABEL_ROWS + 1:  # a line = a row
        raise ImportFileError(
            f"{path}: {lines - 1:,} rows, more than the {MAX_LABEL_ROWS:,} one label file may "
            "hold: split it into several files and import each"
        )
    shout = say or (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            if suffix == ".json":
                fmt, items = read_json(fh.read())
                return fmt, items, h.hexdigest()

            def tick(rows: int) -> None:
                if size > PROGRESS_BYTES:
                    at = fh.buffer.tell()  # type: ignore[attr-defined]
                    shout(
                        f"reading {path}: {at / 2**20:,.1f} of {size / 2**20:,.1f} MiB "
                        f"({at / size:.0%}), {rows:,} rows"
                    )

            return "csv", read_csv(fh, tick), h.hexdigest()
    except UnicodeDecodeError as err:
        raise ImportFileError(f"{path}: not UTF-8 text ({err})") from None
    except ImportFileError as err:
        raise ImportFileError(f"{path}: {err}") from None


# -- exports -----------------------------------------------------------------------------------
def export_rows_csv(rows: list[dict[str, Any]], score_names: list[str]) -> str:
    """The query batch as CSV, one sample a row: ``label``, ``annotator`` and ``skip`` hold
    the answer in force (empty where the sample still awaits one)."""
    buf = io.StringIO(newline="")
    cols = ["sample_id", "external_id", "round", "rank", "domain", "index", "path"]
    cols += ["external_path", "predicted", "score", *score_names, "near_duplicate_of"]
    cols += ["audit", "dispute"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*cols, "label", "annotator", "skip"])
    for r in rows:
        score = r.get("score")
        w.writerow(
            [
                r["sample_id"],
                csv_safe(r.get("external_id") or ""),
                r["round"],
                r["rank"],
                csv_safe(r["domain"]),
                r["index"],
                csv_safe(r["path"] or ""),
                csv_safe(r.get("external_path") or ""),
                csv_safe(r["predicted"] or ""),
                "" if score is None else repr(float(score)),
                *[repr(float(r["scores"][k])) for k in score_names],
                r.get("near_duplicate_of") or "",
                "yes" if r.get("audit") else "",
                csv_safe(r.get("dispute") or ""),
                csv_safe(r.get("label") or ""),
                csv_safe(r.get("annotator") or ""),
                csv_safe(r.get("skip") or ""),
            ]
        )
    return buf.getvalue()


def model_version(round_number: int) -> str:
    """The ``model_version`` of round ``round_number``'s pre-annotations (Label Studio shows
    the predictions of its project's ``model_version``)."""
    return f"eada-round-{round_number}"


def label_studio_tasks(
    rows: list[dict[str, Any]], roots: list[Path], round_number: int
) -> list[dict[str, Any]]:
    """Label Studio import tasks: ``data`` holds the sample id, the image (served through
    Label Studio's local-files storage, relative to the document root) or a text stand-in
    for feature rows, and the per-sample scores; the model's guess is a pre-annotation
    (none on an audit round's tasks, which carry ``data.audit``).

    Raises:
        ValueError: an image outside every document root in ``roots`` (its URL would not
            resolve: no task file is written with it).
    """
    tasks: list[dict[str, Any]] = []
    for r in rows:
        data: dict[str, Any] = {"sample_id": r["sample_id"], "round": r["round"], "rank": r["rank"]}
        if r["path"]:
            p = Path(r["path"])
            rel: str | None = next(
                (
                    str(p.relative_to(root.resolve()))
                    for root in roots
                    if root.resolve() in p.parents
                ),
                None,
            )
            if rel is None:
                shown = ", ".join(str(x) for x in roots) or "none"
                raise ValueError(
                    f"image {p} of sample {r['sample_id']} lies outside the Label Studio "
                    f"document root ({shown}): its URL would not resolve; name a folder "
                    "holding every target image with `eada labelstudio connect --root DIR` "
                    "(or `eada config set store.label_studio_root=DIR`)"
                )
            data["image"] = LS_LOCAL_PREFIX + quote(rel)  # relative to the document root
            data["path"] = r["path"]
        else:
            named = r.get("external_path") or r.get("external_id")
            data["text"] = named or f"{r['domain']} sample #{r['index']}"
        for k in ("external_id", "external_path"):
            if r.get(k):
                data[k] = r[k]
        data.update({k: float(v) for k, v in r["scores"].items()})
        if r.get("audit"):  # marked, and blind: no pre-annotation
            data["audit"] = AUDIT_MARK
            tasks.append({"data": data, "predictions": []})
            continue
        tasks.append(
            {
                "data": data,
                "predictions": [
                    {
                        "model_version": model_version(round_number),
                        **({"score": float(r["score"])} if r.get("score") is not None else {}),
                        "result": [
                            {
                                "from_name": LS_FROM_NAME,
                                "to_name": "image" if r["path"] else "text",
                                "type": "choices",
                                "value": {"choices": [r["predicted"]]},
                            }
                        ],
                    }
                ],
            }
        )
    return tasks


def label_studio_config(classes: list[str], images: bool) -> str:
    """A Label Studio labeling config (XML) with one choice per class."""
    obj = '<Image name="image" value="$image"/>' if images else '<Text name="text" value="$text"/>'
    to = "image" if images else "text"
    choices = "\n".join(f"    <Choice value={quoteattr(c)}/>" for c in classes)
    return (
        f'<View>\n  {obj}\n  <Choices name="{LS_FROM_NAME}" toName="{to}" choice="single">\n'
        f"{choices}\n  </Choices>\n</View>\n"
    )


def records_to_items(records: list[Any]) -> list[LabelItem]:
    """Label items from in-memory records (dicts, e.g. a DataFrame's ``to_dict("records")``)
    with ``label`` (or ``skip``: a reason) and ``sample_id`` and/or ``path``; missing values
    (``None``, NaN, empty) count as absent, so rows without an answer are passed over like
    empty CSV cells."""
    items = []
    for i, rec in enumerate(records, start=1):
        where = f"record {i}"
        if not isinstance(rec, dict):
            raise ImportFileError(f"{where}: expected a mapping, got {type(rec).__name__}")
        clean = {k: None if isinstance(v, float) and v != v else v for k, v in rec.items()}
        item = _item(clean, where)
        if item is not None:
            items.append(item)
    return items
