"""What recording a run's data identity costs (:func:`eada.data.identity.data_inputs`): the first
call of a process (files hashed, images stat-ed) and a repeat (the per-process cache of file
digests; image lists and folders are stat-ed again), on the shared data.

    python benchmarks/investigations/data_digest_cost.py [--data ../shared/data] [--repeats 5]
        [--out benchmarks/results/data_digest_cost.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from eada.config import load_config
from eada.data.identity import clear_cache, data_inputs
from eada.hparams import preset_config
from eada.runs import environment_info, write_json


def _cases(data: Path) -> dict[str, Any]:
    digits = [f"data.root={data / 'digits'}"]
    return {
        "digits/mnist-usps (4 gzipped files)": preset_config(
            "digits/mnist-usps", "eada", 0, digits
        ),
        "digits/mnist-mnistm (MNIST files + 9,001 PNGs stat-ed)": preset_config(
            "digits/mnist-mnistm", "eada", 0, digits
        ),
        "Office-Caltech10 SURF Caltech10->amazon (2 .mat files, 250 KB)": load_config(
            "configs/office_caltech10_surf.yaml"
        ),
        "Office-31 amazon subset->webcam folders (1,795 JPEGs stat-ed)": load_config(
            "configs/office31_amazon_subset_webcam_lite0_frozen.yaml"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/data_digest_cost.json")
    args = ap.parse_args(argv)
    rows = {}
    load_before = os.getloadavg()
    for name, cfg in _cases(Path(args.data)).items():
        first, again = [], []
        for _ in range(args.repeats):
            clear_cache()
            t0 = time.perf_counter()
            inputs = data_inputs(cfg.data, cfg.model)
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            data_inputs(cfg.data, cfg.model)
            again.append(time.perf_counter() - t0)
        rows[name] = {
            "first_s": first,
            "repeat_s": again,
            "first_median_s": statistics.median(first),
            "repeat_median_s": statistics.median(again),
            "inputs": sorted(inputs),
        }
        print(
            f"| {name} | {statistics.median(first):.3f} | {statistics.median(again):.3f} |",
            flush=True,
        )
    env = environment_info()
    write_json(
        Path(args.out),
        {
            "cases": rows,
            "repeats": args.repeats,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "environment": env,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
