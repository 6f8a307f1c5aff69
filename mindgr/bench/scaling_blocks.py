"""Rank program of `mindgr bench distributed` (blocks method): scaling efficiency measured by alternating
short blocks of 1- and 2-process training inside the same two long-lived processes.

    python -m mindgr.parallel.launch --nproc 2 --threads 1 --log-dir D -- \
        -m mindgr.bench.scaling_blocks --out D/blocks.json --rounds 12 --steps 10 [--rank-tokens T] [SECTION.KEY=VALUE ...]

Every rank builds two trainers on the benchmark model: the data-parallel one (DataParallelExecutor, global
batch = 2 x the per-rank capacity) and a single-process one (Trainer, own weights, batch = the per-rank
capacity, no collective). Each round runs, in a rotating order and each after a barrier:
  two     both ranks train the data-parallel model together (gradient AllReduce every step);
  split   with parallel.fused_step=true only: as `two`, in the two-graph step (forward + backward, then
          all-reduce + update) where `two` runs the one-graph step; the same weights train on, so the
          rounds compare the two steps side by side;
  local   both ranks run the data-parallel trainer's steps without the all-reduce and the update (its
          host path and forward + backward alone; attributes the cost of `two`; weights do not change);
  pair    both ranks train their own single-process model at the same time (side by side: as many
          busy processes as in `two`, no communication);
  alone   one rank trains its single-process model while the other waits in a barrier (a rank waiting
          in a collective burns no CPU, measured: docs in benchmarks/results/distributed.md); the
          waiting rank alternates between rounds.
Blocks of the same round are seconds apart, so slow drift of a shared machine hits every variant alike;
the per-round ratios show what is left of the noise. tokens/s = real tokens / wall time of the block.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mindgr.bench.distributed_common import RANK_TOKENS, block_parser
from mindgr.paths import write_json_atomic

VARIANTS = ("two", "split", "local", "pair", "alone")


def run_dp_block(trainer, steps: int) -> dict:
    """mindgr.bench.run_block, plus the data-parallel trainer's split of its steps (forward + backward,
    all-reduce + update)."""
    from mindgr.bench import run_block
    from mindgr.parallel.executor import DataParallelExecutor
    rec = run_block(trainer, steps)
    rec["local_s"] = rec["apply_s"] = 0.0
    if isinstance(trainer.executor, DataParallelExecutor):    # its per-step split of the block
        rec["local_s"], rec["apply_s"] = trainer.executor.take_step_split()
    return rec


def synthetic_codes_override(cfg, run_dir: str) -> list[str]:
    """A semantic-ID task's config without codes trains on a seeded synthetic table of its shape
    (mindgr.bench.train.synthetic_codes), written once per process: [`ids.codes=PATH`], else []."""
    from mindgr.bench.train import _gr_synthetic_codes
    folder = Path(run_dir) / f"codes-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return [f"ids.codes={cfg.ids.codes}"] if _gr_synthetic_codes(cfg, str(folder)) else []


def _configs(config: str | None, overrides: list[str], run_dir: str, tokens: int = RANK_TOKENS):
    from mindgr.bench.distributed_common import SLACK, bench_overrides, rank_rows
    from mindgr.config import load_config
    from mindgr.parallel.plan import rank_capacities
    t, b = rank_capacities(2 * tokens, 2 * rank_rows(tokens), 2, SLACK)
    quiet = ["eval.every_epochs=0", f"run.log_every={10 ** 9}", f"run.ckpt_every={10 ** 9}", "train.epochs=100000",
             f"run.out_dir={run_dir}"]
    common = bench_overrides(config, overrides) + list(overrides) + quiet
    common += synthetic_codes_override(load_config(config, common), run_dir)
    two = load_config(config, common + [f"data.token_capacity={2 * tokens}",
                                        f"data.row_capacity={2 * rank_rows(tokens)}", "run.name=two"])
    one = [f"data.token_capacity={t}", f"data.row_capacity={b}"]
    return two, one, common


def single_process_trainer(name: str):
    """A one-process Trainer of the benchmark model at one process's capacities (the side-by-side pair's),
    in graph mode on the CPU with one compute thread, its runs under a fresh temporary folder: for probes."""
    import tempfile

    import mindspore as ms
    from mindgr.config import load_config
    from mindgr.parallel.context import limit_threads
    from mindgr.train.trainer import Trainer
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    limit_threads(1)
    _, one_capacity, common = _configs(None, [], tempfile.mkdtemp(prefix=f"mindgr-{name}-"))
    return Trainer(load_config(None, common + one_capacity + [f"run.name={name}"]), quiet=True)


def main(argv=None) -> int:
    ap = block_parser("python -m mindgr.bench.scaling_blocks", "trainer")
    ap.add_argument("overrides", nargs="*", help="SECTION.KEY=VALUE, applied to both trainers")
    args = ap.parse_args(argv)

    from mindgr.config import load_config
    from mindgr.parallel import comm
    from mindgr.parallel.context import init_distributed
    run_dir = Path(args.out).resolve().parent / "runs"
    two_cfg, one_capacity, common = _configs(args.config, args.overrides, str(run_dir), args.rank_tokens)
    ctx = init_distributed(1, two_cfg.parallel.bind_cores)     # msrun's scheduler process stops in here
    if ctx.world != 2:
        raise SystemExit(f"scaling_blocks: needs exactly 2 ranks, got {ctx.world}")
    from mindgr.parallel.executor import DataParallelExecutor
    from mindgr.train.local import LocalExecutor
    from mindgr.train.loop import TrainLoop
    from mindgr.train.tasks import resolve_task

    one_cfg = load_config(args.config, common + one_capacity + [f"run.name=one-rank{ctx.rank}",
                                                                f"run.seed={ctx.rank + 1}"])
    t, b = one_cfg.data.token_capacity, one_cfg.data.row_capacity
    dp = TrainLoop(two_cfg, DataParallelExecutor(two_cfg, resolve_task(two_cfg)), quiet=True)
    watchdog = dp.executor.watchdog
    one = TrainLoop(one_cfg, LocalExecutor(one_cfg, resolve_task(one_cfg)), quiet=True)
    watchdog.timeout = max(watchdog.timeout, 60.0 * args.steps)   # the peer may be busy for a block
    run_dp_block(dp, args.warmup)
    variants = VARIANTS if dp.executor.dp.fused is not None else tuple(v for v in VARIANTS if v != "split")
    if "split" in variants:
        dp.executor.fuse = False                                   # compile the two-graph step too
        run_dp_block(dp, args.warmup)
        dp.executor.fuse = True
    run_dp_block(one, args.warmup)

    blocks = []
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for variant in order:
            comm.barrier()
            watchdog.beat(f"block {variant} of round {r}")
            if variant == "two":
                rec = run_dp_block(dp, args.steps)                # tokens: the global batch's, on each rank
            elif variant in ("local", "split"):
                flag = "apply_updates" if variant == "local" else "fuse"
                setattr(dp.executor, flag, False)
                try:
                    rec = run_dp_block(dp, args.steps)
                finally:
                    setattr(dp.executor, flag, True)
            elif variant == "pair" or ctx.rank == r % 2:
                rec = run_dp_block(one, args.steps)
            else:
                rec = None                                     # waiting in the barrier below
            comm.barrier()
            if rec is not None:
                blocks.append({"round": r, "variant": variant, "rank": ctx.rank, **rec})

    fields = ("round", "rank", "wall_s", "tokens", "steps", "step_s", "cpu_s", "host_cpu_s", "local_s", "apply_s")
    mine = np.array([[blk[f] for f in fields] + [VARIANTS.index(blk["variant"])] for blk in blocks], np.float64)
    every = comm.all_gather(mine.reshape(-1, len(fields) + 1))           # both ranks' blocks, stacked
    bound = np.full((1, os.cpu_count() or 1), -1, np.int64)              # each rank's pinned cores, -1 padded
    bound[0, : len(ctx.cores)] = ctx.cores
    cores = [[int(c) for c in row if c >= 0] for row in comm.all_gather(bound)]
    if ctx.rank == 0:
        rows = [{**dict(zip(fields, row[:-1].tolist())), "variant": VARIANTS[int(row[-1])]} for row in every]
        for row in rows:
            for f in ("round", "rank", "tokens", "steps"):
                row[f] = int(row[f])
        result = {"rank_tokens": t, "rank_rows": b, "rounds": args.rounds, "steps_per_block": args.steps,
                  "overrides": args.overrides, "cores": cores, "blocks": rows}
        write_json_atomic(args.out, result, indent=None, sort_keys=False)
    comm.barrier()
    watchdog.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
