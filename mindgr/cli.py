"""`mindgr` command line: train, eval, compare, report, data prepare, bench.

Bad configs, data and checkpoints end the command with ONE line on stderr naming what is wrong.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path


def _overrides(args) -> list[str]:
    return list(args.set or []) + list(getattr(args, "overrides", None) or [])


def _load(args):
    from mindgr.config import load_config
    return load_config(args.config, _overrides(args))


# `mindgr train --quick`: a short run that still goes through every stage and leaves a best checkpoint:
# at most 2 epochs, validation after each, a log line every 10 steps at most, and generative runs decode
# samples of users (at most 500 in validation, 1,000 in the test decode). Overrides on the command line win.
QUICK_EPOCHS, QUICK_LOG_EVERY, QUICK_VALID_USERS, QUICK_TEST_USERS = 2, 10, 500, 1000


def quick_overrides(cfg) -> list[str]:
    """The overrides --quick adds to a config (before the command line's own, which take precedence)."""
    def capped(value, cap):
        return min(value, cap) if value else cap
    return [f"train.epochs={min(cfg.train.epochs, QUICK_EPOCHS)}", "eval.every_epochs=1",
            f"run.log_every={min(cfg.run.log_every, QUICK_LOG_EVERY)}",
            f"eval.max_users={capped(cfg.eval.max_users, QUICK_VALID_USERS)}",
            f"eval.test_max_users={capped(cfg.eval.test_max_users, QUICK_TEST_USERS)}"]


class OutputError(OSError):
    """An output location that cannot be written (checked before any work starts)."""


def _check_writable(path):
    from mindgr.paths import unwritable_reason
    reason = unwritable_reason(path)
    if reason:
        raise OutputError(reason)


def cmd_train(args) -> int:
    from mindgr.config import dump_config
    if args.nproc is not None:
        args.set = list(args.set or []) + [f"parallel.nproc={args.nproc}"]
    cfg = _load(args)
    if args.quick:
        from mindgr.config import load_config
        quick = quick_overrides(cfg)
        cfg = load_config(args.config, quick + _overrides(args))
        if not args.print_config:
            print(f"quick run: {' '.join(quick)} (overrides on the command line win)", flush=True)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    _check_writable(cfg.run_dir)   # a file in the way or a read-only disk: say so before data and compile
    args.writes_to = cfg.run_dir
    from mindgr.models.objectives import check_objective_arch
    from mindgr.parallel.resolve import resolve
    check_objective_arch(cfg)      # next-token prediction for an item encoder (or the reverse): one line
    executor = resolve(cfg)        # the config's task on this process's executor (mindgr.parallel.resolve)
    if executor is None:           # parallel.nproc > 1: launch the ranks with msrun
        from mindgr.parallel.launch import launch_train
        return launch_train(cfg, args.argv)
    from mindgr.train.loop import TrainLoop
    TrainLoop(cfg, executor, resume=args.resume).fit()   # ends with its summary; results in eval.json
    return 0


def cmd_eval(args) -> int:
    from mindgr.train.run_eval import evaluate_any_run
    from mindgr.train.run_eval import format_eval
    result = evaluate_any_run(args.run, args.split, args.checkpoint, args.allow_data_change,
                              _filter_history(args), args.max_users)
    print(json.dumps(result, indent=1) if args.json else format_eval(result))
    return 0


def _filter_history(args):
    """--filter-history true|false|search, or None (the run's eval.filter_history)."""
    from mindgr.train.saved_run import SEARCH
    value = getattr(args, "filter_history", None)
    return None if value is None else SEARCH if value == SEARCH else value == "true"


def cmd_compare(args) -> int:
    from mindgr.bench import write_result
    from mindgr.train.compare import compare_runs, format_comparison
    runs_a, runs_b = (side.split(",") for side in (args.run_a, args.run_b))
    result = compare_runs(runs_a, runs_b, args.split, args.checkpoint, args.samples, _filter_history(args),
                          args.max_users, by_value=args.by_value, value_metric=args.by_value_metric,
                          judge=args.judge, coverage=args.coverage, list_k=args.list_k)
    print(format_comparison(result, args.run_a, args.run_b))
    write_result(result, args.out)
    return 0


def _reader_options(texts) -> dict:
    """`--option KEY=VALUE` words -> {key: value}; values are read as YAML (500 -> int, true -> bool)."""
    import yaml
    from mindgr.config import ConfigError
    options = {}
    for text in texts or []:
        key, eq, raw = text.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"data prepare: --option {text!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        options[key.strip()] = value
    return options


def cmd_data(args) -> int:
    from mindgr.config import ConfigError
    from mindgr.datasets import prepare
    from mindgr.datasets.prepare import check_options
    if args.src is None and args.kind != "synthetic":
        raise ConfigError(f"data prepare {args.kind}: --src is required (the raw file or directory to read)")
    options = _reader_options(args.option)
    try:
        check_options(args.kind, options)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    args.writes_to = args.out
    prepare(args.kind, args.src, args.out, lenient=args.lenient, **options)
    return 0


def cmd_report(args) -> int:
    from mindgr.train.report import write_report
    result = write_report(args.runs, args.out)
    print(result["table"], end="")
    for path in result["plots"]:
        print(f"plot: {path}")
    return 0


def cmd_bench(args) -> int:
    """`mindgr bench NAME`: the benchmark module registered as NAME runs (mindgr.bench.registry)."""
    return args.benchmark.module.run(args)


def _add_bench_commands(sub):
    from mindgr.bench.registry import BENCHMARKS
    b = sub.add_parser("bench", help="measure speed (prints figures; never part of the tests)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Measure speed; prints figures (the host is shared: compare ratios measured "
                                   "side by side).\n`mindgr bench NAME --help` lists NAME's options.\n\n"
                                   "benchmarks:\n" +
                                   "\n".join(f"  {name:<12} {bench.summary}" for name, bench in BENCHMARKS.items()))
    names = b.add_subparsers(dest="what", required=True, metavar="NAME",
                             help="which benchmark (see the list above)")
    for name, bench in BENCHMARKS.items():
        n = names.add_parser(name, description=bench.summary)
        bench.module.add_arguments(n)
        n.set_defaults(func=cmd_bench, benchmark=bench)


# ---- semantic IDs (mindgr.ids): ids build ------------------------------------------------------------

def _add_ids_commands(sub):
    """`mindgr ids build`: item vectors (a run's item table or a file) -> semantic-ID table + statistics."""
    i = sub.add_parser("ids", help="semantic IDs of items for generative retrieval")
    isub = i.add_subparsers(dest="ids_command", required=True)
    b = isub.add_parser("build", help="residual k-means semantic IDs (+ a de-duplication digit) of every item")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run directory: use its checkpoint's item table (rows 1..V)")
    src.add_argument("--vectors", help="item vectors file: .npy [V, D], .csv `item_id,v0,...`, or .parquet")
    b.add_argument("--checkpoint", default="best", choices=["best", "latest"], help="--run: which checkpoint")
    b.add_argument("--out", help="output Parquet (default RUN/ids/codes.parquet; needed with --vectors)")
    b.add_argument("--levels", type=int, default=3, help="L, residual k-means levels")
    b.add_argument("--codes", type=int, default=256, help="K, codes per level")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--dedup-range", type=int, default=0,
                   help="range of the final de-duplication digit; 0 = the largest collision bucket")
    b.add_argument("--iters", type=int, default=25, help="Lloyd iterations per level")
    b.add_argument("--backend", default="auto", choices=["auto", "numpy", "faiss"],
                   help="k-means back end (auto: faiss-cpu for large inputs, numpy below)")
    b.add_argument("--no-normalize", action="store_true",
                   help="cluster the raw vectors and residuals (default: L2-normalise them first)")
    b.set_defaults(func=cmd_ids_build)


