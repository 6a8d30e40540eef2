"""eada: active domain adaptation with energy-based models (EADA, AAAI 2022).

The notebook API (:mod:`eada.api`) is importable from here; torch is imported only when one of
its functions is first used::

    import eada
    eada.__version__
    model = eada.load_model("final")          # what `eada export` wrote
    proj = eada.create_project("proj", "C.yaml")  # = eada init --store proj --config C.yaml
    proj = eada.open_project("proj")          # an existing project store
    batch = eada.query(proj)                  # the next round's samples
    eada.import_labels(proj, records_or_dataframe)

and so are the experiments (the code of ``eada run`` and ``eada bench``)::

    records = eada.run("toy", method="random", seeds="0-2")     # = eada run toy --method ...
    records = eada.bench(["toy"], ["random", "eada"], "0-1", out="runs/g", jobs=2)
    df = eada.results("runs/g")                                 # pandas: one row a run
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import Any

try:
    __version__: str = _metadata.version("eada")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_API = (
    "LoadedModel",
    "accuracy_estimate",
    "audit",
    "create_project",
    "import_labels",
    "load_model",
    "open_project",
    "query",
    "results",
    "run",
)


def __getattr__(name: str) -> Any:
    if name in _API:
        from eada import api

        return getattr(api, name)
    if name == "bench":  # the module eada.bench, callable: eada.bench(tasks, methods, ...)
        import importlib

        return importlib.import_module("eada.bench")
    raise AttributeError(f"module 'eada' has no attribute {name!r}")


__all__ = ["__version__", "bench", *_API]
