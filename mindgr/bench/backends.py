"""Side-by-side variants of one training step: `mindgr bench train --backends reference,cpu` (op
backends) and `mindgr bench negatives` (negative strategies).

Speed: every variant's step is compiled in ONE process, then timed steps alternate between variants on
the same batches, so machine noise hits all of them alike and the ratio is fair.
Memory: peak memory needs a process per variant; each runs `mindgr bench train` alone and reports the
growth of its resident memory from just before the first step to the peak (compile workspace,
activations and optimizer state: what the step itself costs).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from mindgr.bench import write_result


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """This process's resident high-water mark. Not getrusage: its ru_maxrss survives fork+exec, so a
    child would report its parent's peak."""
    return _status_mb("VmHWM")


def _memory_in_subprocess(cfg_path: str, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "mindgr", "bench", "train", "--config", cfg_path, *overrides,
               "--steps", "2", "--warmup", "1", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit {proc.returncode}: {tail[0]}"}
        r = json.loads(out.read_text())
        return {"rss_before_mb": r["rss_before_mb"], "peak_rss_mb": r["peak_rss_mb"],
                "step_memory_mb": r["peak_rss_mb"] - r["rss_before_mb"]}


def bench_variants(cfg_path: str, overrides, variants: dict, steps: int = 10, memory: bool = True,
                   out: str | None = None) -> dict:
    """variants: name -> extra overrides. Each variant's step is compiled in this process (one after the
    other: the op backend binds at compile time), then timed steps alternate between variants.
    Optional hooks on `variants`: prepare(cfg_path, overrides) -> (cfg_path, None) or (None, reason to
    measure nothing), and summarise(result) for figures derived from the whole table."""
    prepare = getattr(variants, "prepare", None)
    if prepare is not None:
        cfg_path, skip = prepare(cfg_path, overrides)
        if skip:
            print(f"bench skipped: {skip}")
            return {"skipped": skip}
    from mindgr.bench import quiet_run
    from mindgr.config import load_config
    from mindgr.train.peak import peak_flops
    from mindgr.train.trainer import Trainer
    peak = peak_flops()["flops_per_s"]
    names = list(variants)
    trainers, compile_s = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            c = quiet_run(load_config(cfg_path, list(overrides) + list(variants[name])))
            c.run.out_dir, c.run.name = tmp, f"bench-{len(trainers)}"
            t = Trainer(c, quiet=True)
            compile_s[name] = t.run_steps(1)["step_s"]            # the first step includes the compile
            trainers[name] = t
        times = {name: [] for name in names}
        flops = {name: 0.0 for name in names}
        tokens = 0.0
        for _ in range(steps):
            for name in names:                       # alternate: same batch (same plan), same moment
                block = trainers[name].run_steps(1)
                times[name].append(block["step_s"])
                flops[name] += block["flops"]
            tokens += block["tokens"]
    first = trainers[names[0]].data.train
    result = {"config": cfg_path, "overrides": list(overrides), "steps": steps, "peak_gflops": peak / 1e9,
              "token_capacity": first.token_capacity, "row_capacity": first.row_capacity, "variants": {}}
    for name in names:
        total = float(np.sum(times[name]))
        result["variants"][name] = {
            "overrides": list(variants[name]),
            "negatives_per_position": trainers[name].executor.task.sampler.negatives.num_candidates,
            "step_time_s_median": float(np.median(times[name])), "real_tokens_per_s": tokens / total,
            "mfu": flops[name] / total / peak, "first_step_s_incl_compile": compile_s[name]}
    if memory:
        for name in names:
            result["variants"][name].update(_memory_in_subprocess(cfg_path, list(overrides) + list(variants[name])))
    base = result["variants"][names[0]]
    for name in names[1:]:
        v = result["variants"][name]
        v["tokens_per_s_vs_first"] = v["real_tokens_per_s"] / base["real_tokens_per_s"]
        if base.get("step_memory_mb") and v.get("step_memory_mb"):
            v["step_memory_saved_vs_first"] = 1 - v["step_memory_mb"] / base["step_memory_mb"]
    _print(result)
    summarise = getattr(variants, "summarise", None)
    if summarise is not None:
        summarise(result)
    return write_result(result, out)


def bench_backends(cfg_path: str, overrides, backends, steps: int = 10, memory: bool = True,
                   out: str | None = None) -> dict:
    return bench_variants(cfg_path, overrides, {be: [f"ops.backend={be}"] for be in backends}, steps, memory, out)


def _print(result: dict):
    print(f"bench {result['config']} {' '.join(result['overrides'])}: T_cap {result['token_capacity']}, "
          f"B_cap {result['row_capacity']}, {result['steps']} alternating steps per variant")
    print(f"  {'variant':30s} {'neg/pos':>7s} {'step ms':>9s} {'real tok/s':>11s} {'MFU %':>7s} {'compile s':>9s} "
          f"{'step mem MB':>11s} {'peak RSS MB':>11s} {'tok/s ratio':>11s} {'mem saved':>9s}")
    for name, r in result["variants"].items():
        mem = f"{r['step_memory_mb']:11.0f} {r['peak_rss_mb']:11.0f}" if "step_memory_mb" in r else \
            f"{r.get('error', 'not measured'):>23s}"
        ratio = f"{r['tokens_per_s_vs_first']:10.2f}x" if "tokens_per_s_vs_first" in r else f"{'1.00x':>11s}"
        saved = f"{r['step_memory_saved_vs_first'] * 100:8.0f}%" if "step_memory_saved_vs_first" in r else f"{'-':>9s}"
        print(f"  {name:30s} {r['negatives_per_position']:7d} {r['step_time_s_median'] * 1e3:9.1f} "
              f"{r['real_tokens_per_s']:11.0f} {r['mfu'] * 100:7.2f} {r['first_step_s_incl_compile']:9.1f} {mem} "
              f"{ratio} {saved}")
