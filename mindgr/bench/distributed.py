"""`mindgr bench distributed`: scaling efficiency of data parallel training on this machine.

efficiency = tokens/s with 2 processes / (2 x tokens/s with 1 process), one compute thread per process
(parallel.threads=1), on the same KuaiRand-like benchmark (mindgr.bench.distributed_common). Each
process runs the same graph shape: the 1-process runs train at the per-rank capacities of the
2-process run.

Method `blocks` (default, bench_scaling_blocks): two long-lived msrun processes alternate short blocks
of 2-process and 1-process training (mindgr.bench.scaling_blocks); each round's blocks are seconds
apart, so a shared machine's drift hits both sides alike, and the spread over rounds is reported.

Method `runs` (bench_scaling): separate training jobs, one after another. Two ways to get "tokens/s with
1 process":
  side by side  two independent 1-process runs at the same time, before and after the 2-process run:
                as many of our processes compete for the cores as in the 2-process run, so load from
                other jobs on a shared machine weighs on both sides alike (the headline figure);
  alone         one 1-process run, before and after.
On an idle machine with 2 free cores the two coincide. tokens/s are real tokens over the wall time of
the logged windows after the warm-up (compile and, for 2 processes, the cost-model probe excluded), so
they include everything a step costs: host packing and draws, the step, the gradient all-reduce and
the logging collectives. Also reported: real tokens per CPU-second of all processes.

Method `reduce` (bench_reduce_blocks): not a scaling figure but the data-parallel step with the dense
gradients summed by the hand-written flat AllReduce, the shared-memory host sum and MindSpore's
DATA_PARALLEL reducer at several fusion bucket counts, alternated in blocks inside one 2-rank job
(mindgr.bench.reduce_blocks); per side the median and range over rounds of tokens/s and of its ratio to
the flat sum.
"""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mindgr.bench import add_config_arguments, add_out_argument, config_overrides, write_result
from mindgr.bench.distributed_common import (BENCH_OVERRIDES, N, RANK_ROWS, RANK_TOKENS, SLACK, bench_overrides,
                                             machine_load, read_jsonl, run_training, temp_dir)
from mindgr.bench.scaling_blocks import VARIANTS
from mindgr.parallel.launch import run_job


def _tokens_per_s(run_dir: Path, warmup: int) -> dict:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r and r["step"] > warmup]
    tps = np.array([r["tokens_per_s"] for r in rows])
    # CPU seconds all ranks spent per wall second (rank 0's cpu_util scaled by the ranks' CPU shares).
    cores = [r["cpu_util"] * (sum(r["rank_cpu_s"]) / r["rank_cpu_s"][0] if "rank_cpu_s" in r else 1.0)
             for r in rows]
    # Where a 2-process step goes (per rank, logged by the DataParallelExecutor): the local forward +
    # backward (wall and CPU) and the gradient all-reduce + optimizer update.
    parts = {k: float(np.mean([np.mean(r[k]) for r in rows])) for k in ("rank_step_s", "rank_step_cpu_s",
                                                                           "reduce_apply_s") if rows and k in rows[0]}
    return {**parts, "tokens_per_s": float(tps.mean()), "windows": len(rows), "window_tokens_per_s": tps.tolist(),
            "cores_busy": float(np.mean(cores)), "tokens_per_cpu_s": float(np.mean(tps / np.array(cores))),
            "step_time_s": float(np.mean([r["step_time_s"] for r in rows])),
            "fill": float(np.mean([r["fill"] for r in rows]))}



