"""``eada report``: one self-contained HTML page for a run folder or a benchmark folder.

The page needs no network: figures are embedded (raster ones as base64 PNG, line and bar charts
as inline SVG), the style sheet is inline and there is no JavaScript. It holds the config, the
per-round table (mean +- std over seeds), every figure the stored records support (see
:mod:`eada.reports.figures_runs`) and the queried samples with their scores; for image data the
queried images are reloaded from the data set the config names, with a note where the data is
absent.

Example::

    eada run toy --seeds 0-2 --out runs/toy && eada report runs/toy
    eada report benchmarks/results/digits --out digits.html --figures figs/
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import re
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
import yaml
from matplotlib.figure import Figure

from eada.data.batches import iterate_inputs
from eada.reports import collect
from eada.reports.collect import ReportInput, RunGroup
from eada.reports.figures_runs import (
    Curve,
    FreeEnergyPanel,
    figure_bytes,
    plot_accuracy_curves,
    plot_domain_distances,
    plot_free_energy,
    plot_image_grid,
    plot_selected_error,
    plot_toy_rounds,
    save_figure,
)
from eada.runs import check_not_store, format_warning, write_bytes_atomic

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;
padding:1em 2em;color:#222;line-height:1.4}
h1{font-size:1.6em;border-bottom:2px solid #444}h2{margin-top:1.8em;border-bottom:1px solid #bbb}
h3{margin-top:1.4em}table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}figure{margin:1em 0}
figure img,figure svg{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555;max-width:900px}.note{background:#fff8e1;
border-left:4px solid #f0b400;padding:.4em .8em;font-size:.9em}pre{background:#f7f7f7;padding:.6em;
font-size:.8em;overflow-x:auto}details{margin:.5em 0}summary{cursor:pointer;font-weight:600}
.meta{font-size:.85em;color:#555}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _pm(stat: dict[str, Any] | None, digits: int = 2) -> str:
    if not stat or stat.get("mean") is None:
        return "-"
    return f"{stat['mean']:.{digits}f} ± {(stat.get('std') or 0.0):.{digits}f}"


def _table(head: list[str], rows: list[list[Any]], cls: str = "") -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "figure"


class _Figures:
    """Turns figures into HTML (and optionally PNG + SVG files)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self.saved: list[Path] = []
        self._n = 0

    def html(self, fig: Figure, name: str, caption: str, svg: bool = False) -> str:
        self._n += 1
        if self.out_dir is not None:
            stem = f"{self._n:02d}-{_slug(name)}"
            self.saved += save_figure(
                fig, self.out_dir / f"{stem}.png", self.out_dir / f"{stem}.svg"
            )
        if svg:
            with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"f{self._n}"}):
                text = figure_bytes(fig, "svg").decode()
            body = text[text.index("<svg") :]
            body = body.replace("<svg ", f'<svg role="img" aria-label="{_e(name)}" ', 1)
        else:
            b64 = base64.b64encode(figure_bytes(fig, "png")).decode()
            body = f'<img alt="{_e(name)}" src="data:image/png;base64,{b64}">'
        return f"<figure>{body}<figcaption>{_e(caption)}</figcaption></figure>"


# -- data reloading (for queried images / toy points) -----------------------------------------
class _Data:
    """Reloads the domains a run's config names, once per data config; ``None`` + a note
    when the data cannot be found."""

    def __init__(self, data_root: Path | None, base: Path) -> None:
        self.data_root = data_root
        self.base = base
        self.cache: dict[str, Any] = {}
        self.notes: dict[str, str] = {}

    def task(self, config: dict[str, Any], seed: int) -> Any:
        from eada.config import ExperimentConfig
        from eada.data.tasks import load_task

        data = dict(config["data"])
        key = json.dumps(data, sort_keys=True) + (f"/{seed}" if data["kind"] == "toy" else "")
        if key in self.cache:
            return self.cache[key]
        task = None
        if data.get("root") is not None:  # images configs may name no root
            candidates = [Path(data["root"])]
            if self.data_root is not None:
                candidates.insert(0, self.data_root)
            rel = Path(data["root"])
            if not rel.is_absolute():
                candidates += [p / rel for p in [self.base, *self.base.parents]]
            root = next((c for c in candidates if c.is_dir()), None)
            if root is None:
                self.notes[key] = (
                    f"data set not found (config root {data['root']!r}, also looked beside "
                    f"{self.base}); pass --data-root to show the queried images"
                )
                self.cache[key] = None
                return None
            data["root"] = str(root)
        try:
            cfg = ExperimentConfig.model_validate({**config, "data": data})
            task = load_task(cfg.data, seed)
        except (OSError, ValueError) as err:
            self.notes[key] = f"could not load the data set: {err}"
        self.cache[key] = task
        return task

    def note(self, config: dict[str, Any], seed: int) -> str:
        data = dict(config["data"])
        key = json.dumps(data, sort_keys=True) + (f"/{seed}" if data["kind"] == "toy" else "")
        return self.notes.get(key, "")


