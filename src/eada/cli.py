"""The ``eada`` command line.

eada demo [--seeds N] [--out DIR] [--preset P]  the toy example (paper Fig. 5), no download
eada run PRESET|CONFIG.yaml [--method M] [--seeds 0-2] [--set key=value ...] [--out DIR]
eada run ... --dry-run                     validate and print the plan, touch no data
eada presets                               list presets and methods
eada strategies                            list query strategies
eada bench TASKS --methods M,... --seeds 0-2 --out DIR [--jobs N]   resumable grid + tables
eada config show PRESET [--method M]       print a preset as YAML, to edit and run
eada data index FOLDER --out LIST.txt      list file + class map + checksums of an image folder
eada data check SOURCE TARGET              validate a source/target image pair
eada data features CONFIG --out F.npz      a backbone's features of an image config (+ F.yaml)
eada report RUN_DIR [--out FILE.html]      self-contained HTML report of a run, benchmark or project
eada report --compare DIR... --out OUT    which differences between methods are significant
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from eada.plugins import add_plugin_argument
from eada.threads import add_threads_argument

if TYPE_CHECKING:
    from eada.config import ExperimentConfig

console = Console(stderr=False)
err_console = Console(stderr=True)


def _log(msg: str) -> None:
    err_console.print(msg, highlight=False)


def _cmd_demo(args: argparse.Namespace) -> int:
    from eada.demo import demo_notes, demo_table_rows, run_demo

    out = Path(args.out)
    results = run_demo(seeds=args.seeds, out=out, progress=_log, preset=args.preset)
    # the title as a plain line: a table title wraps at the table's width (rich, 80 columns)
    console.print(
        f"Toy example (paper Fig. 5), preset {args.preset}: target error %, "
        f"{seeds_text(args.seeds)}",
        soft_wrap=True,
        highlight=False,
    )
    table = Table()
    for col in ("method", "ours (mean ± std)", "paper"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for row in demo_table_rows(results):
        table.add_row(*row)
    console.print(table)
    for note in demo_notes(results):  # what this run's table shows that one would not expect
        console.print(f"note: {note}", soft_wrap=True, highlight=False)
    console.print(f"results: {out / 'results.json'}\nfigure:  {out / results['figure']}")
    return 0


def seeds_text(n: int) -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _resolve(args: argparse.Namespace, seed: int) -> ExperimentConfig:
    from eada.experiment import resolve_config

    return resolve_config(args.config, args.method, seed, args.set)


#: The accuracy columns of a run summary: key in ``results.json`` -> column name.
SUMMARY_COLUMNS = {
    "target/accuracy": "whole target (transductive)",
    "target_unlabeled/accuracy": "never-labeled target",
    "heldout/accuracy": "held-out split",
}


def summary_table(summary: dict[str, Any], title: str | None = None) -> Table:
    """The per-round table of a multi-seed summary (:func:`eada.experiment.summarize_runs`):
    labeled count and the accuracy (mean ± std) on the whole target set, on the target samples
    not labeled (at that point; at the final row: never labeled) and on the held-out split;
    ``-`` where a value was not measured (e.g. a round with no training after it)."""
    fin = summary["final"]
    splits = [k for k in SUMMARY_COLUMNS if f"last_epoch/{k}" in fin]

    def cell(stats: dict[str, Any] | None) -> str:
        return "-" if not stats else f"{stats['mean']:.2f} ± {stats['std']:.2f}"

    table = Table(title=title)
    table.add_column("round")
    table.add_column("labeled")
    for k in splits:
        table.add_column(SUMMARY_COLUMNS[k], justify="right")
    for row in summary["rounds"]:
        table.add_row(
            str(row["round"]), str(row["n_labeled"][0]), *[cell(row.get(k)) for k in splits]
        )
    table.add_row("final", "", *[cell(fin.get(f"last_epoch/{k}")) for k in splits])
    return table


def _dry_run_pool(cfg: ExperimentConfig) -> tuple[int | None, str]:
    """``--dry-run``: count the target pool where the data is at hand (a list file's lines or
    the in-memory domains: no image is decoded, nothing trained) and check the whole round plan
    against it (e.g. a budget larger than the pool). Returns ``(pool size or None, why not)``."""
    from eada.config import ImageListData
    from eada.data.images import flat_image_folder, load_image_list
    from eada.data.tasks import load_task
    from eada.plan import round_plan

    try:
        if isinstance(cfg.data, ImageListData):
            d = cfg.data
            flat = flat_image_folder(d.target)  # an unlabeled target (a project config's)
            target: Any = (
                flat
                if flat is not None
                else load_image_list(d.target, d.root, allow_outside=d.allow_outside_root)
            )
        else:
            target = load_task(cfg.data, cfg.seed).target
    except OSError as err:  # missing files; a list that is there but bad is an error (exit 2)
        return None, f"data not at hand ({err}); the round plan is checked when it is"
    round_plan(cfg.active, len(target))
    return len(target), ""


def _cmd_run(args: argparse.Namespace) -> int:
    import yaml

    from eada.config import ConfigError
    from eada.experiment import run_seeds
    from eada.runs import parse_seeds
    from eada.segmentation.config import is_segmentation_config

    if is_segmentation_config(args.config):  # `task: segmentation` -> eada.segmentation
        from eada.distributed import launched_distributed
        from eada.segmentation.cli import run_segmentation_command

        if launched_distributed():
            raise ConfigError("segmentation runs train in one process; launch without torchrun")

        return run_segmentation_command(args, console, _log)
    seeds = parse_seeds(args.seeds)
    configs = {s: _resolve(args, s) for s in seeds}
    cfg = configs[seeds[0]]
    if args.dry_run:
        console.print(yaml.safe_dump(cfg.resolved(), sort_keys=False))
        console.print(f"seeds: {seeds}")
        a = cfg.active
        if a.enabled:
            console.print(
                f"rounds at the end of epochs {a.rounds_at}: strategy {a.strategy}, "
                f"budget {a.budget_per_round} a round, alpha1 {a.alpha1}, "
                f"rule {a.selection_rule}"
            )
        else:
            console.print("no active rounds (no target labels)")
        n_pool, why = _dry_run_pool(cfg)  # the round plan against the real pool size
        if n_pool is None:
            console.print(f"config valid; no data touched (--dry-run): {why}")
        else:
            console.print(
                f"config valid; the round plan fits the target pool ({n_pool} samples, counted "
                "from the data; nothing decoded or trained) (--dry-run)"
            )
        return 0
    default_out = cfg.name.replace("/", "_") + (f"_{args.method}" if args.method else "")
    out = Path(args.out) if args.out else Path("runs") / default_out
    from eada import distributed
    from eada.train.logging import run_callbacks

    if distributed.launched_distributed():  # torchrun: join the group; rank 0 reports
        on_cpu = all(c.device == "cpu" for c in configs.values())  # gloo; else nccl on CUDA
        rank, world = distributed.setup("gloo" if on_cpu else None)
        if rank == 0:
            _log(f"distributed training: {world} processes ({distributed.backend_name()})")
    summary = run_seeds(
        lambda s: configs[s],
        seeds,
        out,
        progress=_log,
        make_callbacks=lambda s: run_callbacks(s, err_console, args.tensorboard),
    )
    if distributed.is_distributed():
        distributed.teardown()
    if not summary:  # a rank other than 0: rank 0 prints and writes
        return 0
    console.print(  # the title as a plain line: rich would wrap a table title at 80 columns
        f"{cfg.name} / {cfg.active.strategy}: accuracy % (mean ± std, {seeds_text(len(seeds))})",
        soft_wrap=True,
        highlight=False,
    )
    table = summary_table(summary, None)
    console.print(table)
    from eada.data.commands import print_summary_extras

    print_summary_extras(console, summary)  # protocol, last/best epoch, per-class table
    console.print(f"results: {out / 'results.json'}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from eada.config import ConfigError

    if args.compare:
        return _cmd_compare(args)
    if not args.run_dir:
        raise ConfigError("give a RUN_DIR to report on, or --compare DIR_OR_RUNS_JSONL...")
    from eada.reports.html import build_report
    from eada.reports.project import build_project_report, is_project

    if is_project(Path(args.run_dir)):  # an annotation project store (eada init)
        out = build_project_report(Path(args.run_dir), Path(args.out) if args.out else None)
        console.print(f"report: {out}")
        return 0
    out = build_report(
        Path(args.run_dir),
        Path(args.out) if args.out else None,
        data_root=Path(args.data_root) if args.data_root else None,
        figures_dir=Path(args.figures) if args.figures else None,
    )
    from eada.reports import collect

    for line in collect.data_changes(collect.load_report_input(Path(args.run_dir))):
        sys.stderr.write(f"note: the data changed since the run: {line}\n")
    console.print(f"report: {out}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    """``eada report --compare``: the significance tests of :mod:`eada.reports.compare`."""
    from eada.config import ConfigError

    if args.run_dir:
        raise ConfigError(f"give RUN_DIR ({args.run_dir}) or --compare, not both")
    if not args.out:
        raise ConfigError("--compare needs --out FOLDER (comparison.json, .md, the diagram)")
    from eada.reports.compare import compare, load_scores, write_comparison

    scores = load_scores([Path(p) for p in args.compare], args.metric)
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()] or None
    result = compare(
        scores,
        args.reference,
        alpha=args.alpha,
        rope=args.rope,
        posthoc=args.posthoc,
        methods=methods,
    )
    across = result["across_tasks"]
    if "friedman" in across:
        fr = across["friedman"]
        p = "-" if fr["p_value"] is None else f"{fr['p_value']:.3g}"
        console.print(
            f"{len(across['rows'])} methods on {len(across['tasks'])} tasks: Friedman p = {p}; "
            f"{len(across['significant_pairs'])} significant pair(s) ({result['posthoc']})"
        )
    else:
        console.print(across["note"])
    for path in write_comparison(result, Path(args.out)):
        console.print(f"wrote {path}")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from eada import plugins
    from eada.hparams import METHOD_LABELS, METHODS, PRESETS

    plugins.load_entry_points("method")  # the installed plugins' methods too
    console.print("presets: " + ", ".join(sorted(PRESETS)))
    for m in METHODS:
        console.print(f"method {m:<12} {METHOD_LABELS[m]:<16} {METHODS[m]}")
    return 0


def _cmd_strategies(args: argparse.Namespace) -> int:
    from eada import plugins
    from eada.strategies import all_strategies

    table = Table(title="query strategies")
    for col in ("name", "needs", "what", "source"):
        table.add_column(col)
    for s in all_strategies().values():  # the installed plugins' too
        plugin = plugins.provider("strategy", s.name)
        source = s.reference + (f"; plugin {plugin.label}" if plugin else "")
        table.add_row(s.name, ", ".join(s.needs) or "-", s.summary, source)
    console.print(table)
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    import yaml

    from eada.hparams import preset_config

    cfg = preset_config(args.preset, args.method)
    sys.stdout.write(yaml.safe_dump(cfg.resolved(), sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``eada`` command."""
    p = argparse.ArgumentParser(prog="eada", description="Active domain adaptation (EADA).")
    from eada import __version__

    p.add_argument("--version", action="version", version=f"eada {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser(
        "demo",
        help="the paper's toy example over several seeds (no download)",
        description="The paper's toy example (Fig. 5): Source-only, Random, BADGE, EADA and "
        "EADA without the alignment loss on the toy protocol, over several seeds. Prints the "
        "target errors (mean +- std) beside the paper's and writes OUT/results.json, the runs "
        "and a Fig.-5-like figure of the first seed. Nothing is downloaded; about a minute "
        "on 2 idle cores for the default 5 seeds. The default toy (preset toy-calibrated) "
        "trains its source model until it is trained at the first round (the paper's "
        "Fig. 5(a)) and has its open parameters calibrated so that Source-only and Random "
        "land on the paper's 52.0 and 8.5; --preset toy runs the original, uncalibrated toy "
        "(separation 7, rotation 90 degrees).",
    )
    d.add_argument("--seeds", type=int, default=5, help="number of seeds (default 5)")
    d.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    from eada.hparams import TOY_PRESETS

    d.add_argument(
        "--preset",
        choices=TOY_PRESETS,
        default=TOY_PRESETS[0],
        help=f"which toy (default {TOY_PRESETS[0]}; toy: the original, uncalibrated one)",
    )
    add_threads_argument(d)
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("run", help="run a preset or a YAML config over one or more seeds")
    r.add_argument("config", help="a preset name (see `eada presets`) or a YAML config file")
    r.add_argument("--method", default=None, help="method variant, e.g. random, eada, source_only")
    r.add_argument("--seeds", default="0", help="seeds, e.g. 0-4 or 0,1,2 (default 0)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set optim.lr=0.05 (repeatable)",
    )
    r.add_argument(
        "--out",
        default=None,
        help="output folder (default runs/<name>[_<method>]); a folder holding another config's "
        "runs is refused",
    )
    r.add_argument("--dry-run", action="store_true", help="validate and print the plan only")
    r.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR",
        help="write TensorBoard logs to DIR/seed<N> (needs eada[tensorboard])",
    )
    add_threads_argument(r)
    add_plugin_argument(r)
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("report", help="write a self-contained HTML report of a run folder")
    rp.add_argument(
        "run_dir",
        nargs="?",
        help="a folder of `eada run`, `eada demo`, a benchmark or a project store",
    )
    rp.add_argument(
        "--out",
        default=None,
        help="HTML file (default RUN_DIR/report.html); with --compare: the output folder",
    )
    rp.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="DIR_OR_RUNS_JSONL",
        help="compare the methods of these eada bench logs (folders or runs.jsonl): per-task "
        "paired t-tests against --reference, Friedman, post-hoc tests, the Bayesian "
        "signed-rank test and a critical-difference diagram (needs eada[stats])",
    )
    rp.add_argument("--reference", default="eada", help="with --compare: the reference method")
    rp.add_argument("--methods", default=None, help="with --compare: only these methods")
    rp.add_argument("--metric", default="target/accuracy", help="with --compare: the score")
    rp.add_argument("--alpha", type=float, default=0.05, help="with --compare: significance")
    rp.add_argument(
        "--rope", type=float, default=1.0, help="with --compare: Bayesian ROPE (points)"
    )
    rp.add_argument(
        "--posthoc",
        choices=("wilcoxon-holm", "nemenyi"),
        default="wilcoxon-holm",
        help="with --compare: the post-hoc test the diagram draws",
    )
    rp.add_argument("--figures", default=None, metavar="DIR", help="also save figures as PNG+SVG")
    rp.add_argument("--data-root", default=None, help="data set folder, to show queried images")
    rp.set_defaults(func=_cmd_report)

    from eada.bench import add_parser as add_bench_parser

    add_bench_parser(sub)  # eada bench: the resumable grid and the paper's tables

    ps = sub.add_parser("presets", help="list presets and methods")
    add_plugin_argument(ps)
    ps.set_defaults(func=_cmd_presets)
    st = sub.add_parser("strategies", help="list query strategies")
    add_plugin_argument(st)
    st.set_defaults(func=_cmd_strategies)

    c = sub.add_parser("config", help="config helpers")
    csub = c.add_subparsers(dest="config_command", required=True)
    cs = csub.add_parser("show", help="print a preset's resolved config as YAML")
    cs.add_argument("preset")
    cs.add_argument("--method", default=None)
    cs.set_defaults(func=_cmd_config_show)
    from eada.store.cli import add_config_set

    add_config_set(csub)  # eada config set --store DIR store.KEY=VALUE

    from eada.data.commands import add_data_commands

    add_data_commands(sub)  # eada data index / eada data check

    from eada.store.cli import add_store_commands  # init, query, label import, train, ...

    add_store_commands(sub)
    from eada.predict import add_predict_command

    add_predict_command(sub)  # eada predict --model DIR INPUT... --out preds.csv
    _describe_commands(p)
    return p