def _run_blocks(method: str, module: str, rounds: int, steps: int, rank_tokens: int, extra: list[str],
                config, overrides, timeout: float):
    """One 2-rank msrun job of an alternating-blocks rank program -> (its JSON, the load before it); its
    folder is kept (with the ranks' logs) only when it fails."""
    import sys
    work = Path(temp_dir(f"mindgr-bench-{method}-"))
    result_path = work / f"{method}.json"
    cmd = [sys.executable, "-m", "mindgr.parallel.launch", "--nproc", "2", "--threads", "1", "--log-dir",
           str(work / "msrun"), "--", "-m", module, "--out", str(result_path),
           "--rounds", str(rounds), "--steps", str(steps), "--rank-tokens", str(rank_tokens), *extra,
           *(["--config", config] if config else []), *overrides]
    load_before = machine_load()
    code, _out, err, timed_out = run_job(cmd, timeout)
    if timed_out or code != 0 or not result_path.is_file():
        raise RuntimeError(f"bench distributed ({method}) failed (exit {code}, timed out {timed_out}); logs in "
                           f"{work / 'msrun'}:\n{err[-3000:]}")
    raw = json.loads(result_path.read_text())
    shutil.rmtree(work, ignore_errors=True)
    return raw, load_before


def bench_scaling(config=None, overrides=(), steps: int = 30, out: str | None = None, warmup: int = 5) -> dict:
    from mindgr.parallel.plan import rank_capacities
    t, b = rank_capacities(2 * RANK_TOKENS, 2 * RANK_ROWS, 2, SLACK)
    out_dir = temp_dir("mindgr-bench-scaling-")
    common = BENCH_OVERRIDES + list(overrides) + [f"train.max_steps={warmup + steps}", f"run.log_every={warmup}"]
    if config:
        common = ["--config", config] + common
    one = common + [f"data.token_capacity={t}", f"data.row_capacity={b}"]
    two = common + [f"data.token_capacity={2 * RANK_TOKENS}", f"data.row_capacity={2 * RANK_ROWS}"]

    def record(name, nproc, overrides_, load):
        run = run_training(overrides_, nproc, Path(out_dir), name)
        return {"name": name, "nproc": nproc, "load_before": load, **_tokens_per_s(run, warmup)}

    def pair(tag):
        load = machine_load()
        with ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(record, f"pair_{tag}{k}", 1, one, load) for k in (1, 2)]
            return [j.result() for j in jobs]

    runs = [record("alone_a", 1, one, machine_load())]
    runs += pair("a")
    runs.append(record("two", 2, two, machine_load()))
    runs += pair("b")
    runs.append(record("alone_b", 1, one, machine_load()))
    two_run = next(r for r in runs if r["nproc"] == 2)
    alone = float(np.mean([r["tokens_per_s"] for r in runs if r["name"].startswith("alone")]))
    side = float(np.mean([r["tokens_per_s"] for r in runs if r["name"].startswith("pair")]))
    per_cpu = float(np.mean([r["tokens_per_cpu_s"] for r in runs if r["nproc"] == 1]))
    result = {"rank_tokens": t, "rank_rows": b, "steps": steps, "warmup": warmup, "runs": runs,
              "tokens_per_s_2proc": two_run["tokens_per_s"], "tokens_per_s_1proc_side_by_side": side,
              "tokens_per_s_1proc_alone": alone, "scaling_efficiency": two_run["tokens_per_s"] / (2 * side),
              "scaling_efficiency_vs_alone": two_run["tokens_per_s"] / (2 * alone),
              "cpu_time_efficiency": two_run["tokens_per_cpu_s"] / per_cpu,
              "load_after": machine_load()}
    shutil.rmtree(out_dir, ignore_errors=True)       # checkpoints and logs of the timed runs
    for r in runs:
        print(f"{r['name']:8s} {r['nproc']} proc: {r['tokens_per_s']:8.0f} real tokens/s, step "
              f"{r['step_time_s'] * 1e3:.0f} ms, fill {r['fill']:.3f}, {r['cores_busy']:.2f} cores busy, "
              f"{r['tokens_per_cpu_s']:.0f} tokens/CPU-s (load before {r['load_before']['loadavg_1m']:.2f})"
              + (f"; per rank: forward+backward {r['rank_step_s'] * 1e3:.0f} ms ({r['rank_step_cpu_s'] * 1e3:.0f} ms "
                 f"CPU), all-reduce + update {r['reduce_apply_s'] * 1e3:.1f} ms" if "reduce_apply_s" in r else ""))
    print(f"scaling efficiency (2 processes vs 2 x 1 process, one thread each): side by side "
          f"{result['scaling_efficiency']:.3f}; vs 1 process alone {result['scaling_efficiency_vs_alone']:.3f}; "
          f"per CPU second {result['cpu_time_efficiency']:.3f}")
    return write_result(result, out)


