"""Distributed scoring/selection (2 gloo processes) and streaming scores."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from eada import energy
from eada.distributed import shard, stream_scores
from eada.strategies import PoolOutputs, get_strategy


def test_shard_partitions_exactly() -> None:
    for n in (0, 1, 7, 100, 101):
        for world in (1, 2, 3, 8):
            parts = [shard(n, r, world) for r in range(world)]
            covered = [i for s in parts for i in range(n)[s]]
            assert covered == list(range(n))
            sizes = [s.stop - s.start for s in parts]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="bad rank"):
        shard(10, 2, 2)


def test_stream_scores_equal_in_memory() -> None:
    g = torch.Generator().manual_seed(0)
    e = torch.randn(1000, 17, generator=g) * 3
    f, u = stream_scores(iter(e.split(64)), n=1000)
    np.testing.assert_array_equal(f, energy.free_energy(e).numpy())
    np.testing.assert_array_equal(u, energy.mvsm(e).numpy())
    f2, u2 = stream_scores(iter(e.split(300)))
    np.testing.assert_array_equal(u2, u)
    np.testing.assert_array_equal(f2, f)
    with pytest.raises(ValueError, match="announced"):
        stream_scores(iter(e.split(64)), n=999)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pool(n: int = 2003, c: int = 7, d: int = 5) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(d, c)
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    return model, x


WORKER = """
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, {tests!r})
from test_distributed import _pool
from eada.distributed import broadcast_indices, gather_scores, setup, shard, stream_scores
from eada.strategies import PoolOutputs, get_strategy
import torch.distributed as dist

rank, world = setup("gloo")
model, x = _pool()
sl = shard(len(x), rank, world)
with torch.no_grad():
    f, u = stream_scores(iter(model(x[sl]).split(100)))
f_all, u_all = gather_scores(f, len(x)), gather_scores(u, len(x))
chosen = None
if rank == 0:
    pool = PoolOutputs(free_energy=f_all, mvsm=u_all, n_target=len(x))
    chosen = get_strategy("eada").fn(pool, 40, None, alpha1=0.5).indices
idx = broadcast_indices(chosen)
np.save(Path({out!r}) / f"rank{{rank}}.npy", idx)
np.save(Path({out!r}) / f"f{{rank}}.npy", f_all)
dist.destroy_process_group()
"""


def test_two_gloo_processes_select_exactly_the_single_process_set(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(script),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model, x = _pool()
    with torch.no_grad():
        e = model(x)
    single = (
        get_strategy("eada")
        .fn(PoolOutputs(energies=e.numpy(), n_target=len(x)), 40, None, alpha1=0.5)
        .indices
    )
    r0, r1 = np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy")
    np.testing.assert_array_equal(r0, single)
    np.testing.assert_array_equal(r1, single)
    np.testing.assert_array_equal(np.load(tmp_path / "f0.npy"), np.load(tmp_path / "f1.npy"))
