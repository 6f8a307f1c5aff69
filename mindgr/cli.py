"""`mindgr` command line: train, eval, data prepare, bench.

Bad configs, data and checkpoints end the command with ONE line on stderr naming what is wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _overrides(args) -> list[str]:
    return list(args.set or []) + list(getattr(args, "overrides", None) or [])


def _load(args):
    from mindgr.config import load_config
    return load_config(args.config, _overrides(args))


def cmd_train(args) -> int:
    from mindgr.config import dump_config
    if args.nproc is not None:
        args.set = list(args.set or []) + [f"parallel.nproc={args.nproc}"]
    cfg = _load(args)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    from mindgr.parallel.context import under_msrun
    if under_msrun():  # a rank of a multi-process job (or msrun's scheduler, which stops in init)
        if cfg.parallel.sparse != "none":
            from mindgr.parallel.sparse.trainer import SparseTrainer as Trainer
        else:
            from mindgr.parallel.trainer import DistributedTrainer as Trainer
    elif cfg.parallel.nproc > 1:
        from mindgr.parallel.launch import launch_train
        return launch_train(cfg, args.argv)
    else:
        from mindgr.train.trainer import Trainer
    result = Trainer(cfg, resume=args.resume).fit()
    print(json.dumps({k: result[k] for k in ("valid", "test", "checkpoint")}, indent=1))
    return 0


def cmd_eval(args) -> int:
    from mindgr.train.trainer import evaluate_run
    result = evaluate_run(args.run, args.split, args.checkpoint)
    print(json.dumps(result, indent=1))
    return 0


def cmd_compare(args) -> int:
    from mindgr.bench import write_result
    from mindgr.train.compare import compare_runs, format_comparison
    runs_a, runs_b = (side.split(",") for side in (args.run_a, args.run_b))
    result = compare_runs(runs_a, runs_b, args.split, args.checkpoint, args.samples)
    print(format_comparison(result, args.run_a, args.run_b))
    write_result(result, args.out)
    return 0


def cmd_data(args) -> int:
    from mindgr.config import parse_override
    from mindgr.datasets import prepare
    options = {}
    for text in args.option or []:
        key, _, raw = text.partition("=")
        options.update(parse_override(f"o.{key}={raw}")["o"])
    prepare(args.kind, args.src, args.out, lenient=args.lenient, **options)
    return 0


def cmd_bench(args) -> int:
    if args.what == "peak":
        from mindgr.train.peak import peak_flops
        p = peak_flops(refresh=args.refresh)
        print(f"peak fp32 GEMM (MindSpore MatMul): {p['flops_per_s'] / 1e9:.1f} GFLOP/s  [{p['method']}]")
        return 0
    if args.what == "balance":
        from mindgr.bench.balance import bench_balance
        bench_balance(args.config, _overrides(args), steps=args.steps, out=args.out,
                      ranks=[int(r) for r in args.ranks.split(",")], real=not args.no_real)
        return 0
    if args.what == "distributed":
        from mindgr.bench.distributed import bench_scaling, bench_scaling_blocks
        from mindgr.bench.distributed_common import RANK_TOKENS
        from mindgr.config import ConfigError
        if args.method == "runs":
            if args.rank_tokens != RANK_TOKENS:
                raise ConfigError("bench distributed: --rank-tokens applies to --method blocks only")
            bench_scaling(args.config, _overrides(args), steps=args.steps, out=args.out)
        else:
            rounds = 8 if args.rounds is None else args.rounds
            bench_scaling_blocks(args.config, _overrides(args), steps=args.steps, rounds=rounds, out=args.out,
                                 rank_tokens=args.rank_tokens)
        return 0
    if args.what == "sparse":
        from mindgr.bench.sparse import bench_sparse
        _load(args)
        bench_sparse(args.config, _overrides(args), topologies=args.topologies, steps=args.model_steps,
                     runs=args.runs, train=args.train, out_dir=args.out_dir, taus=args.taus, out=args.out)
        return 0
    if args.what == "ops":
        from mindgr.bench.ops import bench_ops
        bench_ops(args.sizes.split(","), repeats=args.repeats, out=args.out)
        return 0
    if args.what == "pipeline":
        from mindgr.bench.pipeline import bench_pipeline
        _load(args)
        rounds = 3 if args.rounds is None else args.rounds
        bench_pipeline(args.config, _overrides(args), steps=args.steps, rounds=rounds, out=args.out)
        return 0
    if args.what == "negatives":
        from mindgr.bench.backends import bench_variants
        from mindgr.bench.negatives import NEGATIVE_VARIANTS
        _load(args)  # validate first: one line for a bad config
        bench_variants(args.config, _overrides(args), NEGATIVE_VARIANTS, steps=args.steps,
                       memory=not args.no_memory, out=args.out)
        return 0
    if args.backends:
        from mindgr.bench.backends import bench_backends
        _load(args)
        bench_backends(args.config, _overrides(args), args.backends.split(","), steps=args.steps,
                       memory=not args.no_memory, out=args.out)
        return 0
    from mindgr.bench.train import bench_train
    bench_train(_load(args), steps=args.steps, warmup=args.warmup, out=args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindgr", description="MindGR: generative recommendation training on MindSpore")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model from a YAML config")
    t.add_argument("--config", help="YAML config (defaults: the built-in synthetic smoke setup)")
    t.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--resume", action="store_true", help="continue the run in run.out_dir/run.name")
    t.add_argument("--nproc", type=int, help="train data parallel on N processes launched with msrun "
                                             "(same as parallel.nproc=N)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="re-evaluate a saved run")
    e.add_argument("--run", required=True, help="run directory (holds config.yaml and checkpoints/)")
    e.add_argument("--split", default="test", choices=["valid", "test"])
    e.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    e.set_defaults(func=cmd_eval)

    c = sub.add_parser("compare", help="paired comparison of two runs' metrics on the same users "
                                       "(bootstrap over users)")
    c.add_argument("run_a", help="run directory A (the baseline); several seeds of one setting: DIR1,DIR2,...")
    c.add_argument("run_b", help="run directory B, or several: DIR1,DIR2,...")
    c.add_argument("--split", default="test", choices=["valid", "test"])
    c.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    c.add_argument("--samples", type=int, default=5000, help="bootstrap samples")
    c.add_argument("--out", help="also write the result as JSON here")
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("data", help="prepare a dataset into a sequence store")
    dsub = d.add_subparsers(dest="data_command", required=True)
    dp = dsub.add_parser("prepare", help="read raw logs and write a Parquet sequence store")
    dp.add_argument("kind", choices=["movielens-1m", "movielens-100k", "kuairand", "synthetic"])
    dp.add_argument("--src", default=None, help="source file or directory (not needed for synthetic)")
    dp.add_argument("--out", required=True, help="output directory for the store")
    dp.add_argument("--lenient", action="store_true", help="skip and count malformed lines instead of failing")
    dp.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="reader option, e.g. num_users=500 (synthetic) or positive_column=is_like (kuairand)")
    dp.set_defaults(func=cmd_data)

    b = sub.add_parser("bench", help="measure speed (prints figures; never part of the tests)")
    b.add_argument("what", choices=["peak", "train", "ops", "negatives", "pipeline", "balance",
                                        "distributed", "sparse"])
    b.add_argument("--config")
    b.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE")
    b.add_argument("--steps", type=int, default=20, help="timed steps (train)")
    b.add_argument("--warmup", type=int, default=3, help="untimed steps first, compile included (train)")
    b.add_argument("--refresh", action="store_true", help="re-measure the peak even if cached (peak)")
    b.add_argument("--out", help="also write the figures as JSON to this path")
    b.add_argument("--ranks", default="8,16,64", help="simulated rank counts (balance)")
    b.add_argument("--no-real", action="store_true", help="skip the 2-process msrun measurement (balance)")
    b.add_argument("--backends", help="train: compare op backends side by side, e.g. reference,cpu")
    b.add_argument("--no-memory", action="store_true", help="train --backends: skip the per-backend memory runs")
    b.add_argument("--sizes", default="small,medium", help="ops: which sizes (small, medium)")
    b.add_argument("--repeats", type=int, default=3, help="ops: timed repeats (best is kept)")
    b.add_argument("--topologies", default="2x2,8x8", help="sparse: modelled nodes x local ranks")
    b.add_argument("--model-steps", type=int, default=5, help="sparse: steps whose ids the traffic model uses")
    b.add_argument("--runs", default="", help="sparse: measured run directories to report (comma separated)")
    b.add_argument("--train", action="store_true", help="sparse: train the staleness runs on 4 processes first")
    b.add_argument("--taus", default="0,1,2", help="sparse --train: staleness values")
    b.add_argument("--out-dir", default="runs/bench-sparse", help="sparse --train: where the runs go")
    b.add_argument("--rounds", type=int, default=None,
                   help="pipeline (default 3), distributed (default 8): rounds of alternating blocks of --steps")
    b.add_argument("--rank-tokens", type=int, default=8192,
                   help="distributed (blocks): tokens per rank before the balancing headroom (rows: tokens / 64)")
    b.add_argument("--method", choices=["blocks", "runs"], default="blocks",
                   help="distributed: alternate 1- and 2-process blocks in two long-lived processes (blocks), or "
                        "separate training jobs one after another (runs)")
    b.set_defaults(func=cmd_bench)

    from mindgr.ids.command import add_parser as add_ids_parser  # `mindgr ids build` (semantic IDs)
    add_ids_parser(sub)
    return p


def main(argv=None) -> int:
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ warnings drown the progress lines
    parser = build_parser()
    # Bare SECTION.KEY=VALUE words anywhere on the line are overrides, like --set.
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    args.argv = argv
    bad = [w for w in extra if "=" not in w or w.startswith("-")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    if extra and args.command not in ("train", "bench"):
        parser.error(f"overrides are for train and bench: {' '.join(extra)}")
    args.overrides = extra
    from mindgr.config import ConfigError
    from mindgr.datasets import DataError
    from mindgr.train.checkpoint import CheckpointError
    from mindgr.ops.backend import BackendUnavailable
    from mindgr.parallel.context import CollectiveError
    if os.environ.get("MINDGR_DEBUG"):
        return args.func(args)  # full tracebacks
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"mindgr: error: {e}", file=sys.stderr)
        return 2
    except (DataError, CheckpointError, BackendUnavailable, FileNotFoundError, ValueError,
            FloatingPointError, CollectiveError) as e:
        print(f"mindgr: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mindgr: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
