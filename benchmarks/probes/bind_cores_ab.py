"""Core binding A/B: blocks of 2-process data-parallel training, alternately with every thread of each
rank pinned to its own core (parallel.bind_cores) and free to run on all cores, in the same two
processes (so drift of the shared host hits both alike).

    python -m mindgr.parallel.launch --nproc 2 --threads 1 --log-dir /tmp/ab -- \
        benchmarks/probes/bind_cores_ab.py --rounds 8 --steps 20     # rank 0 prints the table

Benchmark model and capacities: those of `mindgr bench distributed` (8192 tokens per rank).
"""
import argparse
import os
from pathlib import Path

import numpy as np

from mindgr.bench.scaling_blocks import _configs, run_dp_block
from mindgr.parallel.context import init_distributed, pin_threads

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--rank-tokens", type=int, default=8192)
args = ap.parse_args()
two_cfg, _, _ = _configs(None, ["parallel.bind_cores=true"], str(Path("/tmp") / f"bind-ab-{os.getpid()}"),
                         args.rank_tokens)
ctx = init_distributed(1, True)

from mindgr.parallel import comm  # noqa: E402  (after init_distributed)
from mindgr.parallel.executor import DataParallelExecutor  # noqa: E402
from mindgr.train.task import RetrievalTask  # noqa: E402
from mindgr.train.loop import TrainLoop  # noqa: E402

every_core = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
dp = TrainLoop(two_cfg, DataParallelExecutor(two_cfg, RetrievalTask(two_cfg)), quiet=True)
dp.executor.watchdog.timeout = max(dp.executor.watchdog.timeout, 60.0 * args.steps)
run_dp_block(dp, 4)
rates = {"pinned": [], "free": []}
for r in range(args.rounds):
    for variant in (("pinned", "free") if r % 2 == 0 else ("free", "pinned")):
        pin_threads(ctx.cores if variant == "pinned" else every_core)
        comm.barrier()
        rec = run_dp_block(dp, args.steps)
        rates[variant].append(rec["tokens"] / rec["wall_s"])
pin_threads(ctx.cores)
comm.barrier()
if ctx.rank == 0:
    a, b = np.array(rates["pinned"]), np.array(rates["free"])
    rng = np.random.default_rng(0)
    boot = [a[i].sum() / b[i].sum() for i in (rng.integers(0, len(a), len(a)) for _ in range(2000))]
    print(f"bind_cores A/B, {args.rounds} rounds x {args.steps} steps, cores {list(ctx.cores)} of {every_core}")
    print("  per round, real tokens/s pinned / free: " + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in zip(a, b)))
    print(f"  pinned / free = {a.sum() / b.sum():.3f} [95% {np.percentile(boot, 2.5):.3f}, "
          f"{np.percentile(boot, 97.5):.3f}]", flush=True)
dp.executor.watchdog.close()
