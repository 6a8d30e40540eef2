"""A project's config: an experiment config (image folders as :class:`FolderData`) plus the
``store:`` section that only the store reads (:class:`StoreOptions`), with the file paths of
its data section made absolute at ``eada init``."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from eada.config import (
    DATA_PATH_KEYS,
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    parse_config,
    read_yaml_mapping,
    resolve_config_paths,
)
from eada.store.roots import unsafe_document_root

MAX_ANNOTATOR_CHARS = 320
"""The longest annotator name: room for ``label-studio:`` and an e-mail address (at most 254
characters); names are shown in ``eada status`` and the report, one a line."""


def check_annotator(name: str, what: str = "--annotator") -> str:
    """An annotator's name as given, or a :class:`ValueError` naming ``what`` when it is not
    text, empty, longer than :data:`MAX_ANNOTATOR_CHARS` characters or holds a control
    character (a newline would forge a line of ``eada status``) or an invisible or
    direction-changing one (U+202E, U+200B: ``alice`` on screen, another name in the store).

    >>> check_annotator("alice")
    'alice'
    """
    if not isinstance(name, str):
        raise ValueError(f"{what}: an annotator's name must be text, got {type(name).__name__}")
    if not name.strip():
        raise ValueError(f"{what}: an annotator's name may not be empty")
    if len(name) > MAX_ANNOTATOR_CHARS:
        raise ValueError(
            f"{what}: the annotator's name is {len(name):,} characters long, over the limit "
            f"of {MAX_ANNOTATOR_CHARS} ({name[:40]!r}...)"
        )
    bad = [c for c in name if ord(c) < 32 or ord(c) == 127]
    if bad:
        raise ValueError(
            f"{what}: the annotator's name {name!r} holds a control character ({bad[0]!r}); "
            "use one line of printable text"
        )
    hidden = [c for c in name if unicodedata.category(c) in ("Cf", "Zl", "Zp", "Co", "Cs")]
    if hidden:
        c = hidden[0]
        raise ValueError(
            f"{what}: the annotator's name {name.encode('ascii', 'backslashreplace').decode()!r} "
            f"holds an invisible or direction-changing character (U+{ord(c):04X} "
            f"{unicodedata.name(c, 'unnamed')}): it would display as another name; use "
            "visible characters only"
        )
    return name


class FolderData(BaseModel):
    """Image folders as source and target: ``DIR/[images/]CLASS/*.jpg`` (class = folder name).

    Images are decoded with Pillow, converted to ``channels`` and resized to
    ``image_size x image_size`` (bilinear), scaled to ``[0, 1]`` and normalised with mean and
    std 0.5, the digits convention, so the ``lenet`` model trains on them from scratch.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["folders"] = "folders"
    source: Path
    target: Path
    image_size: int = Field(32, ge=8)
    channels: Literal[1, 3] = 3


def build_config(raw: dict[str, Any], source: str = "project config") -> ExperimentConfig:
    """Validate a project config. Image-folder projects carry a :class:`FolderData` as ``data``
    (the trainer never reads ``cfg.data``; the store loads the domains itself)."""
    raw = {k: v for k, v in raw.items() if k != "store"}  # the store's own section
    data = raw.get("data")
    if isinstance(data, dict) and data.get("kind") == "folders":
        folders = FolderData.model_validate(data)
        cfg = parse_config({**raw, "data": {"kind": "toy"}}, source)
        return cfg.model_copy(update={"data": folders})
    return parse_config(raw, source)


def resolved_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """Every key of a project config, JSON-ready (image-folder ``data`` included)."""
    data: Any = cfg.data
    if isinstance(data, FolderData):
        out = cfg.model_dump(mode="json", exclude={"data"}, warnings=False)
        return {**out, "data": data.model_dump(mode="json")}
    return cfg.resolved()


class StoreOptions(BaseModel):
    """The ``store:`` section of a project config.

    Attributes:
        target: ``labeled`` (class folders / labeled lists / labeled features), ``unlabeled``
            (labels, if any, are ignored), or ``auto``: a folder without class folders, a
            ``.csv`` list without a ``label`` column, a text list whose lines do not end in
            an integer label and a feature file without labels are unlabeled, anything else
            labeled. ``eada init`` records the resolved value.
        label_studio_root: the folder Label Studio serves local files from
            (``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``); default: the deepest folder holding
            every registered data root. Never ``/`` nor a parent of a home folder (an
            error; a derived one that would be is not written: set this key).
        conflicts: what settles a sample whose annotators disagree (:mod:`eada.store.agreement`):
            ``refuse`` (default: nobody wins; the sample is disputed and listed until the
            annotators agree, the policy changes or a reviewer answers; a label in force stays
            in force while disputed), ``newest-wins``, ``majority``
            (ties: ``conflict_tie``) or ``reviewer`` (the answer of ``reviewer`` wins).
            Every answer is kept (``votes``) whatever wins.
        conflict_tie: a ``majority`` tie: ``dispute`` (stays disputed), ``newest-wins`` or
            ``reviewer``.
        reviewer: the annotator whose answer settles a dispute under ``conflicts: reviewer``
            (or a ``majority`` tie under ``conflict_tie: reviewer``), as imports name them
            (``--annotator NAME``, ``label-studio:EMAIL``).
        answers_needed: how many annotators must answer a sample before its answer counts
            (1-100; default 1). Until that many agree (or ``conflicts`` settles their
            disagreement), the sample is *awaiting* more answers: it stays pending, out of
            training. ``eada labelstudio connect --overlap N`` sets it to N. Labels already
            in force when it is raised stay in force.
        near_duplicate_threshold: two samples of one round whose features have a cosine
            similarity at or above this are flagged as near-duplicates in the export and the
            report (never removed). Default (``None``): by what the features are, from
            ``benchmarks/investigations/near_duplicates.py`` (BENCHMARKS.md, "Near-duplicate
            threshold"):
            0.94 on feature rows (a frozen backbone's features, feature files): on frozen
            EfficientNet-Lite0 features of the Office-31 webcam images it flags 28 pairs,
            16 of the 33 pixel-near-identical ones (precision 0.57, recall 0.48 against that
            rule) and 12 more that are the same object in the same view by eye; 0.999 on
            decoded images (a from-scratch image model: its pixel rows; images read from
            disk: the model's embeddings), where no threshold separates a rescanned digit from
            two distinct ones (USPS: at 0.95 the stored pixels flag 4.6 pairs of distinct
            digits per round of 30, the LeNet embeddings 14-17), so only (nearly) identical
            copies are flagged.
    """

    model_config = ConfigDict(extra="forbid")

    target: Literal["auto", "labeled", "unlabeled"] = "auto"
    label_studio_root: Path | None = None
    conflicts: Literal["refuse", "newest-wins", "majority", "reviewer"] = "refuse"
    conflict_tie: Literal["dispute", "newest-wins", "reviewer"] = "dispute"
    reviewer: str | None = None
    answers_needed: int = Field(1, ge=1, le=100)
    near_duplicate_threshold: float | None = Field(None, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _reviewer_named(self) -> StoreOptions:
        needs = self.conflicts == "reviewer" or (
            self.conflicts == "majority" and self.conflict_tie == "reviewer"
        )
        if needs and not (self.reviewer or "").strip():
            raise ValueError("store.reviewer must name the reviewing annotator")
        if self.reviewer is not None:
            check_annotator(self.reviewer, "store.reviewer")
        return self

    @field_validator("answers_needed", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML's yes/true would pass as 1
            raise ValueError(f"expected a whole number of answers from 1 to 100, got {v!r}")
        return v

    @field_validator("label_studio_root")
    @classmethod
    def _safe_root(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_absolute():
            raise ValueError(
                f"{v} is a relative path; name the folder absolutely (Label Studio resolves "
                "it from its own working folder, not this one)"
            )
        why = None if v is None else unsafe_document_root(v)
        if why is not None:
            raise ValueError(f"{why}; Label Studio would serve every file under it")
        return v


def check_label_studio_root_exists(options: StoreOptions) -> None:
    """Refuse a ``store.label_studio_root`` that is not an existing folder (checked where it
    is set: ``eada init``, ``eada config set``; a store whose folder went away later still
    opens, and Label Studio's own check names it then).

    Raises:
        ConfigError: naming the key and the path.
    """
    root = options.label_studio_root
    if root is not None and not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise ConfigError(
            f"store.label_studio_root {root} {what}; name the existing folder Label Studio "
            "serves the images from (its LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT)"
        )


def text_value(key: str, text: str) -> str:
    """A string setting's value: the text exactly as given (``@alice``, ``{``, ``alice #x``,
    ``yes`` and ``123`` stay those characters; nothing is parsed).

    >>> text_value("reviewer", "alice #x"), text_value("reviewer", "123")
    ('alice #x', '123')
    """
    return text


def yaml_value(key: str, text: str) -> Any:
    """A number or list setting's value parsed as YAML (``0.9``, ``null``, ``[a, b]``).

    Raises:
        ConfigError: the text is not valid YAML, naming ``store.KEY``.

    >>> yaml_value("near_duplicate_threshold", "0.9")
    0.9
    """
    import yaml

    from eada.config import safe_load_unique

    try:
        return safe_load_unique(text)
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise ConfigError(
            f"store.{key}={text!r}: not a value ({problem}); give a number or a YAML list"
        ) from None


SETTABLE: dict[str, Callable[[str, str], Any]] = {
    "conflicts": text_value,
    "conflict_tie": text_value,
    "reviewer": text_value,
    "label_studio_root": text_value,
    "near_duplicate_threshold": yaml_value,
    "answers_needed": yaml_value,
}
"""The ``store:`` keys ``eada config set`` may change after ``eada init``, each with how its
``VALUE`` text is read: strings as the exact text (:func:`text_value`), numbers and lists as
YAML (:func:`yaml_value`). A new setting is one entry here (and its field in
:class:`StoreOptions`)."""


def parse_setting(item: str) -> tuple[str, Any]:
    """One ``store.KEY=VALUE`` argument of ``eada config set`` as ``(KEY, value)``: the value
    read as :data:`SETTABLE` says for ``KEY``; an empty ``VALUE`` unsets the key (its default).

    Raises:
        ConfigError: not ``store.KEY=VALUE``, a key that cannot change after init, or a value
            that does not parse, naming the key.

    >>> parse_setting("store.reviewer=@alice"), parse_setting("store.near_duplicate_threshold=")
    (('reviewer', '@alice'), ('near_duplicate_threshold', None))
    """
    key, sep, text = item.partition("=")
    if not sep or not key.startswith("store."):
        raise ConfigError(f"{item!r}: expected store.KEY=VALUE (e.g. store.conflicts=majority)")
    key = key[len("store.") :]
    if key not in SETTABLE:
        settable = ", ".join(f"store.{k}" for k in SETTABLE)
        if key in StoreOptions.model_fields:
            raise ConfigError(f"store.{key} cannot change after `eada init`; settable: {settable}")
        raise ConfigError(f"store.{key} is not a store setting (unknown key); settable: {settable}")
    return key, (SETTABLE[key](key, text) if text else None)


def split_store_section(raw: dict[str, Any]) -> tuple[dict[str, Any], StoreOptions]:
    """``raw`` without its ``store`` section, and that section validated."""
    raw = dict(raw)
    section = raw.pop("store", None) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"the store section must be a mapping, got {type(section).__name__}")
    try:
        return raw, StoreOptions.model_validate(section)
    except ValidationError as err:
        parts = [f"store.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]
        raise ConfigError("the store section is invalid: " + "; ".join(parts)) from None


def absolute_config(cfg: Any) -> Any:
    """``cfg`` with the file paths of its data section absolute (see :func:`absolute_data`)."""
    data = cfg.data
    fixed = type(data).model_validate(absolute_data(data.model_dump(mode="json")))
    return cfg.model_copy(update={"data": fixed})


def absolute_data(raw_data: dict[str, Any]) -> dict[str, Any]:
    """A data section with its file paths made absolute (relative to the working folder at
    ``eada init``), so later commands work from any folder."""
    out = dict(raw_data)
    for k in DATA_PATH_KEYS:
        digits_name = out.get("kind") == "digits" and k != "root"  # mnist, usps: not paths
        if out.get(k) is not None and out.get("kind") != "toy" and not digits_name:
            out[k] = str(Path(out[k]).absolute())
    return out


def load_project_config(path: str | Path, overrides: list[str]) -> tuple[Any, StoreOptions]:
    """A project config file: an experiment config plus an optional ``store:`` section.
    Relative file paths in ``data`` resolve against the config file's folder (those given in
    ``overrides`` against the working folder), then become absolute."""
    path = Path(path)
    raw = resolve_config_paths(read_yaml_mapping(path), path)
    apply_overrides(raw, overrides)
    raw, options = split_store_section(raw)
    check_label_studio_root_exists(options)
    if isinstance(raw.get("data"), dict):
        raw["data"] = absolute_data(raw["data"])
    return build_config(raw, str(path)), options
