"""Loading plugins: code from outside eada that registers strategies, training components,
backbones or methods through :mod:`eada.extend`.

A plugin comes in three ways, all ending in one import of a Python module whose decorators
register what it defines:

* ``--plugin MODULE_OR_FILE`` on ``eada run``, ``bench``, ``query`` and ``train`` (repeatable),
  or a ``plugins:`` list in a config: a ``.py`` file (imported as a module named after the
  file's stem) or an importable module name (:func:`load_plugin`);
* a Python entry point of an installed package in the groups ``eada.strategies``,
  ``eada.components``, ``eada.backbones`` and ``eada.methods`` (:data:`GROUPS`): loaded
  lazily, only when a name is not found among the built-ins or when a listing is asked for
  (:func:`load_entry_points`);
* an ``import`` in the user's own script or notebook before calling :mod:`eada`.

Each registered name remembers its plugin (:func:`provider`), as a :class:`PluginInfo`: the
module, and the package with its version (an installed package) or the file's SHA-256 (a
single file), so every record can name the code that made it. Worker processes and Dask
workers re-import the same plugins before a run (:func:`activate`); a worker that lacks one
fails that run with an error naming the module and the worker.

This module imports nothing heavy (no torch): the config validator and the command line use
it before any training code is loaded.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

GROUPS = {
    "strategy": "eada.strategies",
    "component": "eada.components",
    "backbone": "eada.backbones",
    "method": "eada.methods",
}
"""The entry-point group of each kind of registered name."""


class PluginError(ValueError):
    """A plugin that cannot be loaded, or that registers a name it may not (the message names
    the plugin: its file, module or package)."""


@dataclass(frozen=True)
class PluginInfo:
    """Where a registered name comes from.

    Attributes:
        module: the module to import (a file plugin: the file's stem).
        kind: ``"file"``, ``"module"`` or ``"entry point"``.
        path: the plugin's file (``"file"``), else ``None``.
        sha256: SHA-256 of the file (a file plugin, or a module outside any installed
            package), else ``None``.
        package: the installed distribution that provides the module, else ``None``.
        version: that distribution's version, else ``None``.
    """

    module: str
    kind: str
    path: str | None = None
    sha256: str | None = None
    package: str | None = None
    version: str | None = None

    def record(self) -> dict[str, str]:
        """The plugin as it is written into a run's record (``None`` fields left out)."""
        fields = ("module", "kind", "path", "sha256", "package", "version")
        return {k: getattr(self, k) for k in fields if getattr(self, k) is not None}

    @property
    def label(self) -> str:
        """A short human-readable name: ``package 1.2`` or ``plug.py (sha256 ab12cd34...)``."""
        if self.package:
            return f"{self.package} {self.version}"
        if self.path:
            return f"{Path(self.path).name} (sha256 {str(self.sha256)[:12]})"
        return self.module


LOADED: dict[str, PluginInfo] = {}
"""Every plugin this process has loaded, by module name."""

_ORIGINS: dict[tuple[str, str], PluginInfo] = {}
_GROUPS_DONE: set[str] = set()


def sha256_of(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def is_builtin(module: str) -> bool:
    """Whether ``module`` is part of eada itself."""
    return module == "eada" or module.startswith("eada.")


def _distribution_of(module: str) -> tuple[str, str] | None:
    """``(distribution name, version)`` of the installed package providing ``module``."""
    top = module.split(".")[0]
    dists = metadata.packages_distributions().get(top, [])
    for name in dists:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def describe_module(module: str) -> PluginInfo:
    """The :class:`PluginInfo` of an imported module that is not a plugin loaded here (a
    module the user imported in a script, a worker's module shipped with
    ``Client.upload_file``): its package and version where an installed distribution provides
    it, else the SHA-256 of its file."""
    top = module.split(".")[0]
    if top in LOADED:
        return LOADED[top]
    if module in LOADED:
        return LOADED[module]
    dist = _distribution_of(module)
    if dist is not None:
        return PluginInfo(module=module, kind="module", package=dist[0], version=dist[1])
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    if file and os.path.isfile(file):
        return PluginInfo(module=module, kind="module", path=file, sha256=sha256_of(file))
    return PluginInfo(module=module, kind="module")


def register_origin(kind: str, name: str, module: str) -> PluginInfo | None:
    """Note that ``name`` (a ``kind`` in :data:`GROUPS`) was registered by ``module``; returns
    its plugin (``None`` for eada's own modules)."""
    if is_builtin(module):
        _ORIGINS.pop((kind, name), None)
        return None
    info = describe_module(module)
    _ORIGINS[(kind, name)] = info
    return info


def provider(kind: str, name: str) -> PluginInfo | None:
    """The plugin that registered ``name`` (``None``: a built-in, or not registered)."""
    return _ORIGINS.get((kind, name))


def collision_message(kind: str, name: str, old_module: str, new_module: str) -> str:
    """The error of a name registered twice: a built-in is never replaced by a plugin."""
    new = describe_module(new_module).label if not is_builtin(new_module) else new_module
    if is_builtin(old_module):
        return (
            f"{kind} {name!r} is a built-in of eada ({old_module}); the plugin {new} cannot "
            f"replace it: register yours under another name"
        )
    old = describe_module(old_module).label
    return f"{kind} {name!r} is registered twice: by the plugin {old} and by {new}"


def _load_file(path: Path) -> PluginInfo:
    if not path.is_file():
        raise PluginError(f"plugin file not found: {path}")
    path = path.resolve()
    name = path.stem
    if not name.isidentifier():
        raise PluginError(f"plugin file {path}: its name must be a Python identifier")
    sha = sha256_of(path)
    known = sys.modules.get(name)
    if known is not None:
        file = getattr(known, "__file__", None)
        same = file and os.path.isfile(file) and sha256_of(file) == sha
        if not same:
            raise PluginError(
                f"plugin file {path}: a module named {name!r} is already imported "
                f"(from {file or 'no file'}); rename the plugin file"
            )
        info = PluginInfo(module=name, kind="file", path=str(path), sha256=sha)
        LOADED[name] = info
        return info
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {path} cannot be imported as a module")
    mod = importlib.util.module_from_spec(spec)
    info = PluginInfo(module=name, kind="file", path=str(path), sha256=sha)
    LOADED[name] = info  # before exec: what it registers names this file
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except PluginError:
        _forget(name)
        raise
    except Exception as err:
        _forget(name)
        raise PluginError(
            f"plugin file {path} failed to import: {type(err).__name__}: {err}"
        ) from err
    return info


def _forget(name: str) -> None:
    sys.modules.pop(name, None)
    LOADED.pop(name, None)
    for key in [k for k, v in _ORIGINS.items() if v.module == name]:
        del _ORIGINS[key]


def load_plugin(spec: str | Path) -> PluginInfo:
    """Import one plugin: a ``.py`` file (or any existing file path) or a module name.

    Loading the same plugin again is a no-op that returns its :class:`PluginInfo`.

    Raises:
        PluginError: the file is missing, or the module cannot be imported, or importing it
            failed (the message names the plugin and the error).
    """
    text = str(spec)
    if text.endswith(".py") or os.sep in text or Path(text).is_file():
        return _load_file(Path(text))
    if text in LOADED:
        return LOADED[text]
    try:
        importlib.import_module(text)
    except ModuleNotFoundError as err:
        if err.name and text.startswith(err.name):
            raise PluginError(
                f"plugin module {text!r} is not importable here (no module named "
                f"{err.name!r}): install its package, or give a .py file"
            ) from err
        raise PluginError(f"plugin module {text!r} failed to import: {err}") from err
    except PluginError:
        raise
    except Exception as err:
        raise PluginError(
            f"plugin module {text!r} failed to import: {type(err).__name__}: {err}"
        ) from err
    info = describe_module(text)
    LOADED[text] = info
    return info


def load_plugins(specs: Iterable[str | Path]) -> list[PluginInfo]:
    """:func:`load_plugin` of each spec, in order."""
    return [load_plugin(s) for s in specs]


def load_entry_points(kind: str) -> None:
    """Import every installed package's entry points of ``kind``'s group (:data:`GROUPS`),
    once a process. An entry point's value names a module (or an object in one); importing it
    registers what it defines.

    Raises:
        PluginError: an entry point failed to import; the message names its package.
    """
    group = GROUPS[kind]
    if group in _GROUPS_DONE:
        return
    _GROUPS_DONE.add(group)
    for ep in metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        package = dist.name if dist is not None else None
        version = dist.version if dist is not None else None
        module = ep.value.split(":")[0].strip()
        top = module.split(".")[0]
        if top not in LOADED:
            LOADED[top] = PluginInfo(module, "entry point", package=package, version=version)
        try:
            ep.load()
        except PluginError:
            raise
        except Exception as err:
            raise PluginError(
                f"the plugin package {package or '(unknown package)'} failed to load its "
                f"entry point {ep.name} = {ep.value} (group {group}): "
                f"{type(err).__name__}: {err}"
            ) from err


def activate(plugins: Iterable[dict[str, Any]]) -> list[PluginInfo]:
    """Make sure the plugins a run needs are imported in THIS process (a worker of
    ``--jobs``, a Dask worker) and are the same code as where the run was planned.

    Args:
        plugins: the run's plugins as :meth:`PluginInfo.record` gives them.

    Returns:
        The plugins as this process has them.

    Raises:
        PluginError: a plugin's module is not here (naming the module and the worker), or it
            differs (another file content or package version).
    """
    out = []
    for rec in plugins:
        module = rec["module"]
        where = _worker_name()
        if rec.get("kind") == "file":
            path = rec.get("path")
            if module not in sys.modules and path and os.path.isfile(path):
                info = _load_file(Path(path))
            elif module in sys.modules:
                info = describe_module(module)
                if info.kind == "module" and info.sha256 is not None:
                    info = PluginInfo(module, "file", info.path, info.sha256)
            else:
                raise PluginError(
                    f"plugin module {module!r} ({Path(str(path)).name}) is not on worker "
                    f"{where}: ship it with Client.upload_file({Path(str(path)).name!r}) or "
                    f"install it as a package there"
                )
            if rec.get("sha256") and info.sha256 and info.sha256 != rec["sha256"]:
                raise PluginError(
                    f"plugin module {module!r} on worker {where} is another file (sha256 "
                    f"{info.sha256[:12]}) than the one given (sha256 {rec['sha256'][:12]})"
                )
        else:
            if rec.get("kind") == "entry point":
                for kind in GROUPS:  # the package's own registrations, as where it was planned
                    load_entry_points(kind)
            if module not in sys.modules:
                try:
                    importlib.import_module(module)
                except ImportError as err:
                    raise PluginError(
                        f"plugin module {module!r} (package {rec.get('package') or '?'}) is "
                        f"not on worker {where}: install it there ({err})"
                    ) from err
            info = describe_module(module)
            if rec.get("version") and info.version and info.version != rec["version"]:
                raise PluginError(
                    f"plugin package {rec.get('package')} on worker {where} is version "
                    f"{info.version}, not {rec['version']} as where the grid was planned"
                )
        out.append(info)
    return out


def _worker_name() -> str:
    """This process as an error names it: a Dask worker's address, else host and pid."""
    import socket

    if "distributed" in sys.modules:
        try:
            from distributed import get_worker

            return str(get_worker().address)
        except ValueError:
            pass
    return f"{socket.gethostname()} (pid {os.getpid()})"


def add_plugin_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--plugin MODULE_OR_FILE`` (repeatable) to a command's parser; ``eada.cli.main``
    loads the plugins before the command runs."""
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a plugin first: a .py file or a module that registers strategies, "
        "training components, backbones or methods through eada.extend (repeatable)",
    )
