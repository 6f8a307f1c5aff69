"""Benchmarks behind `mindgr bench`: they print measured figures; none of them is a test."""

import json
from pathlib import Path


def write_result(result, out, default=None):
    """Write a benchmark's result as JSON to --out (parents created); nothing when out is empty."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1, default=default))
    return result


def run_block(loop, steps: int) -> dict:
    """`steps` more training steps of a built training loop (mindgr.train.loop.TrainLoop.run_steps), inside
    a benchmark that alternates blocks: wall seconds (checkpoint/eval pauses excluded), real tokens, seconds
    inside the compiled step, input wait, process CPU and the CPU of the input thread's batch preparation."""
    rec = loop.run_steps(steps)
    return {k: rec[k] for k in ("wall_s", "tokens", "steps", "step_s", "wait_s", "cpu_s", "host_cpu_s")}


def quiet_run(cfg):
    """A benchmark's training config: no evaluation, checkpoint or log window gets in the way of the steps,
    and the epochs never run out (the steps go on through the epochs' batch plans)."""
    cfg.train.epochs, cfg.train.max_steps = 10 ** 6, 0
    cfg.eval.every_epochs, cfg.run.ckpt_every, cfg.run.log_every = 0, 10 ** 9, 10 ** 9
    return cfg
