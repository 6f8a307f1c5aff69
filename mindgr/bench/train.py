"""`mindgr bench train`: real tokens/s, step time and MFU of the compiled training step of a config
(with --backends: several op backends side by side, mindgr.bench.backends)."""
from __future__ import annotations

import tempfile

import numpy as np

from mindgr.bench import (add_config_arguments, add_out_argument, config_overrides, load_bench_config, quiet_run,
                          write_result)


def _kernel_isa(backend: str) -> str | None:
    """The vector ISA of the C++ kernels when the cpu backend runs them (None otherwise)."""
    if backend != "cpu":
        return None
    from mindgr.ops import cpu
    return cpu.isa()


def bench_train(cfg, steps: int = 20, warmup: int = 3, out: str | None = None) -> dict:
    from mindgr.train.peak import busy_reason, measure_peak, quiet_peak
    from mindgr.train.trainer import Trainer
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run.out_dir, cfg.run.name = tmp, "bench"
        quiet_run(cfg)
        trainer = Trainer(cfg, quiet=True)
        data = trainer.data
        from mindgr.bench.backends import peak_rss_mb, rss_mb
        rss_before = rss_mb()
        compile_s = trainer.run_steps(1)["step_s"]          # the first step includes the compile
        if warmup > 1:
            trainer.run_steps(warmup - 1)
        block = trainer.run_steps(steps)
        times, tokens, flops = block["step_times"], block["tokens"], block["flops"]
        fill = block["fill"] / max(block["steps"], 1)
        # the MFU denominator measured now, in this process, under the same host load as the steps
        measured = measure_peak()
        peak = measured["flops_per_s"]
    total = float(np.sum(times))
    isa = _kernel_isa(trainer.backend)
    result = {
        "arch": cfg.model.arch, "backend": trainer.backend, "token_capacity": data.train.token_capacity,
        "row_capacity": data.train.row_capacity, "steps": steps, "first_step_s_incl_compile": compile_s,
        "step_time_s_median": float(np.median(times)), "real_tokens_per_s": tokens / total,
        "fill": float(fill), "model_tflops_per_step": flops / steps / 1e12,
        "mfu": flops / total / peak, "peak_gflops": peak / 1e9,
        "rss_before_mb": rss_before, "peak_rss_mb": peak_rss_mb(), "kernel_isa": isa,
        "peak_busy": busy_reason(measured, quiet_peak()),
    }
    print(f"bench train [{cfg.model.arch}, backend {result['backend']}, T_cap {result['token_capacity']}, "
          f"B_cap {result['row_capacity']}]" + (f", C++ kernels {isa}" if isa else ""))
    print(f"  step time (median of {steps}) {result['step_time_s_median'] * 1e3:.1f} ms | first step incl. "
          f"compile {compile_s:.1f} s")
    print(f"  resident memory {result['rss_before_mb']:.0f} MB before the first step, peak "
          f"{result['peak_rss_mb']:.0f} MB")
    print(f"  real tokens/s {result['real_tokens_per_s']:.0f} | fill {result['fill']:.3f} | "
          f"MFU {result['mfu'] * 100:.2f}% of {result['peak_gflops']:.1f} GFLOP/s (MindSpore fp32 MatMul peak, "
          f"measured in this run after the steps)")
    if result["peak_busy"]:
        print(f"  note: the host was busy while the peak was measured ({result['peak_busy']}): MFU reads high")
    return write_result(result, out)


def add_arguments(parser):
    add_config_arguments(parser)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first, compile included")
    parser.add_argument("--backends", help="compare op backends side by side, e.g. reference,cpu")
    parser.add_argument("--no-memory", action="store_true", help="--backends: skip the per-backend memory runs")
    add_out_argument(parser)


def run(args) -> int:
    cfg = load_bench_config(args)   # a bad config: one line before anything is built
    if args.backends:
        from mindgr.bench.backends import bench_backends
        bench_backends(args.config, config_overrides(args), args.backends.split(","), steps=args.steps,
                       memory=not args.no_memory, out=args.out)
        return 0
    bench_train(cfg, steps=args.steps, warmup=args.warmup, out=args.out)
    return 0
