"""Benchmarks behind `mindgr bench`: they print measured figures; none of them is a test."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

_NO_SIGNAL = SimpleNamespace(signum=None)


def write_result(result, out, default=None):
    """Write a benchmark's result as JSON to --out (parents created); nothing when out is empty."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1, default=default))
    return result


def run_block(trainer, steps: int) -> dict:
    """`steps` more training steps of a built Trainer, inside a benchmark that alternates blocks: wall
    seconds (checkpoint/eval pauses excluded), real tokens, seconds inside the compiled step, input wait,
    process CPU and the CPU of the input thread's batch preparation."""
    trainer.cfg.train.max_steps = trainer.step + steps
    host = [0.0]
    prepare = trainer._prepare

    def timed_prepare(*args):
        c0 = time.thread_time()
        try:
            return prepare(*args)
        finally:
            host[0] += time.thread_time() - c0
    trainer._prepare = timed_prepare
    window = {"loss": 0.0, "n": 0, "tokens": 0, "fill": 0.0, "step_s": 0.0, "flops": 0.0, "wait_s": 0.0,
              "pause_s": 0.0, "t0": time.perf_counter(), "cpu0": time.process_time()}
    try:
        trainer._epochs(window, 1.0, _NO_SIGNAL)
    finally:
        del trainer._prepare
    wall = time.perf_counter() - window["t0"] - window["pause_s"]
    return {"wall_s": wall, "tokens": window["tokens"], "steps": window["n"], "step_s": window["step_s"],
            "wait_s": window["wait_s"], "cpu_s": time.process_time() - window["cpu0"], "host_cpu_s": host[0]}