def round_sums(blocks: list[dict]) -> dict:
    """Per complete round and variant: real tokens and wall seconds, as arrays over rounds.

    two: the global batch's tokens (rank 0's count) over the slower rank's wall; pair: both ranks'
    tokens over both ranks' walls (the mean 1-process rate); alone: the one running rank's."""
    variants = [v for v in VARIANTS if any(b["variant"] == v for b in blocks)]      # `split`: fused steps only
    rounds = sorted(r for r in {b["round"] for b in blocks}
                    if all(any(b["round"] == r and b["variant"] == v for b in blocks) for v in variants))
    sums = {"round": np.array(rounds)}
    for v in variants:
        tok, wall = [], []
        for r in rounds:
            sel = [b for b in blocks if b["round"] == r and b["variant"] == v]
            if v in ("two", "split", "local"):
                tok.append(next(b["tokens"] for b in sel if b["rank"] == 0))
                wall.append(max(b["wall_s"] for b in sel))
            else:
                tok.append(sum(b["tokens"] for b in sel))
                wall.append(sum(b["wall_s"] for b in sel))
        sums[v] = (np.array(tok, np.float64), np.array(wall, np.float64))
    return sums


def efficiencies(sums: dict, idx) -> dict:
    """tokens/s of each variant and the two efficiencies, pooled over the rounds at positions `idx`
    (repeats allowed: the bootstrap resamples rounds)."""
    rate = {v: sums[v][0][idx].sum() / sums[v][1][idx].sum() for v in VARIANTS if v in sums}
    out = {**rate, "eff_side_by_side": rate["two"] / (2 * rate["pair"]), "eff_vs_alone": rate["two"] / (2 * rate["alone"])}
    if "split" in rate:
        out.update(eff_split_side_by_side=rate["split"] / (2 * rate["pair"]), two_over_split=rate["two"] / rate["split"])
    return out


