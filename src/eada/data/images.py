"""Image domains: list files, domain folders, class maps and checks (the torch ``Dataset`` of
image files is :class:`eada.data.datasets.ImageDomain`).

Two ways to name a domain's images:

* an **image-list file**, one ``path label`` a line, as the Office-31 / Office-Home / VisDA-2017 /
  DomainNet releases and the authors' code use. The label is the LAST field of the line, so paths
  may contain spaces. Relative paths are read against ``root`` (default: the list file's folder).
  Lines starting with ``#`` are comments; ``# class <id> <name>`` lines give the class map
  (what :func:`write_image_list` writes). Without them, class names are the images' parent
  folder names when every label has exactly one, else the label ids.
* a **domain folder** ``DOMAIN/[images/]CLASS/*.jpg`` (the original Office-31 layout); classes
  are the sub-folders in sorted order.

:func:`check_pair` validates a source/target pair and reports every problem at once (missing or
unreadable files, label ids outside the class map, class names that differ, empty classes);
``eada data check`` prints it. ``eada data index FOLDER --out LIST`` writes a list file with the
class map and a ``LIST.sha256`` file in ``sha256sum`` format (``sha256sum -c`` verifies it from
the list file's folder).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eada.runs import check_not_store, sha256_file

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp")


class ImageDataError(ValueError):
    """Image input that cannot be used; the message lists every problem found."""


class ImageSizeError(ValueError):
    """An image size whose decoded images would not fit the memory this process may use."""


#: float32 values a pixel of one training sample takes besides its input: its activations and
#: their gradients in a small from-scratch network (LeNet's first convolution alone keeps 20
#: channels at about the input's size), an estimate on the generous side
ACTIVATIONS_PER_PIXEL = 64


def image_memory(size: int, n_images: int, channels: int, batch_size: int) -> int:
    """Bytes that decoding ``n_images`` images at ``size x size`` into float32 tensors and
    training on a batch of ``batch_size`` of them need at least: the decoded tensors twice
    (the list and the stacked copy), one image on its way through PIL and ``ToTensor``
    (uint8 RGB, float32 RGB, the normalised copy) and the batch with its activations and
    gradients (:data:`ACTIVATIONS_PER_PIXEL`).

    >>> image_memory(32, 100, 3, 0)
    2485248
    """
    per_pixel = 2 * n_images * channels * 4 + (3 + 12 + channels * 4)
    per_pixel += batch_size * 4 * (channels + ACTIVATIONS_PER_PIXEL)
    return size * size * per_pixel


def check_image_memory(
    size: int, n_images: int, channels: int, batch_size: int, what: str = "image_size"
) -> None:
    """Refuse ``size`` before anything is decoded when :func:`image_memory` exceeds what this
    process may allocate (:func:`eada.threads.memory_limit`: physical memory, the cgroup
    limit, ``RLIMIT_AS``/``RLIMIT_DATA``), naming the largest size that fits.

    Raises:
        ImageSizeError: naming ``what``, the size, the memory it needs, the limit and the
            largest size that fits.
    """
    from eada.threads import memory_limit

    need = image_memory(size, n_images, channels, batch_size)
    avail, why = memory_limit()
    if need <= avail:
        return
    per = image_memory(1, n_images, channels, batch_size)
    largest = int((avail / per) ** 0.5)
    while largest > 0 and image_memory(largest, n_images, channels, batch_size) > avail:
        largest -= 1
    hint = (
        f"the largest image size that fits is {largest}"
        if largest >= 1
        else "no image size fits; use fewer images"
    )
    raise ImageSizeError(
        f"{what} {size} is too large: {n_images:,} images of {size}x{size}x{channels} "
        f"(float32) and a batch of {batch_size} need about {need / 2**30:,.1f} GiB, more than "
        f"the {avail / 2**30:,.1f} GiB this process may use (limit: {why}); {hint}"
    )


@dataclass
class ImageList:
    """The images of one domain: absolute paths, integer labels and the class map.

    Attributes:
        name: domain name (the folder or list-file stem).
        paths: absolute image paths.
        labels: class ids in ``[0, len(classes))`` (checked by :meth:`problems`).
        classes: class names; their order defines the ids.
    """

    name: str
    paths: list[Path]
    labels: list[int]
    classes: list[str]

    def __len__(self) -> int:
        return len(self.paths)

    def class_counts(self) -> list[int]:
        """Number of images of every class id."""
        counts = [0] * len(self.classes)
        for y in self.labels:
            if 0 <= y < len(counts):
                counts[y] += 1
        return counts

    def label_problems(self) -> list[str]:
        """Label ids outside the class map (one line per offending image)."""
        n = len(self.classes)
        return [
            f"{p}: label {y} outside the class map [0, {n})"
            for p, y in zip(self.paths, self.labels, strict=True)
            if not 0 <= y < n
        ]

    def with_classes(self, classes: Sequence[str]) -> ImageList:
        """The same images with labels renumbered to the class map ``classes`` (every name of
        this list must be in it), e.g. a target that lacks some of the source's classes."""
        ids = {c: i for i, c in enumerate(classes)}
        missing = [c for c in self.classes if c not in ids]
        if missing:
            raise ImageDataError(f"{self.name}: classes {missing} are not in the class map")
        new = [ids[self.classes[y]] for y in self.labels]
        return ImageList(self.name, list(self.paths), new, list(classes))

    def drop(self, bad: set[Path]) -> ImageList:
        """A copy without the images in ``bad`` (same class map)."""
        keep = [i for i, p in enumerate(self.paths) if p not in bad]
        return ImageList(
            self.name, [self.paths[i] for i in keep], [self.labels[i] for i in keep], self.classes
        )


