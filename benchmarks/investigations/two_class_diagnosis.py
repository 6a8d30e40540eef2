"""Which part of the ``normalized`` alignment costs accuracy on the two-class SURF tasks where it
loses (``benchmarks/investigations/two_class.py``): two ablations of it, run exactly as the
default otherwise.

* ``detached_source_scale``: the joint scale ``sigma`` takes the source batch's energies without
  gradient. By Euler's theorem the default's loss has no gradient along a common scale of both
  batches, so every push that sharpens the target is matched by one that flattens the source;
  this ablation removes the source's share of that push (and the scale invariance with it).
* ``no_batch_recentring``: the per-sample centred ``G`` over ``sigma`` instead of ``B``: the
  energies are not taken relative to the batch's class means (at ``C = 2`` that recentring
  removes the batch's mean margin, i.e. pushes every batch towards a 50/50 split).

A third, ``zero_weight`` (``L_fea`` computed on the default's batches but weighted 0), was run
here first; it is now the library's ``eada_no_fea`` (``train.fea_gate: zero``), whose runs equal
its committed records (``diagnosis/surf/*/zero_weight``: the same final metrics and the
same labeled samples on the four tasks, seeds 0-2).

Usage: ``python benchmarks/investigations/two_class_diagnosis.py [--tasks surf/A-W,surf/W-A]
[--seeds 0-2]``
(results under ``benchmarks/results/two_class/diagnosis/``; the patches live in this script
only, the library is unchanged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import eada.energy as energy
from eada.experiment import run_seeds
from eada.runs import parse_seeds, write_json

sys.path.insert(0, str(Path(__file__).parent))
from two_class import config_maker, last_acc, read_runs, surf_tasks

_scale, _balanced = energy.alignment_scale, energy.balanced_free_energy


def _detached_source_scale(*batches: torch.Tensor, floor: float = 1.0) -> torch.Tensor:
    return _scale(batches[0].detach(), *batches[1:], floor=floor)


def _centred(energies: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    return energy.centered_free_energy(energies, tau)


ABLATIONS = {
    "detached_source_scale": ("alignment_scale", _detached_source_scale),
    "no_batch_recentring": ("balanced_free_energy", _centred),
}


def main(argv: list[str] | None = None) -> int:
    """Run each ablation on the tasks and seeds; write ``summary.json``."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tasks", default="surf/A-W,surf/W-A")
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--data", default="../shared/data/office_caltech10_surf")
    p.add_argument("--out", default="benchmarks/results/two_class/diagnosis")
    p.add_argument("--ablations", default=",".join(ABLATIONS), help="comma-separated")
    args = p.parse_args(argv)
    out, seeds = Path(args.out), parse_seeds(args.seeds)
    unknown = sorted(set(args.ablations.split(",")) - set(ABLATIONS))
    if unknown:
        p.error(f"--ablations: unknown {', '.join(unknown)}; known: {', '.join(ABLATIONS)}")
    tasks = {i["folder"]: i for i in surf_tasks(Path(args.data)).values()}
    summary_file = out / "summary.json"  # earlier invocations' entries are kept
    summary: dict[str, Any] = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    for folder in args.tasks.split(","):
        info = tasks[folder]
        summary.setdefault(folder, {})
        for name in args.ablations.split(","):
            attr, fn = ABLATIONS[name]
            setattr(energy, attr, fn)
            try:
                run_seeds(config_maker(info, "normalized"), seeds, out / folder / name)
            finally:
                energy.alignment_scale, energy.balanced_free_energy = _scale, _balanced
            accs = [
                last_acc(r) for r in sorted(read_runs(out / folder / name), key=lambda r: r["seed"])
            ]
            summary[folder][name] = {"accuracy": accs, "mean": float(np.mean(accs))}
            print(folder, name, summary[folder][name], file=sys.stderr)
    write_json(summary_file, summary)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
