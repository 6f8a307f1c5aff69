"""Fit the cost model c(L) = c0 + a*L + b*L^2 with a short timed probe of the compiled step.

A step at fixed capacities costs  fixed + sum_i c(L_i): `fixed` is what every rank pays whatever it
holds (graph launch, the dense layers and the loss run over all T_cap token slots); the sum is what the
split can move between ranks. The probe times the local forward + backward on a few synthetic batches
whose (rows, tokens, sum L^2) differ a lot (one token; many short rows; long rows; half of them; medium
rows), takes the median of `reps` runs each, and solves the non-negative least squares for
(fixed, c0, a, b) by trying every subset of the coefficients (4 unknowns: 8 subsets).
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from mindgr.parallel.balance import CostModel


def probe_designs(token_capacity: int, row_capacity: int, max_len: int) -> dict:
    """Named lists of sequence lengths, each fitting both capacities."""
    n_max = max(2, min(max_len, token_capacity))

    def rows_of(length, count=None):
        k = min(row_capacity, token_capacity // length)
        return [length] * max(1, min(k, count if count is not None else k))

    short = max(2, min(n_max, -(-token_capacity // row_capacity)))
    long_rows = rows_of(n_max)
    return {
        "one_token": [1],
        "short": rows_of(short),
        "medium": rows_of(max(2, n_max // 4)),
        "long": long_rows,
        "long_half": rows_of(n_max, max(1, len(long_rows) // 2)),
    }


def features(lengths) -> np.ndarray:
    """[1, rows, tokens, sum L^2]: the columns of the fit."""
    x = np.asarray(lengths, dtype=np.float64)
    return np.array([1.0, len(x), x.sum(), (x * x).sum()])


def fit(rows: np.ndarray, seconds: np.ndarray) -> tuple[CostModel, float, float]:
    """Non-negative least squares of seconds ~ fixed + c0*rows + a*tokens + b*sumsq.

    Returns (cost model, fixed seconds, relative RMS residual).
    """
    scale = np.maximum(np.abs(rows).max(0), 1e-12)     # columns to ~1 for a well-conditioned solve
    a = rows / scale
    best = None
    for k in range(1, 5):
        for cols in itertools.combinations(range(4), k):
            coef = np.zeros(4)
            sol, *_ = np.linalg.lstsq(a[:, cols], seconds, rcond=None)
            if np.any(sol < 0):
                continue
            coef[list(cols)] = sol
            err = float(np.sum((a @ coef - seconds) ** 2))
            if best is None or err < best[0] - 1e-18:
                best = (err, coef)
    coef = best[1] / scale
    rel = float(np.sqrt(best[0] / len(seconds)) / max(np.mean(seconds), 1e-12))
    return CostModel(a=float(coef[2]), b=float(coef[3]), c0=float(coef[1])), float(coef[0]), rel


def synthetic_batch(lengths, num_items: int, token_capacity: int, row_capacity: int, num_negatives: int,
                    drop_sites: int, drop_width: int, seed: int):
    """Random items with the given lengths at fixed capacities, plus negatives and all-ones dropout masks:
    (batch, negatives, drop), what the step consumes."""
    from mindgr.datasets import build_batch
    from mindgr.train.negatives import uniform_items
    rng = np.random.default_rng([seed, 5])
    inputs = [rng.integers(1, num_items + 1, n).astype(np.int32) for n in lengths]
    targets = [rng.integers(1, num_items + 1, n).astype(np.int32) for n in lengths]
    times = [(1_600_000_000 + np.cumsum(rng.integers(1, 5000, n))).astype(np.int64) for n in lengths]
    batch = build_batch(np.arange(len(lengths)), inputs, times, targets, token_capacity, row_capacity)
    negatives = uniform_items(rng, num_items, (token_capacity, num_negatives))
    drop = np.ones((drop_sites, token_capacity, drop_width), np.float32)
    return batch, negatives, drop


def step_inputs(batch, negatives, drop, scale: float):
    """Tensors in the order of the local-gradient cell (mindgr.parallel.dp.LocalGrads)."""
    from mindgr.train.step import StepInputs
    return tuple(StepInputs.from_batch(batch, negatives, drop, scale).tensors())


def grads_timer(local_grads, num_items: int, token_capacity: int, row_capacity: int, num_negatives: int,
                drop_sites: int, drop_width: int, seed: int = 0):
    """time_step(lengths) for calibrate(): seconds of one local forward + backward (no update)."""
    calls = [0]

    def time_step(lengths):
        calls[0] += 1
        args = step_inputs(*synthetic_batch(lengths, num_items, token_capacity, row_capacity, num_negatives,
                                            drop_sites, drop_width, seed * 1000 + calls[0]), 1.0)
        t0 = time.perf_counter()
        loss, _ = local_grads(*args)
        loss.asnumpy()
        return time.perf_counter() - t0
    return time_step


def calibrate(time_step, token_capacity: int, row_capacity: int, max_len: int, reps: int = 2) -> dict:
    """time_step(lengths) -> seconds of one local forward+backward on a batch of those lengths."""
    designs = probe_designs(token_capacity, row_capacity, max_len)
    t0 = time.perf_counter()
    time_step(designs["medium"])                      # compile (and warm caches) once
    names, rows, secs = [], [], []
    for name, lengths in designs.items():
        times = [time_step(lengths) for _ in range(max(1, reps))]
        names.append(name)
        rows.append(features(lengths))
        secs.append(float(np.median(times)))
    model, fixed, rel = fit(np.array(rows), np.array(secs))
    table = [{"design": n, "rows": int(r[1]), "tokens": int(r[2]), "seconds": s}
             for n, r, s in zip(names, rows, secs)]
    return {"model": model, "fixed_s": fixed, "rel_residual": rel, "probe": table,
            "probe_s": time.perf_counter() - t0}