# -- sections ---------------------------------------------------------------------------------
def _summary_table(groups: list[RunGroup]) -> str:
    rows = []
    heldout = any(collect.final_stat(g, "heldout")["mean"] is not None for g in groups)
    # the target samples never labeled (the whole-target accuracy includes the labeled ones)
    never = any(collect.final_stat(g, "target_unlabeled")["mean"] is not None for g in groups)
    for g in groups:
        res = g.runs[0]["results"]
        if g.has_rounds:
            n_lab = res["rounds"][-1]["n_labeled"]
        else:  # e.g. a fully supervised reference run labels without rounds
            n_lab = len(res.get("labeled_indices", [])) or res.get("n_labeled", 0)
        row = [
            g.label,
            ", ".join(map(str, g.seeds)),
            f"{n_lab} ({100 * n_lab / g.n_target:.1f}%)" if g.n_target else str(n_lab),
            _pm(collect.final_stat(g, "target")),
            _pm(collect.final_stat(g, "target", "best_epoch")),
        ]
        if never:
            row.append(_pm(collect.final_stat(g, "target_unlabeled")))
        if heldout:
            row.append(_pm(collect.final_stat(g, "heldout")))
        rows.append(row)
    head = ["method", "seeds", "labeled", "target acc % (last epoch)", "target acc % (best epoch)"]
    if never:
        head.append("never-labeled target acc % (last epoch)")
    if heldout:
        head.append("held-out acc % (last epoch)")
    return _table(head, rows, "summary")


def _rounds_table(g: RunGroup) -> str:
    rows_in = collect.round_rows(g)
    if not rows_in:
        hist = g.runs[0]["results"]["history"]
        rows = []
        for i, rec in enumerate(hist):
            if "metrics" not in rec:
                continue
            vals = [
                r["results"]["history"][i]["metrics"]["target"]["accuracy"]
                for r in g.runs
                if i < len(r["results"]["history"]) and "metrics" in r["results"]["history"][i]
            ]
            rows.append([rec["epoch"], _pm(collect.mean_std(vals)), f"{rec.get('loss', 0):.4f}"])
        if not rows:
            return "<p>No selection rounds; no per-epoch history in these records.</p>"
        return "<p>No selection rounds (no target labels); accuracy per epoch:</p>" + _table(
            ["epoch", "target acc %", "loss (seed " + str(g.seeds[0]) + ")"], rows, "rounds"
        )
    heldout = any(r["heldout_accuracy"]["mean"] is not None for r in rows_in)
    head = ["round", "labeled", "labeled %", "measured at epoch", "target acc %"]
    head += ["held-out acc %"] if heldout else []
    head += ["error on queried %", "selection s", "scoring s"]
    rows = []
    for r in rows_in:
        row = [
            r["round"],
            r["n_labeled"],
            f"{r['labeled_pct']:.2f}",
            "-" if r["target_epoch"] is None else r["target_epoch"],
            _pm(r["target_accuracy"]),
        ]
        row += [_pm(r["heldout_accuracy"])] if heldout else []
        row += [
            _pm(r["selected_error_rate"], 1) if r["round"] else "-",
            _pm(r["selection_seconds"], 4) if r["round"] else "-",
            _pm(r["scoring_seconds"], 3) if r["round"] else "-",
        ]
        rows.append(row)
    return _table(head, rows, "rounds")