def _class_header(line: str) -> tuple[int, str] | None:
    parts = line.lstrip("#").strip().split(maxsplit=2)
    if len(parts) == 3 and parts[0] == "class" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None


def read_image_list(
    path: str | Path,
    root: str | Path | None = None,
    classes: Sequence[str] | None = None,
    allow_outside: bool = False,
) -> ImageList:
    """Read a ``path label`` list file.

    Args:
        path: the list file.
        root: folder that relative image paths start from (default: the list file's folder).
        classes: class names by id; overrides the file's ``# class`` header and the names
            inferred from parent folders.
        allow_outside: accept image paths that resolve (``..``, absolute paths, symlinks)
            outside ``root``; by default they are errors, as in the project store.

    Raises:
        FileNotFoundError: no such list file.
        ImageDataError: malformed lines or paths outside ``root`` (all of them listed), no
            images.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "l.txt").write_text("cat/a b.jpg 0\\ndog/c.jpg 1\\n")
    >>> il = read_image_list(d / "l.txt")
    >>> il.classes, [p.name for p in il.paths], il.labels
    (['cat', 'dog'], ['a b.jpg', 'c.jpg'], [0, 1])
    """
    from eada.config import path_origin

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"image folder or list not found: {path}"
            + (path_origin(path) or " (expected a folder DOMAIN/[images/]CLASS/*.jpg or a list)")
        )
    base = Path(root) if root is not None else path.parent
    real_base = os.path.realpath(base)
    outside: list[str] = []
    paths: list[Path] = []
    labels: list[int] = []
    header: dict[int, str] = {}
    errors: list[str] = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            entry = _class_header(line)
            if entry is not None:
                header[entry[0]] = entry[1]
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            errors.append(f"line {n}: expected 'path label' (integer label last), got {raw!r}")
            continue
        p = Path(parts[0])
        full = p if p.is_absolute() else base / p
        if not allow_outside:
            real = os.path.realpath(full)
            if os.path.commonpath([real, real_base]) != real_base:
                outside.append(f"line {n}: {parts[0]} resolves to {real}")
                continue
        paths.append(full)
        labels.append(int(parts[1]))
    if errors:
        raise ImageDataError(f"{path}: {len(errors)} malformed line(s):\n  " + "\n  ".join(errors))
    if outside:
        raise ImageDataError(
            f"{path}: {len(outside)} image path(s) outside {real_base} (pass "
            "--allow-outside-root, or data.allow_outside_root: true, to allow them):\n  "
            + "\n  ".join(outside[:20])
            + (f"\n  ... and {len(outside) - 20} more" if len(outside) > 20 else "")
        )
    if not paths:
        raise ImageDataError(f"{path}: no images listed")
    if classes is not None:
        names = list(classes)
    elif header:
        if sorted(header) != list(range(len(header))):
            raise ImageDataError(f"{path}: '# class' ids must be 0..{len(header) - 1}")
        names = [header[i] for i in range(len(header))]
    else:
        names = _infer_class_names(paths, labels)
    return ImageList(path.stem, paths, labels, names)


