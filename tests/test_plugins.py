"""Plugins: a strategy, component, backbone or method from outside eada, through
:mod:`eada.extend` only, loaded by ``--plugin``, a config's ``plugins:`` or an entry point, run
in-process and on ``--jobs`` workers, named in every record that used it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eada import plugins
from eada.cli import main
from eada.runs import read_jsonl
from support import PLUGIN, flat, kept_registries, surf_task, write_plugin


@pytest.fixture
def registries() -> Iterator[None]:
    """Every registry as it was before the test (a plugin's names are forgotten after it)."""
    with kept_registries():
        yield


def test_single_file_plugin_through_bench_on_two_jobs(
    tmp_path: Path, registries: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's check: ``eada bench T1,T2 --plugin plug.py --methods my_margin,random,eada
    --seeds 0-1 --jobs 2`` gives 12 records, the plugin (its file's SHA-256) named in the 4
    of my_margin and in no other; the template passes the plugin's strategy."""
    from eada.testing import check_strategy

    plug = write_plugin(tmp_path)
    t1, t2 = surf_task(tmp_path, "t1"), surf_task(tmp_path, "t2")
    out = tmp_path / "g"
    argv = ["bench", f"{t1},{t2}", "--plugin", str(plug), "--methods", "my_margin,random,eada"]
    code = main([*argv, "--seeds", "0-1", "--jobs", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    recs = read_jsonl(out / "runs.jsonl")
    assert len(recs) == 12
    named = [r for r in recs if r["plugins"]]
    assert sorted(r["method"] for r in named) == ["my_margin"] * 4
    sha = plugins.sha256_of(plug)
    for r in named:
        assert r["plugins"] == [
            {"module": "plug", "kind": "file", "path": str(plug.resolve()), "sha256": sha}
        ]
        assert r["strategy"] == "my_margin" and r["config"]["train"]["gamma"] == 0.0
    assert "my_margin" in capsys.readouterr().out  # its row in the tables
    check_strategy("my_margin")


def test_a_changed_plugin_file_on_a_worker_is_refused(tmp_path: Path, registries: None) -> None:
    plug = write_plugin(tmp_path, "changed_plug")
    info = plugins.load_plugin(plug)
    record = info.record()
    plugins.activate([record])  # the same file: fine
    with pytest.raises(plugins.PluginError, match="is another file"):
        plugins.activate([{**record, "sha256": "0" * 64}])
    gone = {**record, "module": "not_here_plug", "path": str(tmp_path / "not_here_plug.py")}
    with pytest.raises(plugins.PluginError, match=r"'not_here_plug' .* not on worker .*upload"):
        plugins.activate([gone])


def test_config_plugins_and_run(tmp_path: Path, registries: None) -> None:
    """A config's ``plugins:`` (a file beside the config) is imported before its strategy is
    checked; ``eada run`` records the plugin; an unknown setting of the plugin's strategy is
    an error naming the accepted ones, as for a built-in."""
    from eada.config import ConfigError, load_config

    write_plugin(tmp_path, "cfg_plug")
    cfg_file = Path(surf_task(tmp_path, "t1"))
    text = cfg_file.read_text().replace("strategy: eada", "strategy: my_margin")
    cfg_file.write_text(text + "plugins: [cfg_plug.py]\n")
    cfg = load_config(cfg_file)
    assert cfg.active.strategy == "my_margin"
    assert cfg.plugins == [str(tmp_path / "cfg_plug.py")]
    assert "plugins" in cfg.resolved()
    with pytest.raises(ConfigError, match=r"active.params.width is not a setting of strategy "
                       r"'my_margin'; accepted: .*temperature"):  # fmt: skip
        load_config(cfg_file, ["active.params.width=3"])
    assert main(["run", str(cfg_file), "--out", str(tmp_path / "r")]) == 0
    (line,) = read_jsonl(tmp_path / "r" / "runs.jsonl")
    assert line["plugins"][0]["module"] == "cfg_plug"


def test_names_of_builtins_are_refused_and_errors_name_the_plugin(
    tmp_path: Path, registries: None, capsys: pytest.CaptureFixture[str]
) -> None:
    clash = PLUGIN.replace('"my_margin", needs', '"margin", needs')
    with pytest.raises(plugins.PluginError, match=r"strategy 'margin' is a built-in of eada"):
        plugins.load_plugin(write_plugin(tmp_path, "clash", clash))
    assert "clash" not in sys.modules  # a failed plugin leaves nothing behind
    broken = write_plugin(tmp_path, "broken", "import numpy\nraise RuntimeError('oops')\n")
    code = main(["strategies", "--plugin", str(broken)])
    err = flat(capsys.readouterr().err)
    assert code == 2 and f"plugin file {broken} failed to import: RuntimeError: oops" in err
    code = main(["strategies", "--plugin", str(tmp_path / "missing.py")])
    assert code == 2 and "plugin file not found" in capsys.readouterr().err
    code = main(["bench", "toy", "--plugin", "no_such_module_x", "--out", str(tmp_path / "o")])
    assert code == 2 and "plugin module 'no_such_module_x' is not importable" in flat(
        capsys.readouterr().err
    )
    from eada.extend import register_method

    with pytest.raises(ValueError, match=r"method 'eada' is a built-in of eada"):
        register_method("eada", strategy="random")
    with pytest.raises(ValueError, match=r"method 'x': active.params.nope is not a setting"):
        register_method("x", strategy="random", params={"nope": 1})
    with pytest.raises(ValueError, match=r"unknown training component 'nothing'"):
        register_method("x", strategy="random", components=["nothing"])


def test_plugin_listed_by_eada_strategies(
    tmp_path: Path, registries: None, capsys: pytest.CaptureFixture[str]
) -> None:
    plug = write_plugin(tmp_path, "listed")
    assert main(["strategies", "--plugin", str(plug)]) == 0
    out = capsys.readouterr().out
    assert "my_margin" in out and "plugin listed.py" in flat(out).replace("│ ", "")


def test_a_component_backbone_and_method_from_a_plugin(tmp_path: Path, registries: None) -> None:
    """A training component (validated settings, the template), a method naming it, and a
    backbone, all through eada.extend."""
    from eada.hparams import preset_config
    from eada.models.backbones import build_backbone
    from eada.testing import check_component

    text = (
        PLUGIN
        + """
from typing import Any, ClassVar

import torch
from torch import nn

from eada.extend import AuxComponent, StepBatch, register_backbone, register_component
from eada.extend import register_method


@register_component
class Spread(AuxComponent):
    name = "spread"
    settings: ClassVar[dict[str, float | int]] = {"spread_weight": 0.1}

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight

    @classmethod
    def from_params(cls, dim: int, num_classes: int, params: dict[str, Any]) -> AuxComponent:
        return cls(float(cls.setting(params, "spread_weight")))

    def loss(self, batch: StepBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss = -self.weight * batch.zu.var(dim=0).mean()
        return loss, {"loss_spread": float(loss.detach())}


register_method("my_margin_spread", strategy="my_margin", components=["spread"],
                params={"spread_weight": 0.2})


@register_backbone("tiny_cnn")
def tiny_cnn(pretrained: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
"""
    )
    plugins.load_plugin(write_plugin(tmp_path, "fullplug", text))
    check_component("spread")
    cfg = preset_config("toy", "my_margin_spread", 0, ["train.epochs=3", "active.rounds_at=[1]"])
    assert cfg.active.params == {"aux_components": ["spread"], "spread_weight": 0.2}
    from eada.extend import plugins_of

    assert [p["module"] for p in plugins_of(cfg, "my_margin_spread")] == ["fullplug"]
    bb = build_backbone("tiny_cnn", weights="none")
    assert bb.feature_dim == 4 and bb.normalization.name == "imagenet"
    from eada.experiment import run_once

    res = run_once(cfg)
    assert any("loss_spread" in h for h in res["results"]["history"])
    assert res["plugins"][0]["module"] == "fullplug"
    from eada.extend import register_backbone

    with pytest.raises(ValueError, match=r"backbone 'resnet18' is a built-in"):
        register_backbone("resnet18")(lambda pretrained: None)


def test_record_fields_are_json(tmp_path: Path) -> None:
    info = plugins.PluginInfo("m", "entry point", package="p", version="1.0")
    assert json.loads(json.dumps(info.record())) == {
        "module": "m",
        "kind": "entry point",
        "package": "p",
        "version": "1.0",
    }
    assert info.label == "p 1.0"


PACKAGE_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "eada-plugin-demo"
version = "0.3.1"

[project.entry-points."eada.strategies"]
ep_margin = "eada_plugin_demo"

[tool.setuptools]
packages = ["eada_plugin_demo"]
"""

VENV_SCRIPT = """
import json, sys
from eada.cli import main
from eada.executors import LoopbackCluster

task, out = sys.argv[1], sys.argv[2]
grid = [task, "--methods", "ep_margin,random", "--seeds", "0"]
assert main(["strategies"]) == 0
assert main(["bench", *grid, "--jobs", "2", "--out", out + "/jobs"]) == 0
with LoopbackCluster(2, folder=out + "/dask-cluster") as cluster:
    assert main(["bench", *grid, "--dask", cluster.address, "--out", out + "/dask"]) == 0
    print("WORKERS", json.dumps(sorted(cluster.workers)))
"""


@pytest.mark.slow
def test_an_installed_plugin_package_is_found_by_its_entry_points(tmp_path: Path) -> None:
    """A plugin package installed with pip into a fresh virtual environment (entry points
    only, nothing of eada edited): ``eada strategies`` lists it, ``eada bench --methods``
    runs it in-process, on ``--jobs 2`` and on a 2-worker Dask cluster, and its records name
    the package and its version."""
    import os
    import site
    import subprocess

    pkg = tmp_path / "pkg"
    (pkg / "eada_plugin_demo").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PACKAGE_PYPROJECT)
    (pkg / "eada_plugin_demo" / "__init__.py").write_text(
        PLUGIN.replace('"my_margin"', '"ep_margin"')
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # the venv sees this environment's packages (torch, pip, ...) after its own
    (Path(purelib) / "_outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", str(pkg)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    task = surf_task(tmp_path, "t1")
    done = subprocess.run(
        [python, "-c", VENV_SCRIPT, task, str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ep_margin" in done.stdout and "eada-plugin-demo 0.3.1" in flat(done.stdout)
    workers = json.loads(done.stdout.split("WORKERS", 1)[1])
    expected = {"module": "eada_plugin_demo", "kind": "entry point"}
    expected |= {"package": "eada-plugin-demo", "version": "0.3.1"}
    for where in ("jobs", "dask"):
        recs = {r["method"]: r for r in read_jsonl(tmp_path / where / "runs.jsonl")}
        assert set(recs) == {"ep_margin", "random"}
        assert recs["ep_margin"]["plugins"] == [expected] and recs["random"]["plugins"] == []
    dask = read_jsonl(tmp_path / "dask" / "runs.jsonl")
    assert {r["worker"]["address"] for r in dask} <= set(workers)
    # nothing of the package is visible to this process: it lives in the venv only
    assert "eada_plugin_demo" not in sys.modules


def test_the_tutorials_plugins_pass_the_templates(tmp_path: Path) -> None:
    """docs/tutorial-your-method.md's two plugins, as the page shows them, pass the templates
    of the built-ins; its method trains its component."""
    from eada.strategies import get_strategy
    from eada.testing import check_component, check_strategy
    from test_docs_commands import doc_files

    with kept_registries():
        for name, text in doc_files("tutorial-your-method.md").items():
            plugins.load_plugin(write_plugin(tmp_path, name.removesuffix(".py"), text))
        check_strategy("density_margin")
        check_strategy(get_strategy("density_margin"), params={"beta": 2.0})
        check_component("target_entropy")
        from eada.hparams import get_method

        assert get_method("density_margin_ent")["active"]["params"] == {
            "aux_components": ["target_entropy"]
        }


def test_an_entry_point_that_fails_names_its_package_and_loads_lazily(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entry points are read only when a name is not a built-in (or a listing is asked for);
    one that fails to import is an error naming its package, its entry point and the error."""
    from types import SimpleNamespace

    from eada.strategies import get_strategy

    calls: list[str] = []

    class BrokenEntryPoint:
        name, value = "bad_margin", "bad_margin_pkg.plugin"
        dist = SimpleNamespace(name="bad-margin-pkg", version="2.0")

        def load(self) -> None:
            raise ImportError("No module named 'torch_extras'")

    def entry_points(group: str) -> list[BrokenEntryPoint]:
        calls.append(group)
        return [BrokenEntryPoint()] if group == "eada.strategies" else []

    with kept_registries():
        plugins._GROUPS_DONE.clear()
        monkeypatch.setattr(plugins.metadata, "entry_points", entry_points)
        assert get_strategy("margin").name == "margin" and calls == []  # a built-in: not read
        code = main(["bench", "toy", "--methods", "bad_margin", "--out", "o", "--dry-run"])
        err = flat(capsys.readouterr().err)
        assert code == 2 and calls[0] == "eada.methods"
        assert (
            "the plugin package bad-margin-pkg failed to load its entry point bad_margin = "
            "bad_margin_pkg.plugin (group eada.strategies): ImportError: No module named "
            "'torch_extras'" in err
        )


def test_store_commands_take_plugins(
    tmp_path: Path, registries: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``eada init``, ``train`` and ``query`` with ``--plugin``: a project store whose strategy
    is a plugin's; without the plugin the store's config names how to load it."""
    from support import toy_overrides

    plug = write_plugin(tmp_path, "store_plug")
    store = str(tmp_path / "p")
    sets = [a for o in [*toy_overrides(), "active.strategy=my_margin"] for a in ("--set", o)]
    assert main(["init", "--store", store, "--preset", "toy", *sets, "--plugin", str(plug)]) == 0
    assert main(["train", "--store", store, "--plugin", str(plug)]) == 0
    assert main(["query", "--store", store, "--plugin", str(plug)]) == 0
    capsys.readouterr()
    from eada.strategies import STRATEGIES

    del STRATEGIES["my_margin"]  # a fresh process without the plugin
    assert main(["query", "--store", store]) == 2
    err = flat(capsys.readouterr().err)
    assert "unknown strategy 'my_margin'" in err and "--plugin FILE_OR_MODULE" in err