def bench_scaling_blocks(config=None, overrides=(), steps: int = 10, rounds: int = 12, out: str | None = None,
                         timeout: float = 3600, samples: int = 2000, rank_tokens: int = RANK_TOKENS) -> dict:
    from mindgr.config import ConfigError, load_config
    if rounds < 1 or steps < 1:
        raise ConfigError(f"bench distributed: --rounds ({rounds}) and --steps ({steps}) must be >= 1")
    common = bench_overrides(config, overrides)
    if rank_tokens < N and common == BENCH_OVERRIDES:
        raise ConfigError(f"bench distributed: --rank-tokens ({rank_tokens}) must hold the longest sequence ({N})")
    load_config(config, common + list(overrides))     # a bad override: one line here, not in 2 ranks
    raw, load_before = _run_blocks("blocks", "mindgr.bench.scaling_blocks", rounds, steps, rank_tokens, [],
                                   config, overrides, timeout)
    blocks = raw["blocks"]
    sums = round_sums(blocks)
    n = len(sums["round"])
    if n == 0:
        raise RuntimeError("bench distributed (blocks): no complete round was timed")
    pooled = efficiencies(sums, np.arange(n))
    per_round = [{"round": int(r), **{k: float(v) for k, v in efficiencies(sums, [k]).items()}}
                 for k, r in enumerate(sums["round"])]
    # 95% interval of the pooled efficiencies: bootstrap over rounds (each round is one paired comparison).
    rng = np.random.default_rng(0)
    boot = [efficiencies(sums, rng.integers(0, n, n)) for _ in range(samples)]
    fused = "split" in sums
    interval = {k: np.percentile([b[k] for b in boot], [2.5, 97.5]).tolist()
                for k in ("eff_side_by_side", "eff_vs_alone") + (("eff_split_side_by_side", "two_over_split")
                                                                 if fused else ())}
    variants = [v for v in VARIANTS if v in sums]

    def per_step_ms(key, variant):
        sel = [b for b in blocks if b["variant"] == variant]
        return 1e3 * sum(b[key] for b in sel) / sum(b["steps"] for b in sel)
    step_ms = {v: per_step_ms("step_s", v) for v in variants}
    # Per rank and step: wall, CPU of the whole process and of the input thread's preparation.
    cost_ms = {v: {k: per_step_ms(k, v) for k in ("wall_s", "cpu_s", "host_cpu_s")} for v in variants}
    two_graphs = "split" if fused else "two"
    split = {k: per_step_ms(k, two_graphs) for k in ("local_s", "apply_s")}  # 2 proc, two graphs: fwd+bwd | rest
    result = {"method": "blocks", "rank_tokens": raw["rank_tokens"], "rank_rows": raw["rank_rows"],
              "rounds": rounds, "steps_per_block": steps, "overrides": list(overrides), "cores": raw["cores"],
              "tokens_per_s": {k: float(pooled[k]) for k in variants},
              "scaling_efficiency": float(pooled["eff_side_by_side"]),
              "scaling_efficiency_vs_alone": float(pooled["eff_vs_alone"]),
              **({"scaling_efficiency_split": float(pooled["eff_split_side_by_side"]),
                  "two_over_split": float(pooled["two_over_split"])} if fused else {}),
              "interval95": interval, "step_ms_in_graph": step_ms, "per_rank_step_ms": cost_ms,
              "two_step_split_ms": split, "per_round": per_round, "blocks": blocks,
              "load_before": load_before, "load_after": machine_load()}
    print(f"bench distributed (blocks): {len(per_round)} rounds x {steps} steps per block, per rank "
          f"{raw['rank_tokens']} tokens x {raw['rank_rows']} rows, one thread per process, "
          + (f"pinned to cores {raw['cores']}" if all(raw["cores"]) else "not pinned to cores"))
    print(f"  {'round':>5s} {'2 proc tok/s':>13s} {'1 proc side by side':>20s} {'1 proc alone':>13s} "
          f"{'eff side':>9s} {'eff alone':>10s}" + (f" {'2 proc split':>13s} {'eff split':>10s}" if fused else ""))
    for p in per_round:
        print(f"  {p['round']:5d} {p['two']:13.0f} {p['pair']:20.0f} {p['alone']:13.0f} "
              f"{p['eff_side_by_side']:9.3f} {p['eff_vs_alone']:10.3f}"
              + (f" {p['split']:13.0f} {p['eff_split_side_by_side']:10.3f}" if fused else ""))
    print(f"  mean time in the compiled step(s): 2 proc {step_ms['two']:.0f} ms"
          + (f", in two graphs {step_ms['split']:.0f} ms" if fused else "") + f" (forward+backward "
          f"{split['local_s']:.0f} ms, all-reduce + update {split['apply_s']:.0f} ms), 2 proc without them "
          f"{step_ms['local']:.0f} ms, side by side {step_ms['pair']:.0f} ms, alone {step_ms['alone']:.0f} ms")
    print("  per rank and step (wall / process CPU / of which input preparation): " + ", ".join(
        f"{v} {c['wall_s']:.0f} / {c['cpu_s']:.0f} / {c['host_cpu_s']:.1f} ms" for v, c in cost_ms.items()))
    print(f"scaling efficiency (pooled over rounds): side by side {pooled['eff_side_by_side']:.3f} "
          f"[95% {interval['eff_side_by_side'][0]:.3f}, {interval['eff_side_by_side'][1]:.3f}]; vs 1 process "
          f"alone {pooled['eff_vs_alone']:.3f} [{interval['eff_vs_alone'][0]:.3f}, {interval['eff_vs_alone'][1]:.3f}]")
    if fused:
        print(f"  the 2-process step as two graphs: side by side {pooled['eff_split_side_by_side']:.3f} "
              f"[{interval['eff_split_side_by_side'][0]:.3f}, {interval['eff_split_side_by_side'][1]:.3f}]; "
              f"one graph / two graphs {pooled['two_over_split']:.3f} [{interval['two_over_split'][0]:.3f}, "
              f"{interval['two_over_split'][1]:.3f}]")
    return write_result(result, out)


