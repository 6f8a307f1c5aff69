"""`mindgr bench pipeline`: compute-busy fraction of the training loop with the background input
producer (`data.prefetch`) and without it (inline preparation), measured side by side.

Both trainers are built (and their steps compiled) in this process; then blocks of steps alternate
between them, so machine noise hits both alike. Busy fraction = time inside the compiled step / wall
time of the block; input wait = time the loop waited for the next batch's host arrays.
"""
from __future__ import annotations

import tempfile

from mindgr.bench import (add_config_arguments, add_out_argument, config_overrides, load_bench_config, run_block,
                          write_result)


def bench_pipeline(cfg_path: str, overrides, steps: int = 20, rounds: int = 3, prefetch: int = 2,
                   out: str | None = None) -> dict:
    from mindgr.config import ConfigError, load_config
    from mindgr.train.trainer import Trainer
    if rounds < 1 or steps < 1:
        raise ConfigError(f"bench pipeline: --rounds ({rounds}) and --steps ({steps}) must be >= 1")
    variants = {f"producer (prefetch {prefetch})": prefetch, "inline (prefetch 0)": 0}
    trainers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, depth) in enumerate(variants.items()):
            c = load_config(cfg_path, list(overrides) + [f"data.prefetch={depth}", "eval.every_epochs=0",
                                                         f"run.log_every={10 ** 9}", "run.ckpt_every=0"])
            c.run.out_dir, c.run.name = tmp, f"bench-{i}"
            t = Trainer(c, quiet=True)
            run_block(t, 2)                         # compile and warm up
            trainers[name] = t
        totals = {name: {"steps": 0, "wall_s": 0.0, "step_s": 0.0, "wait_s": 0.0, "tokens": 0} for name in variants}
        for _ in range(rounds):
            for name, t in trainers.items():
                block = run_block(t, steps)
                for key in totals[name]:
                    totals[name][key] += block[key]
    result = {"config": cfg_path, "overrides": list(overrides), "steps_per_block": steps, "rounds": rounds,
              "variants": {}}
    for name, tot in totals.items():
        result["variants"][name] = {
            "steps": tot["steps"], "busy_fraction": tot["step_s"] / tot["wall_s"],
            "input_wait_fraction": tot["wait_s"] / tot["wall_s"], "step_time_s_mean": tot["step_s"] / tot["steps"],
            "real_tokens_per_s": tot["tokens"] / tot["wall_s"]}
    print(f"bench pipeline {cfg_path} {' '.join(overrides)}: {rounds} rounds of {steps} steps per variant, alternating")
    print(f"  {'variant':24s} {'busy %':>7s} {'input wait %':>12s} {'step ms':>8s} {'real tok/s':>11s}")
    for name, r in result["variants"].items():
        print(f"  {name:24s} {r['busy_fraction'] * 100:7.1f} {r['input_wait_fraction'] * 100:12.1f} "
              f"{r['step_time_s_mean'] * 1e3:8.1f} {r['real_tokens_per_s']:11.0f}")
    return write_result(result, out)


def add_arguments(parser):
    add_config_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating blocks of --steps")
    add_out_argument(parser)


def run(args) -> int:
    load_bench_config(args)
    bench_pipeline(args.config, config_overrides(args), steps=args.steps, rounds=args.rounds, out=args.out)
    return 0