def _describe_commands(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so that
    ``eada CMD --help`` says what CMD does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
                _describe_commands(sub)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's stream)
        pass


OUTPUT_OPTIONS = ("out", "figures", "tensorboard")
"""The options through which a command writes files: each is checked against the project
stores' own files before any work (:func:`check_outputs`)."""

COMMAND_FILES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "run": ((("out", "folder"), ("tensorboard", "folder")), ("config", "plugin")),
    "demo": ((("out", "folder"),), ()),
    "report": ((("out", "file"), ("figures", "folder")), ("run_dir", "data_root")),
    "bench": ((("out", "folder"),), ("plugin",)),
    "data index": ((("out", "file"),), ("folder",)),
    "data features": ((("out", "file"),), ("config",)),
    "data unlabel": ((("out", "folder"), ("truth", "file")), ("folder",)),
    "data subset": ((("out", "folder"),), ("folder",)),
    "data fill-labels": ((("out", "file"),), ("round_csv", "truth")),
    "export": ((("out", "export"),), ()),
    "predict": ((("out", "file"),), ("inputs", "model", "labels")),
}
"""Each command that writes files: its output options with their kind (``file``, ``folder``,
``export``: :func:`eada.outputs.check_output`) and the options naming what it reads (its own
inputs, which no output may be)."""
POSITIONAL_OUT = frozenset({"data unlabel", "data subset"})
"""The commands whose output folder is the positional ``OUT``, not ``--out``."""
STDOUT_COMMANDS = frozenset({"predict"})
"""The commands whose ``--out -`` writes to standard output."""