def _free_energy_html(groups: list[RunGroup], figs: _Figures, task: str) -> str:
    out = []
    finals = []
    for g in groups:
        stats = collect.domain_stats(g)
        if not stats or not stats[0]["snapshots"]:
            continue
        snaps = stats[0]["snapshots"]
        finals.append(
            FreeEnergyPanel(
                f"{g.label}: final (gap {collect.mean_free_energy_gap(snaps[-1]):+.2f})",
                snaps[-1]["free_energy"]["source"],
                snaps[-1]["free_energy"]["target"],
            )
        )
        if len(snaps) > 1:
            panels = [
                FreeEnergyPanel(
                    f"{s['stage']} (epoch {s['epoch']}, {s['n_labeled']} labeled)\n"
                    f"gap target-source {collect.mean_free_energy_gap(s):+.2f}",
                    s["free_energy"]["source"],
                    s["free_energy"]["target"],
                )
                for s in snaps
            ]
            fig = plot_free_energy(panels, f"{task} / {g.label} (seed {g.seeds[0]})")
            out.append(
                figs.html(
                    fig,
                    f"free energy rounds {task} {g.method}",
                    f"{g.label}: free-energy distributions of source (green) and target (red) "
                    "before each round and after the last epoch (the panel after 'before round r'"
                    " is the model after training with round r's labels); dashed = means.",
                )
            )
    if len(finals) > 1 or (finals and not out):
        fig = plot_free_energy(finals, f"{task}: free energy after training (paper Fig. 1)")
        out.insert(
            0,
            figs.html(
                fig,
                f"free energy final {task}",
                "Free-energy distributions of source (green) and target (red) after training, "
                "per method (paper Fig. 1); the gap is mean target minus mean source F.",
            ),
        )
    return "".join(out)


def _queried_html(g: RunGroup, figs: _Figures, data: _Data) -> str:
    """Queried samples of the first seed: image grid (image data) and the score table."""
    run = g.runs[0]
    rounds = [r for r in run["results"]["rounds"] if r.get("round", 0) > 0 and "selected" in r]
    if not rounds:
        return ""
    stats = run["results"].get("domain_stats", {})
    scores = {s["round"]: s for s in stats.get("selected", [])}
    out = [f"<h4>{_e(g.label)}: queried samples (seed {run['seed']})</h4>"]
    cfg = run["config"]
    if cfg["data"]["kind"] in ("digits", "images"):
        task = data.task(cfg, run["seed"])
        if task is None:
            out.append(
                f'<p class="note">Queried images not shown: {_e(data.note(cfg, run["seed"]))}</p>'
            )
        else:
            classes = task.target.classes
            grid_rows = []
            for r in rounds:
                sc = scores.get(r["round"], {})
                k = min(8, len(r["selected"]))
                idx = np.asarray(r["selected"][:k])
                caps, wrong = [], []
                for j in range(k):
                    y = classes[r["selected_labels"][j]]
                    p = f" p={classes[sc['predicted'][j]]}" if "predicted" in sc else ""
                    caps.append(f"y={y}{p}")
                    wrong.append(
                        "predicted" in sc and sc["predicted"][j] != r["selected_labels"][j]
                    )
                imgs = next(iterate_inputs(task.target.view("test"), [torch.from_numpy(idx)]))
                if imgs.ndim != 4 or imgs.shape[1] not in (1, 3):
                    break  # e.g. pre-extracted features: nothing to look at
                grid_rows.append((f"round {r['round']}", imgs.cpu().numpy(), caps, wrong))
            if not grid_rows:
                out.append('<p class="note">The inputs are not images (e.g. features).</p>')
            else:
                fig = plot_image_grid(grid_rows)
                out.append(
                    figs.html(
                        fig,
                        f"queried images {g.task} {g.method}",
                        f"{g.label}: the first {min(8, len(rounds[0]['selected']))} target images "
                        "queried in each round (in the strategy's order; y = true label, p = "
                        "prediction of the model that selected them; red frame: p is wrong).",
                    )
                )
    rows = []
    for r in rounds:
        sc = scores.get(r["round"], {})
        for j, (i, y) in enumerate(zip(r["selected"], r["selected_labels"], strict=True)):
            f = sc.get("free_energy", [None] * (j + 1))[j]
            u = sc.get("mvsm", [None] * (j + 1))[j]
            p = sc.get("predicted", [None] * (j + 1))[j]
            rows.append(
                [
                    r["round"],
                    j + 1,
                    i,
                    y,
                    "-" if p is None else p,
                    "-" if f is None else f"{f:.3f}",
                    "-" if u is None else f"{u:.3f}",
                ]
            )
    n = len(rows)
    out.append(
        f"<details><summary>{n} queried samples with their scores</summary>"
        + _table(
            ["round", "rank", "target index", "label", "predicted", "free energy F", "MvSM U"],
            rows,
            "queried",
        )
        + "</details>"
    )
    if not scores:
        out.append('<p class="note">This run was recorded without per-sample scores.</p>')
    return "".join(out)


