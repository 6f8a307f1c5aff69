"""`mindgr bench train --backends reference,cpu`: the same training step on several op backends.

Speed: every backend's step is compiled in ONE process, then timed steps alternate between backends on
the same batches, so machine noise hits all of them alike and the ratio is fair.
Memory: peak memory needs a process per backend; each runs `mindgr bench train` alone and reports the
growth of its resident memory from just before the first step to the peak (compile workspace,
activations and optimizer state: what the step itself costs).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


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


def _memory_in_subprocess(cfg_path: str, overrides: list[str], backend: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "mindgr", "bench", "train", "--config", cfg_path, *overrides,
               f"ops.backend={backend}", "--steps", "2", "--warmup", "1", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit {proc.returncode}: {tail[0]}"}
        r = json.loads(out.read_text())
        return {"rss_before_mb": r["rss_before_mb"], "peak_rss_mb": r["peak_rss_mb"],
                "step_memory_mb": r["peak_rss_mb"] - r["rss_before_mb"]}


def bench_backends(cfg, backends, steps: int = 10, cfg_path: str | None = None, overrides=(),
                   memory: bool = True, out: str | None = None) -> dict:
    from mindgr.train.flops import train_flops
    from mindgr.train.peak import peak_flops
    from mindgr.train.trainer import Trainer
    peak = peak_flops()["flops_per_s"]
    trainers, compile_s = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for be in backends:
            c = copy.deepcopy(cfg)
            c.run.out_dir, c.run.name, c.ops.backend = tmp, f"bench-{be}", be
            t = Trainer(c, quiet=True)              # selects the backend; the graph binds it at compile
            t0 = time.perf_counter()
            t._train_batch(0, 0, t.data.plan.batches(0)[0])
            compile_s[be] = time.perf_counter() - t0
            trainers[be] = t
        plan = trainers[backends[0]].data.plan.batches(0)
        times = {be: [] for be in backends}
        tokens = flops = 0.0
        for i in range(1, steps + 1):
            for be in backends:                     # alternate: same batch, same moment
                _, step_s, info = trainers[be]._train_batch(0, i % len(plan), plan[i % len(plan)])
                times[be].append(step_s)
            tokens += info["tokens"]
            flops += train_flops(cfg.model, info["lengths"], info["targets"], cfg.loss.num_negatives)
    result = {"config": cfg_path, "steps": steps, "peak_gflops": peak / 1e9,
              "token_capacity": trainers[backends[0]].data.train.token_capacity,
              "row_capacity": trainers[backends[0]].data.train.row_capacity, "backends": {}}
    for be in backends:
        total = float(np.sum(times[be]))
        result["backends"][be] = {"step_time_s_median": float(np.median(times[be])),
                                  "real_tokens_per_s": tokens / total, "mfu": flops / total / peak,
                                  "first_step_s_incl_compile": compile_s[be]}
    if memory and cfg_path:
        for be in backends:
            result["backends"][be].update(_memory_in_subprocess(cfg_path, list(overrides), be))
    base = backends[0]
    for be in backends[1:]:
        a, b = result["backends"][base], result["backends"][be]
        a_mem, b_mem = a.get("step_memory_mb"), b.get("step_memory_mb")
        result[f"{be}_vs_{base}"] = {
            "tokens_per_s_ratio": b["real_tokens_per_s"] / a["real_tokens_per_s"],
            "step_memory_saved": (1 - b_mem / a_mem) if a_mem and b_mem else None}
    _print(result, backends)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    return result


def _print(result: dict, backends):
    print(f"bench train {result['config']}: T_cap {result['token_capacity']}, B_cap {result['row_capacity']}, "
          f"{result['steps']} alternating steps per backend")
    print(f"  {'backend':10s} {'step ms':>9s} {'real tok/s':>11s} {'MFU %':>7s} {'compile s':>9s} "
          f"{'step mem MB':>11s} {'peak RSS MB':>11s}")
    for be in backends:
        r = result["backends"][be]
        mem = f"{r['step_memory_mb']:11.0f} {r['peak_rss_mb']:11.0f}" if "step_memory_mb" in r else \
            f"{r.get('error', 'not measured'):>23s}"
        print(f"  {be:10s} {r['step_time_s_median'] * 1e3:9.1f} {r['real_tokens_per_s']:11.0f} "
              f"{r['mfu'] * 100:7.2f} {r['first_step_s_incl_compile']:9.1f} {mem}")
    for key, v in result.items():
        if key.endswith(tuple(f"_vs_{b}" for b in backends)):
            saved = "n/a" if v["step_memory_saved"] is None else f"{v['step_memory_saved'] * 100:.0f}%"
            print(f"  {key}: tokens/s x{v['tokens_per_s_ratio']:.2f}, step memory saved {saved}")