def reduce_round_rates(blocks: list[dict], sides: list[str]) -> dict:
    """Per complete round: each side's real tokens/s (the global batch's tokens, rank 0's count, over the
    slower rank's wall) and its all-reduce + update ms per step (mean of the ranks)."""
    rounds = sorted(r for r in {b["round"] for b in blocks}
                    if all(sum(b["round"] == r and b["side"] == s for b in blocks) == 2 for s in sides))
    out = {"round": rounds, "tokens_per_s": {}, "apply_ms": {}, "step_ms": {}}
    for s in sides:
        tps, apply_ms, step_ms = [], [], []
        for r in rounds:
            sel = [b for b in blocks if b["round"] == r and b["side"] == s]
            tps.append(next(b["tokens"] for b in sel if b["rank"] == 0) / max(b["wall_s"] for b in sel))
            apply_ms.append(1e3 * np.mean([b["apply_s"] / b["steps"] for b in sel]))
            step_ms.append(1e3 * max(b["wall_s"] / b["steps"] for b in sel))
        out["tokens_per_s"][s], out["apply_ms"][s], out["step_ms"][s] = (np.array(tps), np.array(apply_ms),
                                                                         np.array(step_ms))
    return out


def bench_reduce_blocks(config=None, overrides=(), steps: int = 10, rounds: int = 12, out: str | None = None,
                        timeout: float = 3600, samples: int = 2000, rank_tokens: int = RANK_TOKENS,
                        buckets: str = "1,2,4,0") -> dict:
    """The hand-written flat gradient sum vs MindSpore's DATA_PARALLEL reducer, alternated in one 2-rank job
    (mindgr.bench.reduce_blocks)."""
    from mindgr.bench.reduce_blocks import side_names
    from mindgr.config import ConfigError, load_config
    if rounds < 1 or steps < 1:
        raise ConfigError(f"bench distributed: --rounds ({rounds}) and --steps ({steps}) must be >= 1")
    try:
        counts = [int(b) for b in buckets.split(",") if b.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0 or len(set(counts)) != len(counts):
        raise ConfigError(f"bench distributed: --buckets {buckets!r}: expected distinct integers >= 0, e.g. 1,2,4,0")
    load_config(config, BENCH_OVERRIDES + list(overrides))
    raw, load_before = _run_blocks("reduce", "mindgr.bench.reduce_blocks", rounds, steps, rank_tokens,
                                   ["--buckets", ",".join(map(str, counts))], config, overrides, timeout)
    sides = side_names(counts)
    per = reduce_round_rates(raw["blocks"], sides)
    n = len(per["round"])
    if n == 0:
        raise RuntimeError("bench distributed (reduce): no complete round was timed")
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, n, n) for _ in range(samples)]
    own = per["tokens_per_s"]["own"]
    summary = {}
    for s in sides:
        tps, ratio = per["tokens_per_s"][s], per["tokens_per_s"][s] / own
        # pooled: total tokens / total time, as mean-of-rates over rounds of equal token counts
        pooled = float(np.mean(tps) / np.mean(own))
        boot = [float(np.mean(tps[i]) / np.mean(own[i])) for i in picks]
        summary[s] = {"tokens_per_s_median": float(np.median(tps)), "tokens_per_s_range": [float(tps.min()),
                                                                                          float(tps.max())],
                      "step_ms_median": float(np.median(per["step_ms"][s])),
                      "step_ms_range": [float(per["step_ms"][s].min()), float(per["step_ms"][s].max())],
                      "apply_ms_median": float(np.median(per["apply_ms"][s])),
                      "apply_ms_range": [float(per["apply_ms"][s].min()), float(per["apply_ms"][s].max())],
                      "vs_own_median": float(np.median(ratio)),
                      "vs_own_range": [float(ratio.min()), float(ratio.max())],
                      "vs_own_pooled": pooled, "vs_own_interval95": np.percentile(boot, [2.5, 97.5]).tolist()}
    result = {"method": "reduce", "rank_tokens": raw["rank_tokens"], "rounds": rounds, "steps_per_block": steps,
              "sides": sides, "fusion_splits": raw["fusion_splits"], "overrides": raw["overrides"],
              "summary": summary, "per_round": {k: {s: v.tolist() for s, v in per[k].items()}
                                                for k in ("tokens_per_s", "apply_ms", "step_ms")},
              "blocks": raw["blocks"], "load_before": load_before, "load_after": machine_load()}
    print(f"bench distributed (reduce): {n} rounds x {steps} steps per block, 2 ranks, per rank "
          f"{raw['rank_tokens']} tokens; own = one flat AllReduce, host = the shared-memory sum on one host, msK = "
          f"MindSpore DATA_PARALLEL reducer with K fusion buckets (ms0: one AllReduce per parameter)")
    print(f"  {'side':>5s} {'tokens/s median [range]':>28s} {'step ms median':>15s} {'reduce+update ms':>17s} "
          f"{'/ own: median [range]':>24s} {'pooled [95%]':>22s}")
    for s in sides:
        m = summary[s]
        print(f"  {s:>5s} {m['tokens_per_s_median']:10.0f} [{m['tokens_per_s_range'][0]:.0f}, "
              f"{m['tokens_per_s_range'][1]:.0f}] {m['step_ms_median']:15.1f} {m['apply_ms_median']:17.1f} "
              f"{m['vs_own_median']:9.3f} [{m['vs_own_range'][0]:.3f}, {m['vs_own_range'][1]:.3f}] "
              f"{m['vs_own_pooled']:9.3f} [{m['vs_own_interval95'][0]:.3f}, {m['vs_own_interval95'][1]:.3f}]")
    print(f"  load average before {load_before['loadavg_1m']:.2f}, after {result['load_after']['loadavg_1m']:.2f}")
    return write_result(result, out)