def _toy_html(groups: list[RunGroup], figs: _Figures, data: _Data) -> str:
    from eada.reports.figures import ToyPanel

    panels = []
    for g in groups:
        run = g.runs[0]
        snaps = run["results"].get("domain_stats", {}).get("snapshots", [])
        heads = [s for s in snaps if "head" in s]
        if not heads:
            continue
        task = data.task(run["config"], run["seed"])
        if task is None:
            continue

        def wb(s: dict[str, Any]) -> tuple[np.ndarray, float]:
            w = np.asarray(s["head"]["weight"], float)
            b = np.asarray(s["head"]["bias"], float)
            return w[0] - w[1], float(b[0] - b[1])

        err = 100.0 - run["results"]["final"]["last_epoch"]["target"]["accuracy"]
        panels.append(
            ToyPanel.from_run(
                f"{g.label} (seed {run['seed']}): {err:.1f}% error",
                task,
                run,
                [wb(s) for s in heads if s["stage"] != "final"],
                wb(heads[-1]) if heads[-1]["stage"] == "final" else None,
            )
        )
    if not panels:
        return ""
    fig = plot_toy_rounds(panels)
    return figs.html(
        fig,
        "toy decision boundaries",
        "Toy example (paper Fig. 5) redrawn from the stored records: decision boundary before "
        "each round (dashed) and after training (solid), samples queried in each round marked.",
    )


def _warnings_html(groups: list[RunGroup]) -> str:
    """The runs' training warnings (the alignment runaway and drift, :mod:`eada.energy`), one
    line each with its method and seed; empty when there are none."""
    rows = []
    for g in groups:
        for run in g.runs:
            for w in run.get("results", {}).get("warnings", []):
                line = format_warning({"seed": run["seed"], **w}) if isinstance(w, dict) else w
                rows.append(f"<li>{_e(g.label)}: {_e(line)}</li>")
    if not rows:
        return ""
    return '<h3>Training warnings</h3><ul class="warnings">' + "".join(rows) + "</ul>"


def _segmentation_section(task: str, groups: list[RunGroup]) -> str:
    """A segmentation task (records of :mod:`eada.segmentation.train`): validation mIoU after
    each round and at the end, labeled images, mean ± std over seeds; the training warnings;
    the resolved configs. The classification figures (accuracy, free energies, queried
    samples) have no per-image counterpart recorded and are left out."""
    rows = []
    for g in groups:
        runs = [r["results"] for r in g.runs]
        for i in range(min(len(r["rounds"]) for r in runs)):
            recs = [r["rounds"][i] for r in runs]
            miou = [x["after_training"]["miou"] for x in recs if "after_training" in x]
            stat = collect.mean_std(miou) if len(miou) == len(recs) else None
            rows.append([g.label, str(i), str(recs[0]["n_labeled"]), _pm(stat)])
        final = collect.mean_std([r["final"]["miou"] for r in runs])
        rows.append([g.label, "final", str(len(runs[0]["labeled_indices"])), _pm(final)])
    head = ["method", "round", "labeled images", "val mIoU % (mean ± std)"]
    out = [f'<section class="task"><h2>{_e(task)}</h2>', "<h3>Strategies</h3>"]
    out.append(_table(head, rows, "summary"))
    out.append(_warnings_html(groups))
    out.append(_configs_html(groups))
    out.append("</section>")
    return "".join(out)