def cmd_ids_build(args) -> int:
    from mindgr.ids.codes import format_stats, save_codes
    from mindgr.ids.tokenizer import TokenizerError, tokenize
    from mindgr.ids.vectors import file_item_vectors
    from mindgr.train.item_table import run_item_vectors
    if args.run:
        vectors, raw_ids = run_item_vectors(args.run, args.checkpoint)
        out = Path(args.out) if args.out else Path(args.run) / "ids" / "codes.parquet"
        source = {"run": str(args.run), "checkpoint": args.checkpoint}
    else:
        if not args.out:
            raise TokenizerError("ids build: --vectors needs --out (where to write the table)")
        vectors, raw_ids = file_item_vectors(args.vectors)
        out = Path(args.out)
        source = {"vectors": str(args.vectors)}
    result = tokenize(vectors, levels=args.levels, codes=args.codes, seed=args.seed,
                      dedup_range=args.dedup_range, iters=args.iters, backend=args.backend,
                      normalize=not args.no_normalize)
    save_codes(out, result.codes, result.level_sizes, raw_ids, dict(result.stats, source=source))
    print(format_stats(result.stats))
    print(f"wrote {out} (+ {out.with_suffix('.json').name})")
    return 0


# ---- serving (mindgr.serve): export, recommend, serve --------------------------------------------------

