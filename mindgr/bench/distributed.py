"""`mindgr bench distributed`: scaling efficiency of data parallel training on this machine.

efficiency = tokens/s with 2 processes / (2 x tokens/s with 1 process), one compute thread per process
(parallel.threads=1), on the same KuaiRand-like benchmark (mindgr.bench.distributed_common). Each
process runs the same graph shape: the 1-process runs train at the per-rank capacities of the
2-process run. Two ways to get "tokens/s with 1 process":
  side by side  two independent 1-process runs at the same time, before and after the 2-process run:
                as many of our processes compete for the cores as in the 2-process run, so load from
                other jobs on a shared machine weighs on both sides alike (the headline figure);
  alone         one 1-process run, before and after.
On an idle machine with 2 free cores the two coincide. tokens/s are real tokens over the wall time of
the logged windows after the warm-up (compile and, for 2 processes, the cost-model probe excluded), so
they include everything a step costs: host packing and draws, the step, the gradient all-reduce and
the logging collectives. Also reported: real tokens per CPU-second of all processes.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mindgr.bench import write_result
from mindgr.bench.distributed_common import (BENCH_OVERRIDES, RANK_ROWS, RANK_TOKENS, SLACK, machine_load,
                                             read_jsonl, run_training, temp_dir)


def _tokens_per_s(run_dir: Path, warmup: int) -> dict:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r and r["step"] > warmup]
    tps = np.array([r["tokens_per_s"] for r in rows])
    # CPU seconds all ranks spent per wall second (rank 0's cpu_util scaled by the ranks' CPU shares).
    cores = [r["cpu_util"] * (sum(r["rank_cpu_s"]) / r["rank_cpu_s"][0] if "rank_cpu_s" in r else 1.0)
             for r in rows]
    # Where a 2-process step goes (per rank, logged by the DistributedTrainer): the local forward +
    # backward (wall and CPU) and the gradient all-reduce + optimizer update.
    parts = {k: float(np.mean([np.mean(r[k]) for r in rows])) for k in ("rank_step_s", "rank_step_cpu_s",
                                                                           "reduce_apply_s") if rows and k in rows[0]}
    return {**parts, "tokens_per_s": float(tps.mean()), "windows": len(rows), "window_tokens_per_s": tps.tolist(),
            "cores_busy": float(np.mean(cores)), "tokens_per_cpu_s": float(np.mean(tps / np.array(cores))),
            "step_time_s": float(np.mean([r["step_time_s"] for r in rows])),
            "fill": float(np.mean([r["fill"] for r in rows]))}


def bench_scaling(config=None, overrides=(), steps: int = 30, out: str | None = None, warmup: int = 5,
                  **_) -> dict:
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