def _infer_class_names(paths: list[Path], labels: list[int]) -> list[str]:
    """Parent-folder names when each label id has exactly one, else ``"0".."C-1"``."""
    n = max(labels) + 1 if labels else 0
    parents: dict[int, set[str]] = {}
    for p, y in zip(paths, labels, strict=True):
        parents.setdefault(y, set()).add(p.parent.name)
    names = [str(i) for i in range(n)]
    if all(len(parents.get(i, ())) == 1 for i in range(n)):
        cand = [next(iter(parents[i])) for i in range(n)]
        if len(set(cand)) == n:
            names = cand
    return names


def scan_domain_folder(
    folder: str | Path,
    classes: Sequence[str] | None = None,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
) -> ImageList:
    """Images of ``DOMAIN/[images/]CLASS/*`` (extensions :data:`IMAGE_EXTENSIONS`): the one
    image-folder scanner (run configs, ``eada data index``, folder projects of the store).

    Args:
        folder: the domain folder; an ``images`` sub-folder is used when present.
        classes: a class map to follow (e.g. the source's); class folders not in it are an
            error. Default: the sub-folders in sorted order (empty ones included; hidden ones,
            ``.name``, skipped).
        extensions: the lower-case file suffixes that count as images.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for c in ("b", "a"): (d / "images" / c).mkdir(parents=True)
    >>> _ = (d / "images" / "a" / "x 1.jpg").write_bytes(b"")
    >>> il = scan_domain_folder(d)
    >>> il.classes, il.labels
    (['a', 'b'], [0])
    """
    from eada.config import path_origin

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"domain folder not found: {folder}{path_origin(folder)}")
    base = folder / "images" if (folder / "images").is_dir() else folder
    found = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not found:
        raise ImageDataError(f"{base}: no class folders (expected DOMAIN/[images/]CLASS/*.jpg)")
    names = list(classes) if classes is not None else found
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise ImageDataError(f"{base}: class folders not in the class map: {', '.join(unknown)}")
    paths: list[Path] = []
    labels: list[int] = []
    for y, c in enumerate(names):
        d = base / c
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.is_file() and f.suffix.lower() in extensions:
                paths.append(f.resolve())
                labels.append(y)
    return ImageList(folder.name, paths, labels, names)


