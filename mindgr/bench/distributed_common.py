"""Shared by `mindgr bench balance` and `mindgr bench distributed`: the KuaiRand-like benchmark setup
and a helper that runs real multi-process training jobs and reads back what they logged."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

N = 1024              # max sequence length of the benchmark (KuaiRand-like: median 0.25 N)
RANK_TOKENS = 8192    # tokens per rank before the balancing headroom
RANK_ROWS = 128
TOKENS_PER_ROW = RANK_TOKENS // RANK_ROWS   # row capacity per token capacity (64: median length 256 / 4)
SLACK = 0.01

# How a benchmark run trains: no evaluation in the way, one compute thread per process.
RUN_OVERRIDES = ["train.epochs=1000", "eval.every_epochs=0", "parallel.threads=1", f"parallel.capacity_slack={SLACK}"]
# A KuaiRand-like synthetic run: log-normal lengths (median 256 = 0.25 N, sigma 0.8, as the synthetic
# reader draws them), HSTU with N = 1024 on the C++ CPU kernels. Any --config / override replaces these.
BENCH_OVERRIDES = [
    "data.kind=synthetic", f"data.max_len={N}", "data.synthetic.num_users=2400", "data.synthetic.num_items=2000",
    f"data.synthetic.median_len={N // 4}", f"data.synthetic.max_len={N}", "data.synthetic.min_len=5",
    "model.dim=64", "model.num_blocks=2", "model.num_heads=2", "loss.num_negatives=32",
] + RUN_OVERRIDES


def bench_overrides(config: str | None, overrides=()) -> list[str]:
    """The benchmark's own overrides for a config: the KuaiRand-like data and model for a retrieval config;
    for a semantic-ID (generative) config only RUN_OVERRIDES, since its rows copy the prompt once per target
    (tokens grow with the square of the history) and its own data and model are the point."""
    from mindgr.config import load_config
    from mindgr.train.tasks import task_class
    if config and task_class(load_config(config, list(overrides))).semantic_ids:
        return list(RUN_OVERRIDES)
    return list(BENCH_OVERRIDES)


def block_parser(prog: str, what: str) -> argparse.ArgumentParser:
    """The arguments every alternating-blocks rank program takes; `what` names the things a block runs."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--config", help="YAML config under the benchmark overrides (as `mindgr train --config`)")
    ap.add_argument("--out", required=True, help="rank 0 writes the block timings (JSON) here")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10, help="training steps per block")
    ap.add_argument("--warmup", type=int, default=4, help=f"untimed steps per {what} first (compile)")
    ap.add_argument("--rank-tokens", type=int, default=RANK_TOKENS, help="tokens per rank before the headroom")
    return ap


def rank_rows(rank_tokens: int) -> int:
    """Row capacity that goes with a per-rank token capacity in the benchmark (128 rows at 8192 tokens)."""
    return max(1, rank_tokens // TOKENS_PER_ROW)


def kuairand_lengths(count: int, max_len: int = N, seed: int = 0, sigma: float = 0.8, min_len: int = 5):
    """Log-normal lengths with median max_len / 4, clipped to [min_len, max_len]."""
    rng = np.random.default_rng(seed)
    x = np.exp(np.log(0.25 * max_len) + sigma * rng.standard_normal(count))
    return np.clip(np.round(x), min_len, max_len).astype(np.int64)


def machine_load() -> dict:
    """Load average and the busiest other processes: the benchmarks share the machine."""
    load = os.getloadavg()
    try:
        ps = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True,
                            timeout=10).stdout.splitlines()[1:6]
    except (OSError, subprocess.SubprocessError):
        ps = []
    return {"loadavg_1m": load[0], "cpus": os.cpu_count(), "top": [" ".join(l.split()) for l in ps]}


def run_training(overrides: list[str], nproc: int, out_dir: Path, name: str, timeout: float = 1800,
                 env: dict | None = None) -> Path:
    """`mindgr train [--nproc N]` with the given overrides; returns the run directory (raises on failure)."""
    from mindgr.parallel.launch import run_job
    cmd = [sys.executable, "-m", "mindgr", "train", *overrides, f"run.out_dir={out_dir}", f"run.name={name}"]
    if nproc > 1:
        cmd[4:4] = ["--nproc", str(nproc)]
    code, out, err, timed_out = run_job(cmd, timeout, env=env)
    if timed_out or code != 0:
        raise RuntimeError(f"benchmark run {name} failed (exit {code}, timed out {timed_out}):\n{err[-3000:]}")
    return Path(out_dir) / name


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def temp_dir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)
