"""`mindgr bench train`: real tokens/s, step time and MFU of the compiled training step of a config."""
from __future__ import annotations

import tempfile

import numpy as np

from mindgr.bench import write_result


def _kernel_isa(backend: str) -> str | None:
    """The vector ISA of the C++ kernels when the cpu backend runs them (None otherwise)."""
    if backend != "cpu":
        return None
    from mindgr.ops import cpu
    return cpu.isa()


def bench_train(cfg, steps: int = 20, warmup: int = 3, out: str | None = None) -> dict:
    from mindgr.train.flops import train_flops
    from mindgr.train.peak import busy_reason, measure_peak
    from mindgr.train.trainer import Trainer
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run.out_dir, cfg.run.name = tmp, "bench"
        trainer = Trainer(cfg, quiet=True)
        data = trainer.data
        plan = data.plan.batches(0)
        from mindgr.bench.backends import peak_rss_mb, rss_mb
        times, tokens, flops, fills = [], 0, 0.0, []
        compile_s = None
        rss_before = rss_mb()
        for i in range(warmup + steps):
            _, dt, info = trainer._train_batch(0, i % len(plan), plan[i % len(plan)])
            if i == 0:
                compile_s = dt
            if i >= warmup:
                times.append(dt)
                tokens += info["tokens"]
                fills.append(info["fill"])
                flops += train_flops(cfg.model, info["lengths"], info["targets"],
                                     trainer.sampler.negatives.num_candidates)
        # the MFU denominator measured now, in this process, under the same host load as the steps
        measured = measure_peak()
        peak = measured["flops_per_s"]
    total = float(np.sum(times))
    isa = _kernel_isa(trainer.backend)
    result = {
        "arch": cfg.model.arch, "backend": trainer.backend, "token_capacity": data.train.token_capacity,
        "row_capacity": data.train.row_capacity, "steps": steps, "first_step_s_incl_compile": compile_s,
        "step_time_s_median": float(np.median(times)), "real_tokens_per_s": tokens / total,
        "fill": float(np.mean(fills)), "model_tflops_per_step": flops / steps / 1e12,
        "mfu": flops / total / peak, "peak_gflops": peak / 1e9,
        "rss_before_mb": rss_before, "peak_rss_mb": peak_rss_mb(), "kernel_isa": isa,
        "peak_busy": busy_reason(measured),
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
