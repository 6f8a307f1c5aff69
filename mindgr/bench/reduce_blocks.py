"""Rank program of `mindgr bench distributed --method reduce`: the data-parallel step with the dense
gradients summed by the hand-written flat AllReduce (parallel.grad_reduce=own), by the shared-memory host
sum (grad_reduce=host, on an x86-64 host) and by MindSpore's DATA_PARALLEL reducer (grad_reduce=mindspore,
with several fusion bucket counts), alternated in blocks inside the same two processes.

    python -m mindgr.parallel.launch --nproc 2 --threads 1 --log-dir D -- \
        -m mindgr.bench.reduce_blocks --out D/reduce.json --rounds 12 --steps 10 --buckets 1,2,4,0 \
        [SECTION.KEY=VALUE ...]

Every side is a DataParallelExecutor on the benchmark model (mindgr.bench.distributed_common) with the
same seed, data and fixed cost model (parallel.calibrate=false), so every side splits every global batch
the same way and runs the same forward + backward; only the reduce + update graph differs. The job runs
in MindSpore's DATA_PARALLEL mode throughout (the mindspore sides need it before any parameter exists);
the flat sum's graph has one explicit AllReduce and no fused ones, which the mode does not change. Each
side is built and compiled before the next one is created (a bucket count is context state, read when
that side's reducer is built). Each round runs every side once, in a rotating order, each block after a
barrier; the weights of each side keep training.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mindgr.bench.distributed_common import block_parser
from mindgr.paths import write_json_atomic

# The benchmark model's cost model (benchmarks/results/distributed.md, calibrated probe): every side uses it,
# so the splits are identical; its exact values only shape the balance, equally for every side.
FIXED_COST = ["parallel.calibrate=false", "parallel.cost_b=1.44e-8", "parallel.cost_a=1e-7"]


def side_names(buckets: list[int]) -> list[str]:
    from mindgr.parallel.host_sum import supported
    return ["own"] + (["host"] if supported() is None else []) + [f"ms{b}" for b in buckets]


def main(argv=None) -> int:
    ap = block_parser("python -m mindgr.bench.reduce_blocks", "side")
    ap.add_argument("--buckets", default="1,2,4,0", help="fusion bucket counts of the mindspore sides (0 = unfused)")
    ap.add_argument("overrides", nargs="*", help="SECTION.KEY=VALUE, applied to every side")
    args = ap.parse_args(argv)
    buckets = [int(b) for b in args.buckets.split(",") if b.strip()]

    from mindgr.bench.scaling_blocks import _configs, run_dp_block
    from mindgr.config import load_config
    from mindgr.parallel import comm
    from mindgr.parallel.context import init_distributed, use_data_parallel_mode
    run_dir = Path(args.out).resolve().parent / "runs"
    two_cfg, _, common = _configs(args.config, args.overrides + FIXED_COST, str(run_dir), args.rank_tokens)
    ctx = init_distributed(1, two_cfg.parallel.bind_cores)     # msrun's scheduler process stops in here
    if ctx.world != 2:
        raise SystemExit(f"reduce_blocks: needs exactly 2 ranks, got {ctx.world}")
    use_data_parallel_mode(ctx.world)                          # before any side creates a parameter
    from mindgr.parallel.executor import DataParallelExecutor
    from mindgr.train.loop import TrainLoop
    from mindgr.train.task import RetrievalTask

    names = side_names(buckets)
    sides = {}
    for name in names:
        extra = [f"parallel.grad_reduce={name}"] if name in ("own", "host") else [
            "parallel.grad_reduce=mindspore", f"parallel.grad_buckets={int(name[2:])}"]
        cfg = load_config(args.config, common + extra + [
            f"data.token_capacity={two_cfg.data.token_capacity}", f"data.row_capacity={two_cfg.data.row_capacity}",
            f"run.name={name}"])
        loop = TrainLoop(cfg, DataParallelExecutor(cfg, RetrievalTask(cfg)), quiet=True)
        loop.executor.watchdog.timeout = max(loop.executor.watchdog.timeout, 60.0 * args.steps * len(names))
        run_dp_block(loop, args.warmup)                       # compiled now, under this side's fusion split
        sides[name] = loop
    splits = {n: (list(s.executor.dp.apply_cell.splits) if n.startswith("ms") else None) for n, s in sides.items()}

    blocks = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            comm.barrier()
            for s in sides.values():
                s.executor.watchdog.beat(f"block {name} of round {r}")
            rec = run_dp_block(sides[name], args.steps)
            comm.barrier()
            blocks.append({"round": r, "side": name, "rank": ctx.rank, **rec})

    fields = ("round", "rank", "wall_s", "tokens", "steps", "step_s", "cpu_s", "host_cpu_s", "local_s", "apply_s")
    mine = np.array([[blk[f] for f in fields] + [names.index(blk["side"])] for blk in blocks], np.float64)
    every = comm.all_gather(mine.reshape(-1, len(fields) + 1))
    if ctx.rank == 0:
        rows = [{**dict(zip(fields, row[:-1].tolist())), "side": names[int(row[-1])]} for row in every]
        for row in rows:
            for f in ("round", "rank", "tokens", "steps"):
                row[f] = int(row[f])
        result = {"rank_tokens": two_cfg.data.token_capacity // 2, "rounds": args.rounds,
                  "steps_per_block": args.steps, "sides": names, "fusion_splits": splits,
                  "overrides": args.overrides + FIXED_COST, "blocks": rows}
        write_json_atomic(args.out, result, indent=None, sort_keys=False)
    comm.barrier()
    for s in sides.values():
        s.executor.watchdog.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
