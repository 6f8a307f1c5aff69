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


# ---- arguments every benchmark of a training config shares (each benchmark module declares its own
# arguments with add_arguments(parser) and runs with run(args); mindgr.bench.registry lists them) ----------

def add_config_arguments(parser, what: str = "the config to measure"):
    """--config and --set; bare SECTION.KEY=VALUE words on the command line are overrides too."""
    parser.add_argument("--config", help=f"{what} (YAML; default: the built-in defaults)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override a config key (repeatable; bare SECTION.KEY=VALUE words work too)")
    parser.set_defaults(takes_overrides=True)


def add_out_argument(parser):
    parser.add_argument("--out", help="also write the figures as JSON to this path")


def config_overrides(args) -> list[str]:
    """--set values, then the bare SECTION.KEY=VALUE words (the cli puts those in args.overrides)."""
    return list(getattr(args, "set", None) or []) + list(getattr(args, "overrides", None) or [])


def load_bench_config(args):
    """The resolved config of --config and the overrides: a bad one is one ConfigError line before any work."""
    from mindgr.config import load_config
    return load_config(args.config, config_overrides(args))