def add_arguments(parser):
    add_config_arguments(parser, "the benchmark model's config overrides apply to")
    parser.add_argument("--steps", type=int, default=20, help="steps per block (blocks) or per run (runs)")
    parser.add_argument("--rounds", type=int, default=8, help="blocks: rounds of alternating blocks of --steps")
    parser.add_argument("--rank-tokens", type=int, default=RANK_TOKENS,
                        help="blocks, reduce: tokens per rank before the balancing headroom (rows: tokens / 64)")
    parser.add_argument("--method", choices=["blocks", "runs", "reduce"], default="blocks",
                        help="alternate 1- and 2-process blocks in two long-lived processes (blocks), "
                             "separate training jobs one after another (runs), or alternate 2-process blocks "
                             "with the flat gradient sum and MindSpore's DATA_PARALLEL reducer (reduce)")
    parser.add_argument("--buckets", default="1,2,4,0",
                        help="reduce: fusion bucket counts of MindSpore's reducer to compare (0 = unfused)")
    add_out_argument(parser)


def run(args) -> int:
    from mindgr.config import ConfigError
    if args.method != "reduce" and args.buckets != "1,2,4,0":
        raise ConfigError("bench distributed: --buckets applies to --method reduce only")
    if args.method == "reduce":
        bench_reduce_blocks(args.config, config_overrides(args), steps=args.steps, rounds=args.rounds,
                            out=args.out, rank_tokens=args.rank_tokens, buckets=args.buckets)
    elif args.method == "runs":
        if args.rank_tokens != RANK_TOKENS:
            raise ConfigError("bench distributed: --rank-tokens applies to --method blocks or reduce only")
        bench_scaling(args.config, config_overrides(args), steps=args.steps, out=args.out)
    else:
        bench_scaling_blocks(args.config, config_overrides(args), steps=args.steps, rounds=args.rounds,
                             out=args.out, rank_tokens=args.rank_tokens)
    return 0