def _task_section(inp: ReportInput, task: str, figs: _Figures, data: _Data) -> str:
    groups = inp.by_task(task)
    if all(g.config.get("task") == "segmentation" for g in groups):
        return _segmentation_section(task, groups)
    out = [f'<section class="task"><h2>{_e(task)}</h2>']
    out.append("<h3>Strategies</h3>" + _summary_table(groups))
    out.append(_warnings_html(groups))
    curves = []
    for g in groups:
        x, m, s = collect.accuracy_curve(g)
        if x:
            curves.append(Curve(g.label, x, m, s, flat=not g.has_rounds))
    if any(not c.flat for c in curves):
        n_seeds = sorted({len(g.runs) for g in groups})
        fig = plot_accuracy_curves(curves, f"{task}: accuracy after each round")
        out.append(
            figs.html(
                fig,
                f"accuracy curves {task}",
                f"Target accuracy (whole target set) vs labeled target percentage, mean ± std "
                f"over {'/'.join(map(str, n_seeds))} seeds (bands); methods without rounds as "
                "dashed lines (paper Fig. 3 style).",
                svg=True,
            )
        )
    err_series = {g.label: e for g in groups if (e := collect.selected_error_series(g))}
    if err_series:
        head = ["method"] + [f"round {r}" for r in next(iter(err_series.values()))[0]]
        rows = [
            [lab, *[f"{m:.1f} ± {s:.1f}" for m, s in zip(v[1], v[2], strict=True)]]
            for lab, v in err_series.items()
        ]
        out.append("<h3>Error rate on the queried samples (%)</h3>" + _table(head, rows, "err"))
        out.append(
            figs.html(
                plot_selected_error(err_series),
                f"selected error {task}",
                "Error rate of the model on the samples it queried, at the time of the query "
                "(mean ± std over seeds; paper appendix table).",
                svg=True,
            )
        )
    fe = _free_energy_html(groups, figs, task)
    if fe:
        out.append("<h3>Free-energy distributions</h3>" + fe)
    fixed = [g.label for g in groups if collect.features_fixed(g)]
    dist = {
        g.label: d for g in groups if g.label not in fixed and (d := collect.distance_series(g))
    }
    if fixed:
        out.append(
            f'<p class="note">{_e(", ".join(fixed))}: the features before the energy head have '
            "no trainable parameters (a linear model), so the A-distance and MMD between "
            "source and target features cannot change during training and are not shown.</p>"
        )
    if dist:
        rows = []
        for lab, (_stages, am, as_, mm, ms) in dist.items():
            rows.append(
                [
                    lab,
                    f"{am[0]:.3f} ± {as_[0]:.3f}",
                    f"{am[-1]:.3f} ± {as_[-1]:.3f}",
                    f"{mm[0]:.4f} ± {ms[0]:.4f}",
                    f"{mm[-1]:.4f} ± {ms[-1]:.4f}",
                ]
            )
        first = next(iter(dist.values()))[0]
        out.append(
            "<h3>Domain discrepancy (A-distance, MMD²)</h3>"
            + _table(
                [
                    "method",
                    f"A-distance ({first[0]})",
                    "A-distance (final)",
                    f"MMD² ({first[0]})",
                    "MMD² (final)",
                ],
                rows,
                "dist",
            )
            + figs.html(
                plot_domain_distances(dist),
                f"domain distances {task}",
                "Proxy A-distance 2(1-2·err) of a logistic-regression domain classifier and "
                "unbiased RBF MMD² (median heuristic) between source and target penultimate "
                "features of fixed subsamples, per snapshot (mean ± std over seeds; paper "
                "appendix).",
                svg=True,
            )
        )
    if any(g.config["data"]["kind"] == "toy" for g in groups):
        toy = _toy_html(groups, figs, data)
        if toy:
            out.append("<h3>Decision boundaries and queried samples</h3>" + toy)
    queried = "".join(_queried_html(g, figs, data) for g in groups)
    if queried:
        out.append("<h3>Queried samples</h3>" + queried)
    out.append("<h3>Per-round results (mean ± std over seeds)</h3>")
    for g in groups:
        out.append(f"<h4>{_e(g.label)} — {len(g.runs)} seed(s) from {_e(g.path)}</h4>")
        out.append(_rounds_table(g))
    out.append(_configs_html(groups))
    out.append("</section>")
    return "".join(out)


def _configs_html(groups: list[RunGroup]) -> str:
    """Each group's resolved config (YAML), folded."""
    return "<h3>Configs</h3>" + "".join(
        f"<details><summary>{_e(g.label)}</summary><pre>"
        f"{_e(yaml.safe_dump(g.config, sort_keys=False))}</pre></details>"
        for g in groups
    )


