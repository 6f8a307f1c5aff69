"""Side-by-side timing of the jagged HSTU attention: C++ CPU kernels vs the padded MindSpore reference.
Its command is `mindgr bench ops` (mindgr.bench.ops); from Python:

    from mindgr.ops.cpu.bench import bench_attention, lognormal_lengths
    bench_attention(lognormal_lengths(32, 1024), H=4, d=64, N=1024, repeats=3)

Both run in GRAPH mode inside the same process on the same inputs (time bias on). The timed step is
forward + backward (value_and_grad of sum(out * cotangent) w.r.t. q, k, v, w_pos, w_ts); a forward
alone is timed too. Compilation (first call) is excluded and reported separately.

The reference pads to [B, H, N, N] and keeps dozens of such tensors alive for the backward, so at large
B * N^2 it does not fit in memory (N 1024, H 4, 32 rows needs > 17 GB). It then runs on the first
`reference_rows` rows only (by default as many as fit in 40% of the available memory), and the
kernels are timed on that same subset too, so the speedup compares equal inputs.
"""
from __future__ import annotations

import time

import numpy as np

NUM_TIME_BUCKETS = 128
REFERENCE_TENSORS = 60  # [B, H, N, N] float32 tensors the reference's forward+backward holds at once


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def reference_rows_that_fit(num_rows: int, H: int, N: int, fraction: float = 0.4) -> int:
    """Most rows (<= num_rows) whose padded reference step fits in `fraction` of available memory."""
    per_row = REFERENCE_TENSORS * H * N * N * 4
    return max(0, min(num_rows, int(fraction * _available_bytes() // per_row)))


def lognormal_lengths(num_rows: int, max_len: int, median_frac: float = 0.25, sigma: float = 1.0,
                      seed: int = 0, min_len: int = 8) -> list[int]:
    """Long-tailed row lengths: log-normal with median median_frac * N, clipped to [min_len, N]."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(np.log(median_frac * max_len), sigma, num_rows)
    return [int(x) for x in np.clip(np.round(raw), min_len, max_len)]


def _inputs(lengths, H, d, N, seed):
    rng = np.random.default_rng(seed)
    t = int(sum(lengths))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    q = (rng.standard_normal((t, H, d)) * 0.3).astype(np.float32)
    k = (rng.standard_normal((t, H, d)) * 0.3).astype(np.float32)
    v = rng.standard_normal((t, H, d)).astype(np.float32)
    ts = np.cumsum(rng.integers(1, 100000, t)).astype(np.int64)
    w_pos = (rng.standard_normal(2 * N - 1) * 0.1).astype(np.float32)
    w_ts = (rng.standard_normal(NUM_TIME_BUCKETS + 1) * 0.1).astype(np.float32)
    cot = rng.standard_normal((t, H, d)).astype(np.float32)
    return q, k, v, offsets, ts, w_pos, w_ts, cot


def _time_backend(fn, arrays, N, repeats):
    import mindspore as ms
    from mindspore import nn

    class Loss(nn.Cell):
        def construct(self, q, k, v, offsets, ts, w_pos, w_ts, cot):
            return (fn(q, k, v, offsets, ts, w_pos, w_ts, N) * cot).sum()

    class Fwd(nn.Cell):
        def construct(self, q, k, v, offsets, ts, w_pos, w_ts):
            return fn(q, k, v, offsets, ts, w_pos, w_ts, N)

    tensors = [ms.Tensor(a) for a in arrays]
    step = ms.value_and_grad(Loss(), grad_position=(0, 1, 2, 5, 6))
    fwd = Fwd()

    def run_step():
        loss, grads = step(*tensors)
        loss.asnumpy()
        for g in grads:
            g.asnumpy()

    def run_fwd():
        fwd(*tensors[:7]).asnumpy()

    t0 = time.perf_counter()
    run_step()
    run_fwd()
    compile_s = time.perf_counter() - t0
    out = {"compile_s": compile_s}
    for name, f in (("fwd_bwd_ms", run_step), ("fwd_ms", run_fwd)):
        best = float("inf")
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        out[name] = best * 1e3
    return out


def bench_attention(lengths, H: int, d: int, N: int, repeats: int = 3, reference: bool = True,
                    reference_rows: int | None = None, seed: int = 0) -> dict:
    """Best-of-`repeats` forward+backward (and forward) milliseconds for `cpu` and `reference`.

    lengths: row lengths (each <= N); H heads of size d (dqk = dv = d); N = max_len.
    Returns {"rows", "tokens", "pairs" (causal pairs per head, sum L(L+1)/2), "threads",
    "cpu": {"fwd_bwd_ms", "fwd_ms", "compile_s"} on all rows,
    "reference": {..., "rows"} or None, "cpu_same_rows": {...} (kernels on the reference's rows,
    when those are fewer), "speedup_fwd_bwd" / "speedup_fwd" (reference / cpu on the same rows)}.
    """
    import mindspore as ms

    from mindgr.ops import cpu
    from mindgr.ops import reference as ref

    lengths = [int(x) for x in lengths]
    if any(x < 0 or x > N for x in lengths):
        raise ValueError(f"row lengths must be in [0, N={N}]")
    reason = cpu.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cpu backend unavailable: {reason}")
    if reference and reference_rows is None:
        reference_rows = reference_rows_that_fit(len(lengths), H, N)
    ref_rows = min(len(lengths), reference_rows or 0) if reference else 0

    def stats(rows):
        return {"rows": len(rows), "tokens": int(sum(rows)), "pairs": int(sum(x * (x + 1) // 2 for x in rows))}

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        result = {**stats(lengths), "H": H, "d": d, "N": N, "threads": cpu.kernel_threads(),
                  "cpu": _time_backend(cpu.hstu_attention, _inputs(lengths, H, d, N, seed), N, repeats),
                  "reference": None}
        if ref_rows > 0:
            sub = lengths[:ref_rows]
            arrays = _inputs(sub, H, d, N, seed)
            same = result["cpu"]
            if ref_rows < len(lengths):
                same = result["cpu_same_rows"] = {
                    **stats(sub), **_time_backend(cpu.hstu_attention, arrays, N, repeats)}
            result["reference"] = {**stats(sub), **_time_backend(ref.hstu_attention, arrays, N, repeats)}
            for key in ("fwd_bwd_ms", "fwd_ms"):
                result["speedup_" + key[:-3]] = result["reference"][key] / same[key]
    finally:
        ms.set_context(mode=mode)
    return result