def command_name(args: argparse.Namespace) -> str:
    """``data index``, ``export``, ...: the command (and subcommand) ``args`` were parsed for."""
    name = str(getattr(args, "command", ""))
    sub = getattr(args, f"{name.replace('-', '_')}_command", None)
    return f"{name} {sub}" if sub else name


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output option that no command may write
    (:func:`eada.outputs.check_output`: a device, FIFO, socket or link; a project store's
    files and folders, an export's model files, the command's own inputs), from the table
    :data:`COMMAND_FILES`; any other output option (:data:`OUTPUT_OPTIONS`) is checked against
    the store's own files (:func:`eada.outputs.check_not_store`; every writer checks it again).

    Raises:
        eada.outputs.OutputError: naming the option, the path and what owns it.
    """
    from eada.outputs import check_not_store, check_output

    command = command_name(args)
    outputs, input_options = COMMAND_FILES.get(command, ((), ()))
    if command == "report" and getattr(args, "compare", None):  # --compare: OUT is a folder
        outputs, input_options = (("out", "folder"),), ("compare",)
    inputs: list[str] = []
    for name in input_options:
        value = getattr(args, name, None)
        values = value if isinstance(value, list) else [value]
        inputs += [v for v in values if isinstance(v, str) and v and v != "-"]
    allow: list[Path] = []
    if command == "report" and args.run_dir:  # it rewrites its own page beside the run
        allow.append(Path(args.run_dir) / "report.html")
    checked = set()
    for name, kind in outputs:
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_output(
                value,
                "OUT" if name == "out" and command in POSITIONAL_OUT else f"--{name}",
                kind=kind,  # type: ignore[arg-type]
                inputs=inputs,
                allow=allow if name == "out" else (),
                stdout=command in STDOUT_COMMANDS and name == "out",
            )
            if command == "data index" and value != "-":
                check_output(f"{value}.sha256", "--out", inputs=inputs)  # its checksums
            checked.add(name)
    for name in OUTPUT_OPTIONS:
        value = getattr(args, name, None)
        if name not in checked and isinstance(value, str) and value:
            check_not_store(value, f"--{name}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``eada`` command; returns the exit status.

    Ctrl-C: the command line's own call (``argv`` ``None``) returns 130, as a shell tool does;
    a Python caller that passes ``argv`` (a test, a notebook) gets the ``KeyboardInterrupt``,
    so that one Ctrl-C stops it too rather than reading as a failed command."""
    args = build_parser().parse_args(argv)
    from eada.store.db import set_interface

    set_interface("cli")  # store messages name commands, not Python calls
    try:
        from eada.distributed import launched_distributed

        if launched_distributed() and args.func is not _cmd_run:
            from eada.config import ConfigError

            raise ConfigError(
                "under torchrun only `eada run` is distributed; run this command in one process"
            )
        check_outputs(args)  # before any work: never over a project store's own files
        if getattr(args, "threads", None) is not None:
            from eada.threads import set_threads

            set_threads(args.threads, local=command_name(args) != "bench")  # bench: workers' own
        if getattr(args, "plugin", None):  # --plugin: before the command reads any name
            from eada.plugins import load_plugins

            load_plugins(args.plugin)
        code: Any = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
    except KeyboardInterrupt:
        if argv is not None:
            raise
        return 130
    except BrokenPipeError:  # `eada ... | head` closed stdout: stop quietly, as a shell tool does
        _silence_stdout()
        return 141
    except Exception as err:  # one clear line (exit 2), or a bug: traceback to a log (exit 1)
        from eada.errors import report_error

        def say(msg: str) -> None:
            sys.stderr.write(msg + "\n")  # unwrapped: one line whatever the terminal

        return report_error(err, say, argv, getattr(args, "store", None))
    finally:
        set_interface("python")  # the caller (a test, a notebook) speaks Python again
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
