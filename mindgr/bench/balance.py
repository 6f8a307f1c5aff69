"""`mindgr bench balance`: how evenly one global batch is split across ranks.

1. Calibrate the cost model c(L) = c0 + a L + b L^2 on this machine: the timed probe of
   mindgr.parallel.calibrate on the benchmark model (HSTU, N = 1024, one thread), at the per-rank
   capacities.
2. Simulated ranks (8, 16, 64): KuaiRand-like lengths (log-normal, median 0.25 N), global batches from the
   single-process planner at world x 8192 tokens, split by
     balanced  mindgr.parallel.balance (LPT + local search, within the per-rank capacities),
     tokens    token-balanced bin packing (no cost model),
     random    the batch's sequences dealt at random, equal counts (capacities ignored);
   imbalance = max rank cost / mean rank cost - 1 of the calibrated variable cost sum_i c(L_i), and of
   the predicted step time (fixed + that cost); fill = tokens / (world x per-rank capacity).
3. Two real ranks (msrun): the benchmark trained with parallel.balance=cost and =random (capacity-
   respecting random), imbalance measured from each rank's own forward+backward time per step (wall
   time, and the process CPU time, which other jobs on a shared machine do not inflate).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from mindgr.bench import add_config_arguments, add_out_argument, config_overrides, write_result
from mindgr.bench.distributed_common import (BENCH_OVERRIDES, N, RANK_ROWS, RANK_TOKENS, SLACK, kuairand_lengths,
                                             machine_load, read_jsonl, run_training, temp_dir)


def calibrate_here(config, overrides, token_capacity: int, row_capacity: int) -> dict:
    """The cost-model probe in this process, on the benchmark model (no communication needed)."""
    from mindgr.config import load_config
    from mindgr.parallel.calibrate import calibrate, grads_timer
    from mindgr.parallel.dp import LocalGrads
    from mindgr.train.trainer import Model, setup_mindspore
    cfg = load_config(config, BENCH_OVERRIDES + list(overrides))
    backend = setup_mindspore(cfg)
    num_items = cfg.data.synthetic.num_items
    model = Model(cfg, num_items)
    local = LocalGrads(model.loss_net, model.optimizer.parameters)
    enc = model.encoder
    timer = grads_timer(local, num_items, token_capacity, row_capacity, cfg.loss.num_negatives,
                        enc.dropout_sites, enc.dropout_width, seed=cfg.run.seed)
    result = calibrate(timer, token_capacity, row_capacity, cfg.data.max_len, reps=3)
    result["backend"] = backend
    return result


def simulate(lengths, world: int, cost_model, fixed_s: float, batches: int) -> dict:
    from mindgr.datasets import plan_batches
    from mindgr.parallel.balance import deal_random, imbalance, partition, rank_loads
    from mindgr.parallel.plan import rank_capacities
    tg, bg = world * RANK_TOKENS, world * RANK_ROWS
    t, b = rank_capacities(tg, bg, world, SLACK)
    need = batches * int(np.ceil(tg / lengths.mean())) + 1
    lens = lengths[:need]
    plan = plan_batches(lens, tg, bg, rng=np.random.default_rng(world))[:batches]
    rng = np.random.default_rng(7)
    stats = {m: {"cost": [], "step": []} for m in ("balanced", "tokens", "random")}
    fills, seconds = [], []
    for batch in plan:
        lb = lens[batch]
        for method in stats:
            t0 = time.perf_counter()
            if method == "random":
                parts = deal_random(len(lb), world, rng)
            else:
                parts = partition(lb, world, t, b, cost_model, method)
            if method == "balanced":
                seconds.append(time.perf_counter() - t0)
                fills.append(lb.sum() / (world * t))
            cost = rank_loads(lb, parts, cost_model)[0]
            stats[method]["cost"].append(imbalance(cost))
            stats[method]["step"].append(imbalance(cost + fixed_s))
    out = {"world": world, "rank_tokens": t, "rank_rows": b, "global_batches": len(plan),
           "sequences_per_batch": float(np.mean([len(x) for x in plan])), "fill": float(np.mean(fills)),
           "split_ms": float(np.mean(seconds) * 1e3)}
    for method, s in stats.items():
        out[method] = {"imbalance_mean": float(np.mean(s["cost"])), "imbalance_max": float(np.max(s["cost"])),
                       "step_imbalance_mean": float(np.mean(s["step"]))}
    return out


def measure_two_ranks(config, overrides, steps: int, warmup: int = 5) -> dict:
    """Train the benchmark on 2 real ranks with balance=cost and =random; imbalance from step times."""
    out_dir = temp_dir("mindgr-bench-balance-")
    common = BENCH_OVERRIDES + list(overrides) + [
        f"data.token_capacity={2 * RANK_TOKENS}", f"data.row_capacity={2 * RANK_ROWS}",
        f"train.max_steps={warmup + steps}", f"run.log_every={warmup}"]
    if config:
        common = ["--config", config] + common
    result = {}
    for method in ("cost", "random"):
        load = machine_load()
        run = run_training(common + [f"parallel.balance={method}"], 2, Path(out_dir), f"balance-{method}")
        rows = [r for r in read_jsonl(run / "balance.jsonl") if r["step"] > warmup]
        step_s = np.array([r["step_s"] for r in rows])
        # Does the cost model predict which rank is slower, and by how much? (seconds vs seconds)
        d_pred = np.array([r["pred_cost"][0] - r["pred_cost"][1] for r in rows])
        d_wall = step_s[:, 0] - step_s[:, 1]
        d_cpu = np.array([r["step_cpu_s"][0] - r["step_cpu_s"][1] for r in rows])
        agree = {}
        for name, d in (("wall", d_wall), ("cpu", d_cpu)):
            ok = np.std(d_pred) > 0 and np.std(d) > 0
            agree[name] = {"corr": float(np.corrcoef(d_pred, d)[0, 1]) if ok else None,
                           "slope": float(d_pred @ d / (d_pred @ d_pred)) if np.any(d_pred) else None}
        calib = next(r["calibration"] for r in read_jsonl(run / "metrics.jsonl") if "calibration" in r)
        result[method] = {
            "steps": len(rows), "imbalance_measured_mean": float(np.mean([r["imbalance_measured"] for r in rows])),
            "imbalance_measured_median": float(np.median([r["imbalance_measured"] for r in rows])),
            "imbalance_measured_cpu_mean": float(np.mean([r["imbalance_measured_cpu"] for r in rows])),
            "imbalance_pred_mean": float(np.mean([r["imbalance_pred"] for r in rows])),
            "imbalance_pred_step_mean": float(np.mean([r["imbalance_pred_step"] for r in rows])),
            "rank_step_s_mean": step_s.mean(0).tolist(),
            "imbalance_of_mean_times": float(step_s.mean(0).max() / step_s.mean(0).mean() - 1),
            "pred_vs_measured_rank_difference": agree,
            "measured_diff_noise_s": float(np.std(d_wall)), "pred_diff_s": float(np.std(d_pred)),
            "calibration": {k: calib[k] for k in ("a", "b", "c0", "fixed_s")}, "load_before": load}
    shutil.rmtree(out_dir, ignore_errors=True)       # checkpoints and logs of the timed runs
    return result


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _print(cal, sims, real):
    m = cal["model"]
    print(f"cost model (calibrated, {cal['backend']} backend, one thread, {cal['probe_s']:.0f} s probe): "
          f"c(L) = {m.c0:.3g} + {m.a:.3g} L + {m.b:.3g} L^2 s; fixed {cal['fixed_s'] * 1e3:.1f} ms/step; "
          f"fit residual {cal['rel_residual'] * 100:.1f}%")
    print(f"{'ranks':>5} {'fill':>6} {'balanced':>9} {'tokens':>8} {'random':>8} | step time imbalance: "
          f"{'balanced':>9} {'random':>8} | split ms")
    for s in sims:
        print(f"{s['world']:5d} {s['fill'] * 100:5.1f}% {s['balanced']['imbalance_mean'] * 100:8.2f}% "
              f"{s['tokens']['imbalance_mean'] * 100:7.2f}% {s['random']['imbalance_mean'] * 100:7.2f}% | "
              f"{'':21}{s['balanced']['step_imbalance_mean'] * 100:8.2f}% "
              f"{s['random']['step_imbalance_mean'] * 100:7.2f}% | {s['split_ms']:.1f}")
    if real:
        for method in ("cost", "random"):
            r = real[method]
            print(f"2 real ranks, balance={method}: measured imbalance mean {r['imbalance_measured_mean'] * 100:.2f}% "
                  f"(median {r['imbalance_measured_median'] * 100:.2f}%; from CPU time "
                  f"{r['imbalance_measured_cpu_mean'] * 100:.2f}%), predicted {r['imbalance_pred_mean'] * 100:.2f}% "
                  f"of the variable cost = {r['imbalance_pred_step_mean'] * 100:.2f}% of the step, over "
                  f"{r['steps']} steps; mean step per rank "
                  f"{', '.join(f'{x * 1e3:.0f}' for x in r['rank_step_s_mean'])} ms")
            a = r["pred_vs_measured_rank_difference"]
            print(f"    rank 0 - rank 1 time vs the cost model's prediction: wall corr {_num(a['wall']['corr'])} "
                  f"slope {_num(a['wall']['slope'])}, cpu corr {_num(a['cpu']['corr'])} "
                  f"slope {_num(a['cpu']['slope'])} (predicted spread {r['pred_diff_s'] * 1e3:.1f} ms, "
                  f"measured {r['measured_diff_noise_s'] * 1e3:.1f} ms)")


def bench_balance(config=None, overrides=(), steps: int = 20, out: str | None = None, ranks=(8, 16, 64),
                  real: bool = True) -> dict:
    from mindgr.parallel.plan import rank_capacities
    t, b = rank_capacities(2 * RANK_TOKENS, 2 * RANK_ROWS, 2, SLACK)
    cal = calibrate_here(config, overrides, t, b)
    model = cal["model"]
    lengths = kuairand_lengths(200_000, N, seed=0)
    sims = [simulate(lengths, w, model, cal["fixed_s"], batches=40 if w < 64 else 15) for w in ranks]
    result = {"calibration": {**model.as_dict(), "fixed_s": cal["fixed_s"], "rel_residual": cal["rel_residual"],
                              "probe": cal["probe"], "backend": cal["backend"], "rank_tokens": t, "rank_rows": b},
              "lengths": {"max_len": N, "median": float(np.median(lengths)), "mean": float(lengths.mean())},
              "simulated": sims, "load": machine_load()}
    result["two_real_ranks"] = measure_two_ranks(config, overrides, steps) if real else None
    _print(cal, sims, result["two_real_ranks"])
    return write_result(result, out, default=lambda o: o.as_dict())


def add_arguments(parser):
    add_config_arguments(parser, "the benchmark model's config overrides apply to")
    parser.add_argument("--steps", type=int, default=20, help="steps of the 2-process measurement")
    parser.add_argument("--ranks", default="8,16,64", help="simulated rank counts")
    parser.add_argument("--no-real", action="store_true", help="skip the 2-process msrun measurement")
    add_out_argument(parser)


def run(args) -> int:
    bench_balance(args.config, config_overrides(args), steps=args.steps, out=args.out,
                  ranks=[int(r) for r in args.ranks.split(",")], real=not args.no_real)
    return 0