def _demo_html(inp: ReportInput) -> str:
    res = inp.extra.get("results")
    if not res or "strategies" not in res:
        return ""
    rows = [
        [
            s["label"],
            f"{s['mean_error']:.1f} ± {s['std_error']:.1f}",
            "-" if s.get("paper_error") is None else f"{s['paper_error']:.1f}",
        ]
        for s in res["strategies"].values()
    ]
    out = "<h2>Toy example: target error vs the paper</h2>" + _table(
        ["method", "target error % (ours)", "paper"], rows, "demo"
    )
    fig = inp.path / str(res.get("figure", "toy_fig5.png"))
    redrawn = any(  # the task section redraws the toy figure from the records: not twice
        "head" in s
        for g in inp.groups
        for s in g.runs[0]["results"].get("domain_stats", {}).get("snapshots", [])
    )
    if fig.is_file() and not redrawn:
        b64 = base64.b64encode(fig.read_bytes()).decode()
        out += (
            f'<figure><img alt="toy figure" src="data:image/png;base64,{b64}">'
            f"<figcaption>{_e(fig.name)} as written by eada demo.</figcaption></figure>"
        )
    return out


def build_report(
    path: Path,
    out: Path | None = None,
    data_root: Path | None = None,
    figures_dir: Path | None = None,
) -> Path:
    """Write the HTML report of the runs under ``path`` and return its path.

    Args:
        path: a run folder, a ``eada demo`` folder or a benchmark folder
            (:func:`eada.reports.collect.load_report_input`).
        out: the HTML file (default ``path/report.html``).
        data_root: where the data set lives, when the config's ``data.root`` does not resolve
            from here (used only to show queried images).
        figures_dir: also write every figure there as PNG and SVG.

    Raises:
        FileNotFoundError: no runs under ``path``.
    """
    out = Path(out) if out is not None else Path(path) / "report.html"
    check_not_store(out)  # before any work: never over a project store's files
    if figures_dir is not None:
        check_not_store(figures_dir, "--figures")
    inp = collect.load_report_input(Path(path))
    figs = _Figures(Path(figures_dir) if figures_dir is not None else None)
    data = _Data(Path(data_root) if data_root is not None else None, Path(path).resolve())
    meta_file = Path(path) / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else None
    title = f"eada report: {Path(path).resolve().name}"
    parts = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{_e(inp.kind)} folder {_e(Path(path).resolve())}; '
        f"{len(inp.groups)} method group(s), {sum(len(g.runs) for g in inp.groups)} run(s); "
        f"generated {_dt.datetime.now().isoformat(timespec='seconds')}</p>",
    ]
    changed = collect.data_changes(inp)
    if changed:
        parts.append(
            '<p class="warn"><b>The data changed since these runs ran</b>: the results below '
            "are of the data as it was then.</p><ul>"
            + "".join(f"<li>{_e(c)}</li>" for c in changed)
            + "</ul>"
        )
    if meta:
        git = meta.get("git") or {}
        parts.append(
            f'<p class="meta">eada {_e(meta.get("eada"))}, torch {_e(meta.get("torch"))}, '
            f"commit {_e(str(git.get('commit'))[:12])}{' (dirty)' if git.get('dirty') else ''}, "
            f"{_e(meta.get('platform'))}, {_e(meta.get('time_utc'))}</p>"
        )
    if inp.kind == "demo":
        parts.append(_demo_html(inp))
    if not any(collect.domain_stats(g) for g in inp.groups):
        parts.append(
            '<p class="note">These records carry no domain statistics (compact eada bench '
            "lines, or runs recorded before the statistics existed): the free-energy, "
            "A-distance/MMD and toy-boundary figures are left out.</p>"
        )
    for task in inp.tasks:
        parts.append(_task_section(inp, task, figs, data))
    return write_html(out, title, parts)


def write_html(out: Path, title: str, parts: list[str]) -> Path:
    """Write one self-contained page (the report CSS inline) of ``parts`` to ``out``
    atomically (:func:`eada.runs.write_bytes_atomic`): a failed write (a full disk) leaves the
    previous page and no partial file, and its error names ``out``. The page is private
    (0600, whatever the umask and the folder): a project's report names its annotators."""
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        + "".join(parts)
        + "</body></html>\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all; errors name out; 0600 wherever it goes (annotator names, e-mails)
    return write_bytes_atomic(out, doc.encode("utf-8"), mode=0o600)