def flat_image_folder(path: str | Path) -> list[Path] | None:
    """The images of a folder WITHOUT class folders (an unlabeled target: every image under
    it, recursively, sorted, resolved), or ``None`` when ``path`` is not such a folder (a
    list file, class folders, nothing there)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    base = folder / "images" if (folder / "images").is_dir() else folder
    if any(d.is_dir() and not d.name.startswith(".") for d in base.iterdir()):
        return None
    return sorted(
        p.resolve()
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")
    )


def load_image_list(
    spec: str | Path,
    root: str | Path | None = None,
    classes: Sequence[str] | None = None,
    allow_outside: bool = False,
) -> ImageList:
    """A domain from a folder (:func:`scan_domain_folder`) or a list file
    (:func:`read_image_list`, paths confined to ``root`` unless ``allow_outside``)."""
    spec = Path(spec)
    if spec.is_dir():
        return scan_domain_folder(spec, classes)
    return read_image_list(spec, root, classes, allow_outside)


def write_image_list(images: ImageList, out: str | Path, checksums: bool = True) -> Path:
    """Write ``images`` as a list file with a ``# class <id> <name>`` header.

    Paths are written relative to ``out``'s folder when possible. With ``checksums``, also
    writes ``<out>.sha256`` (``sha256sum`` format, same relative paths). Returns ``out``.
    """
    out = Path(out)
    check_not_store(out)  # nor its checksums file beside it
    check_not_store(f"{out}.sha256")
    out.parent.mkdir(parents=True, exist_ok=True)
    base = out.parent.resolve()

    def rel(p: Path) -> str:
        try:
            return os.path.relpath(p.resolve(), base)
        except ValueError:  # another drive (Windows)
            return str(p.resolve())

    lines = [f"# eada image list: {len(images)} images, {len(images.classes)} classes"]
    lines += [f"# class {i} {c}" for i, c in enumerate(images.classes)]
    lines += [f"{rel(p)} {y}" for p, y in zip(images.paths, images.labels, strict=True)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if checksums:
        sums = [f"{sha256_file(p)}  {rel(p)}" for p in images.paths]
        Path(f"{out}.sha256").write_text("\n".join(sums) + "\n", encoding="utf-8")
    return out


def index_folder(folder: str | Path, out: str | Path, checksums: bool = True) -> ImageList:
    """``eada data index``: scan a domain folder and write its list file (+ checksums)."""
    images = scan_domain_folder(folder)
    if not images.paths:
        raise ImageDataError(f"{folder}: no images found")
    write_image_list(images, out, checksums)
    return images


def open_image(path: Path) -> tuple[Any, str | None]:
    """``(RGB PIL image, None)`` if ``path`` decodes as an image, else ``(None, reason)``:
    ``missing`` or ``unreadable (ErrorType: message)``."""
    from PIL import Image

    if not path.is_file():
        return None, "missing"
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB"), None
    except Exception as err:
        return None, f"unreadable ({type(err).__name__}: {err})"


def _probe(path: Path) -> str | None:
    """``None`` if ``path`` decodes as an image, else the reason."""
    return open_image(path)[1]


def find_bad_images(paths: Sequence[Path], threads: int = 4) -> dict[Path, str]:
    """Every missing or undecodable image, with the reason (decodes each image fully)."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        reasons = list(pool.map(_probe, paths))
    return {p: r for p, r in zip(paths, reasons, strict=True) if r is not None}


@dataclass
class CheckReport:
    """The outcome of :func:`check_pair`; :attr:`errors` stop a run, :attr:`warnings` don't."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bad_images: dict[Path, str] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No errors."""
        return not self.errors

    def format(self) -> str:
        """The report as text."""
        out = [*self.summary]
        out += [f"ERROR   {e}" for e in self.errors]
        out += [f"WARNING {w}" for w in self.warnings]
        out.append("OK" if self.ok else f"{len(self.errors)} error(s)")
        return "\n".join(out)


def check_domain(images: ImageList, role: str, report: CheckReport, decode: bool = True) -> None:
    """Add ``images``' problems to ``report``: bad labels, empty classes, bad files."""
    report.summary.append(
        f"{role} {images.name!r}: {len(images)} images, {len(images.classes)} classes"
    )
    report.errors += [f"{role}: {m}" for m in images.label_problems()]
    empty = [c for c, n in zip(images.classes, images.class_counts(), strict=True) if n == 0]
    if empty:
        report.warnings.append(f"{role}: empty classes: {', '.join(empty)}")
    if len(images) == 0:
        report.errors.append(f"{role}: no images")
    if decode:
        bad = find_bad_images(images.paths)
        report.bad_images.update(bad)
        report.errors += [f"{role}: {p}: {r}" for p, r in bad.items()]


def check_pair(source: ImageList, target: ImageList, decode: bool = True) -> CheckReport:
    """Validate a source/target pair: every problem of both domains, plus class maps that
    differ (names only in the target, or the same names in another order). A target that
    lacks some of the source's classes is a warning: runs use the source's class map."""
    report = CheckReport()
    check_domain(source, "source", report, decode)
    check_domain(target, "target", report, decode)
    s, t = source.classes, target.classes
    if s != t:
        only_s = [c for c in s if c not in t]
        only_t = [c for c in t if c not in s]
        if only_t:
            report.errors.append(
                "class names differ: only in source: "
                f"{', '.join(only_s) or '-'}; only in target: {', '.join(only_t) or '-'}"
            )
        elif only_s:
            report.warnings.append(
                f"target lacks {len(only_s)} of the source's {len(s)} classes "
                f"({', '.join(only_s)}): allowed; runs use the source's class map"
            )
        else:
            report.errors.append("source and target list the same classes in another order")
    return report