def _batch_shapes(text):
    from mindgr.config import ConfigError
    try:
        shapes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        shapes = []
    if not shapes or min(shapes) < 1:
        raise ConfigError(f"--batch-shapes: {text!r} (expected positive row counts, e.g. 1,4,16,64)")
    return shapes


def cmd_export(args) -> int:
    from mindgr.serve.models import SERVING_MODELS, serving_kind, setup_process
    if (args.run is None) == (args.random_gr is None):
        raise ValueError("export: give exactly one of --run RUN and --random-gr SPEC")
    if args.random_gr is not None:
        from mindgr.bench.fixtures import parse_random_spec, random_bundle
        from mindgr.serve.export import export_generative
        if not args.out:
            raise ValueError("export --random-gr: --out DIR is required")
        setup_process(args.threads, "auto")
        m = export_generative(random_bundle(**parse_random_spec(args.random_gr)), args.out, args.beam,
                              _batch_shapes(args.batch_shapes or "1,2,4"))
    else:                                  # the run's task names its serving model, which exports it
        kind = SERVING_MODELS[serving_kind(args.run)]
        shapes = _batch_shapes(args.batch_shapes) if args.batch_shapes else kind.shapes
        m = kind.export(args.run, args.out, args.checkpoint, shapes, args.beam)
    summary = {"run": m["run"], "checkpoint": m["checkpoint"], "out": str(args.out or f"{args.run}/export")}
    if m.get("kind") == "generative":
        summary.update(graphs=[g[p]["file"] for g in m["graphs"].values() for p in ("prefill", "step")],
                       beam=m["beam"], prompt_tokens=m["prompt_tokens"])
    else:
        summary.update(encoders=[e["file"] for e in m["encoders"].values()], items=m["data"]["num_items"])
    print(json.dumps(summary))
    return 0


def _source(args, command: str):
    """(run_dir, export_dir): exactly one of --run and --export."""
    if (args.run is None) == (args.export is None):
        raise ValueError(f"{command}: give exactly one of --run RUN and --export DIR")
    return args.run, args.export


def _history_lines(args):
    """(label, raw ids) per user: --user-history, or one line of --users FILE each (blank lines skipped)."""
    from mindgr.serve.requests import RequestError
    if (args.user_history is None) == (args.users is None):
        raise ValueError("recommend: give exactly one of --user-history and --users")
    lines = [("user", args.user_history)] if args.users is None else \
        [(f"{args.users}:{n}", t) for n, t in enumerate(open(args.users).read().splitlines(), 1) if t.strip()]
    out = []
    for label, text in lines:
        try:
            out.append((label, [int(w) for w in text.replace(",", " ").split()]))
        except ValueError:
            raise RequestError(f"{label}: item ids must be integers: {text.strip()[:60]!r}") from None
    if not out or not out[0][1]:
        raise ValueError(f"recommend: {args.users or '--user-history'}: no item ids")
    return out


def cmd_recommend(args) -> int:
    from mindgr.serve.models import load_recommender
    from mindgr.serve.options import ServerOptions
    from mindgr.serve.requests import RequestError
    run_dir, export_dir = _source(args, "recommend")
    users = _history_lines(args)
    # generative models: beam search with the decoding engine (as mindgr serve); a run is exported with the
    # server's default shapes, so recommend and serve share its serving cache
    beam = args.beam if args.beam or export_dir else max(16, args.k)
    rec = load_recommender(ServerOptions(checkpoint=args.checkpoint, beam=beam), run_dir, export_dir)
    queries = []
    for label, hist in users:
        try:
            queries.append(rec.parse(hist, k=args.k, exclude_history=not args.include_history))
        except RequestError as e:
            raise RequestError(f"{label}: {e}") from None
    results = rec.recommend_many(queries)
    for (label, _), q, (ids, _) in zip(users, queries, results):
        try:
            rec.check_complete(q, ids)     # fewer than k items: one line, as the server's 422
        except RequestError as e:
            raise RequestError(f"{label}: {e}") from None
    for (label, _), (ids, scores) in zip(users, results):
        r = rec.to_response(ids, scores)
        if args.users is None:
            print("rank\titem\tscore")
            for n, (item, score) in enumerate(zip(r["items"], r["scores"]), 1):
                print(f"{n}\t{item}\t{score:.6f}")
        else:
            print(json.dumps({"user": label, **r}))
    return 0


def cmd_serve(args) -> int:
    try:
        from mindgr.serve.server import serve
    except ImportError as e:
        raise ValueError(f"mindgr serve needs the serve extra (pip install -e \".[serve]\" in the checkout): {e}") from None
    from mindgr.serve.options import ServerOptions
    if sum(x is not None for x in (args.run, args.export, args.random_gr)) != 1:
        raise ValueError("serve: give exactly one of --run RUN, --export DIR and --random-gr SPEC")
    if args.max_body_bytes < 1:
        raise ValueError(f"serve: --max-body-bytes {args.max_body_bytes} (expected a positive byte count)")
    options = ServerOptions(
        host=args.host, port=args.port, queue_size=args.queue_size, max_wait_ms=args.max_wait_ms,
        graceful_timeout=args.graceful_timeout, max_body_bytes=args.max_body_bytes,
        test_delay_ms=args.test_batch_delay_ms, checkpoint=args.checkpoint,
        shapes=_batch_shapes(args.batch_shapes) if args.batch_shapes else None, index=args.index,
        nprobe=args.nprobe, max_history=args.max_history, threads=args.threads, decode=args.decode,
        beam=args.beam, overlap=args.overlap == "on")
    bundle = None
    if args.random_gr is not None:         # a random-weight GR model (benchmarks, tests)
        from mindgr.bench.fixtures import parse_random_spec, random_bundle
        from mindgr.serve.models import setup_process
        setup_process(args.threads, "auto")
        bundle = random_bundle(**parse_random_spec(args.random_gr))
    return serve(options, run_dir=args.run, export_dir=args.export, bundle=bundle)


def _add_serve_commands(sub):
    x = sub.add_parser("export", help="export a run's user encoder (MindIR per batch shape), item table, manifest")
    x.add_argument("--run", help="run directory (HSTU-family or generative)")
    x.add_argument("--random-gr", metavar="SPEC", help="instead of a run: a random-weight GR decoder (as mindgr serve)")
    x.add_argument("--out", help="output directory (default RUN/export)")
    x.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    x.add_argument("--batch-shapes", help="rows of each exported encoder (HSTU, default 1,4,16,64) or users of "
                   "each prefill / decode-step graph (GR, default 1,2,4), as mindgr serve")
    x.add_argument("--beam", type=int, default=16, help="GR: the beam width the decode-step graphs are built for")
    x.add_argument("--threads", type=int, help="GR --random-gr: MindSpore CPU threads")
    x.set_defaults(func=cmd_export)

    r = sub.add_parser("recommend", help="top-k items for one user's history or a file of histories (raw ids)")
    r.add_argument("--run", help="run directory (exported into its serving cache first, then served from it)")
    r.add_argument("--export", metavar="DIR", help="an export directory (mindgr export): nothing else is read")
    r.add_argument("--user-history", help='raw item ids, oldest first, e.g. "1193 661 914"')
    r.add_argument("--users", help="a file with one user's raw item ids per line; prints one JSON line per user")
    r.add_argument("--k", type=int, default=10)
    r.add_argument("--include-history", action="store_true", help="do not remove the history's items")
    r.add_argument("--beam", type=int, help="GR: beam width (default max(16, k) for --run, the export's for "
                   "--export)")
    r.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    r.set_defaults(func=cmd_recommend)

    s = sub.add_parser("serve", help="HTTP server: POST /recommend, GET /health, GET /metrics")
    s.add_argument("--run", help="run directory (HSTU-family or generative): exported into its serving cache "
                   "(RUN/serving, reused while the checkpoint and code are unchanged), then served from it")
    s.add_argument("--export", metavar="DIR", help="an export directory (mindgr export): serve it reading nothing "
                   "else (no run, no training data)")
    s.add_argument("--random-gr", metavar="SPEC", help="instead of a run: a random-weight GR decoder, e.g. "
                   "items=12101,prompt=200,dim=128,blocks=4,heads=2,seed=0 (tests and `bench serve --gr`)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    s.add_argument("--batch-shapes", help="rows (HSTU, default 1,4,16,64) or users (GR, default 1,2,4) of each "
                   "compiled batch shape (--export: default every exported shape)")
    s.add_argument("--decode", default="engine", choices=["engine", "per_beam", "replay", "naive"],
                   help="GR: the decoding engine's fast path (HSTU: shared prompt K/V; linear: OneLA), its cached "
                        "baselines per_beam (K/V or recurrent state per beam) and replay (linear only), or the "
                        "naive baseline (recompute, full sort, masks rebuilt); exports and runs serve the fast "
                        "path, the others are for --random-gr models")
    s.add_argument("--beam", type=int, help="GR: beam width, k <= beam (default 16; --export: the export's)")
    s.add_argument("--overlap", default="off", choices=["on", "off"],
                   help="GR: overlap one batch's host-side selection with the next batch's model compute")
    s.add_argument("--queue-size", type=int, default=256, help="requests waiting beyond this get 503")
    s.add_argument("--max-wait-ms", type=float, default=2.0, help="longest wait for a batch to fill")
    s.add_argument("--index", default="exact", choices=["exact", "faiss-ivf"], help="top-k over the item table")
    s.add_argument("--nprobe", type=int, default=8, help="faiss-ivf: cells searched per query")
    s.add_argument("--max-history", type=int, help="longest history accepted (default 4096 items)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body accepted (default 1 MiB); larger ones get 413 before parsing")
    s.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds to finish in-flight requests")
    s.add_argument("--threads", type=int, help="MindSpore CPU threads (default: the run's parallel.threads)")
    s.add_argument("--test-batch-delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)  # tests only
    s.set_defaults(func=cmd_serve)


# ---- end serving ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from mindgr import __version__
    p = argparse.ArgumentParser(prog="mindgr", description="MindGR: generative recommendation training on MindSpore")
    p.add_argument("--version", action="version", version=f"mindgr {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "train", help="train a model from a YAML config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a model from a YAML config (or the built-in synthetic smoke setup).",
        epilog="overrides: any config value can be set on the command line as a bare SECTION.KEY=VALUE word\n"
               "(or with --set), e.g.  mindgr train --config configs/ml-1m/hstu.yaml train.lr=5e-4 model.dim=64\n"
               "Values are read as YAML (1e-3, true, [1,10]); --print-config shows every key and its value.")
    t.add_argument("--config", help="YAML config (defaults: the built-in synthetic smoke setup)")
    t.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--resume", action="store_true", help="continue the run in run.out_dir/run.name")
    t.add_argument("--quick", action="store_true",
                   help="a short run: at most 2 epochs, validation after each, a log line every 10 steps, "
                        "generative runs decode samples of users (500 valid, 1,000 test)")
    t.add_argument("--nproc", type=int, help="train data parallel on N processes launched with msrun "
                                             "(same as parallel.nproc=N)")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="re-evaluate a saved run")
    e.add_argument("--run", required=True, help="run directory (holds config.yaml and checkpoints/)")
    e.add_argument("--split", default="test", choices=["valid", "test"])
    e.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    e.add_argument("--allow-data-change", action="store_true", help="evaluate even if the run's data changed")
    e.add_argument("--filter-history", choices=["true", "false", "search"],
                   help="remove the user's history items from the ranking; search: a generative run's decode "
                        "skips them (default: the run's eval.filter_history / eval.exclude_history_in_search)")
    e.add_argument("--max-users", type=int, default=None,
                   help="generative runs: decode a fixed sample of this many users (0 = all; default: the run's "
                        "eval.test_max_users for the test split, else all)")
    e.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    e.set_defaults(func=cmd_eval)

    c = sub.add_parser("compare", help="paired comparison of two runs' metrics on the same users "
                                       "(bootstrap over users)")
    c.add_argument("run_a", help="run directory A (the baseline); several seeds of one setting: DIR1,DIR2,...")
    c.add_argument("run_b", help="run directory B, or several: DIR1,DIR2,...")
    c.add_argument("--split", default="test", choices=["valid", "test"])
    c.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    c.add_argument("--samples", type=int, default=5000, help="bootstrap samples")
    c.add_argument("--out", help="also write the result as JSON here")
    c.add_argument("--filter-history", choices=["true", "false", "search"],
                   help="rank with or without the history items; search: a generative run's decode skips them "
                        "(default: each run's eval.filter_history / eval.exclude_history_in_search)")
    c.add_argument("--max-users", type=int, default=None,
                   help="generative runs: the fixed user sample of `mindgr eval --max-users` (0 = all; default: "
                        "each run's eval.test_max_users)")
    c.add_argument("--by-value", nargs="*", metavar="NAME=LO:HI",
                   help="data with values (ratings): the metric split by the target's own value, one group per "
                        "word, bounds inclusive, an end may be open (bare: liked=4: disliked=:2); the first two "
                        "groups also give the difference of their changes")
    c.add_argument("--by-value-metric", default="hr@10",
                   help="the per-user metric split by value (default hr@10; target_logp: a generative run's "
                        "log-probability of the held-out target, teacher-forced after the history)")
    c.add_argument("--judge", metavar="REWARD_RUN",
                   help="generative runs: the mean score of each user's top-K list under this reward run (not the "
                        "one the aligned run optimised), paired over users; adds --coverage")
    c.add_argument("--coverage", action="store_true",
                   help="generative runs: distinct items of the top-K lists over the catalogue")
    c.add_argument("--list-k", type=int, default=10, help="K of the lists judged and covered (default 10)")
    c.set_defaults(func=cmd_compare)

    d = sub.add_parser("data", help="prepare a dataset into a sequence store")
    dsub = d.add_subparsers(dest="data_command", required=True)
    dp = dsub.add_parser("prepare", help="read raw logs and write a Parquet sequence store")
    from mindgr.datasets.prepare import KINDS
    dp.add_argument("kind", choices=list(KINDS),
                    help="movielens-1m: ratings.dat or sequences.txt; movielens-100k: u.data; kuairand: log_*.csv; "
                         "sequences: 'user item item ...' lines; csv: an interaction log (columns via --option); "
                         "synthetic: generated")
    dp.add_argument("--src", default=None, help="source file or directory (not needed for synthetic)")
    dp.add_argument("--out", required=True, help="output directory for the store")
    dp.add_argument("--lenient", action="store_true", help="skip and count malformed lines instead of failing")
    dp.add_argument("--option", action="append", metavar="KEY=VALUE",
                    help="reader option, e.g. num_users=500 (synthetic), positive_column=is_like (kuairand), "
                         "user_column=uid item_column=iid time_column=ts time_unit=ms separator=tab "
                         "page_column=request_id header=false (csv)")
    dp.set_defaults(func=cmd_data)

    r = sub.add_parser("report", help="plots (PNG) of loss, tokens/s and validation metrics of runs, and a "
                                      "Markdown table of their final metrics")
    r.add_argument("runs", nargs="+", metavar="RUN", help="run directories (hold metrics.jsonl / eval.json)")
    r.add_argument("--out", help="directory for the plots and report.md (default: the run directory, or "
                                 "the first run's with several runs)")
    r.set_defaults(func=cmd_report)

    _add_bench_commands(sub)  # benchmarks: one subcommand each (mindgr.bench.registry)
    _add_serve_commands(sub)  # serving: export, recommend, serve
    _add_ids_commands(sub)  # semantic IDs: ids build
    return p


def _os_error_line(e: OSError, writes_to=None) -> str:
    # A failed write() names no file: then say which output the command was writing.
    where = f"{e.filename}: " if getattr(e, "filename", None) else (f"writing {writes_to}: " if writes_to else "")
    what = e.strerror or str(e)
    # Every save is atomic (mindgr.paths.atomic_write): a failed one leaves the files already there whole.
    hint = ("; nothing was half-written: existing checkpoints and outputs are intact (free some space; a "
            "training run continues from its last checkpoint with --resume)") if e.errno == errno.ENOSPC else ""
    return f"{where}{what.lower() if e.strerror else what}{hint}"


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
    if extra and args.command != "train" and not getattr(args, "takes_overrides", False):
        parser.error(f"overrides are for train and the benchmarks with --config: {' '.join(extra)}")
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
            FloatingPointError, CollectiveError, OutputError) as e:
        print(f"mindgr: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a read-only or vanished directory met while writing
        print(f"mindgr: error: {_os_error_line(e, getattr(args, 'writes_to', None))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mindgr: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:  # a C++ kernel that rejected its arguments: its one-line error
        from mindgr.ops.cpu.errors import explain
        clear = explain(e)
        if clear is None:
            raise
        print(f"mindgr: error: {clear}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
