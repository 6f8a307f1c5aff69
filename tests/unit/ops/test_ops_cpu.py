"""The C++ CPU kernels (mindgr.ops.cpu) against the pure-MindSpore reference (mindgr.ops.reference).

Every op is compared on random jagged batches: forward outputs and every gradient (value_and_grad
of sum(out * cotangent) with the same random cotangent on both backends), in GRAPH mode inside an
nn.Cell, plus PyNative checks. With the time bias every row gets a request time (the last position's
query time): equal to its last timestamp, or later by up to ~1e7 s; request_times=None (the last
position's own time) is checked separately. Batches mix empty rows, length-1 rows, rows of exactly N,
log-normal long-tailed lengths and a non-empty unused token tail; several seeds share one shape so
each configuration compiles once.

Tolerance (fp32): for every compared tensor, max|cpu - reference| <= RTOL * max|reference| with
RTOL = 2e-5, i.e. relative to the scale of that output (the kernels and the reference sum in
different orders; observed errors are ~1e-6 of the scale). Integer-valued results (time buckets,
jagged copies) must be exactly equal, and the kernels must be bitwise reproducible run to run.

Skipped, with the reason, only when no C++ compiler (g++) is available.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from ops_fixtures import RTOL, assert_close, needs_compiler  # noqa: E402,F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from mindgr.ops import cpu, reference  # noqa: E402
from mindgr.ops.cpu import build as cpu_build  # noqa: E402


# ------------------------------------------------------------------------------------------------
# Random jagged batches.

def make_lengths(rng, num_rows, max_len, num_tokens, extra=()):
    """Row lengths: 0, 1 and N always present (plus `extra`), the rest log-normal with median N/4
    clipped to [1, N]; shuffled; the total leaves a non-empty unused tail of the T tokens."""
    fixed = [0, 1, max_len, *extra][:num_rows]
    rest = rng.lognormal(np.log(max(1.0, 0.25 * max_len)), 1.0, num_rows - len(fixed))
    lengths = np.array(fixed + [int(x) for x in np.clip(np.round(rest), 1, max_len)], np.int64)
    rng.shuffle(lengths)
    assert lengths.sum() < num_tokens, "pick a larger T for this configuration"
    return lengths


def offsets_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def make_timestamps(rng, num_tokens):
    """Non-decreasing times with gaps from 0 to ~1e7 (many equal neighbours, buckets 0..~70)."""
    steps = np.floor(np.exp(rng.uniform(0.0, 16.0, num_tokens))) * (rng.random(num_tokens) < 0.85)
    return (10**9 + np.cumsum(steps)).astype(np.int64)


def make_request_times(rng, offsets, timestamps, max_len):
    """[B] int64 per row: its last kept timestamp (about a third of the rows) or later by 1 s .. ~1e7 s
    (0 for empty rows)."""
    starts, ends = offsets[:-1].astype(np.int64), offsets[1:].astype(np.int64)
    last = timestamps[np.clip(np.minimum(ends, starts + max_len) - 1, 0, len(timestamps) - 1)]
    later = np.floor(np.exp(rng.uniform(0.0, 16.0, len(last)))).astype(np.int64)
    req = last + later * (rng.random(len(last)) < 0.67)
    return np.where(ends > starts, req, 0).astype(np.int64)


def attention_inputs(seed, num_rows, num_tokens, heads, dqk, dv, max_len, num_buckets, extra=()):
    rng = np.random.default_rng(seed)
    lengths = make_lengths(rng, num_rows, max_len, num_tokens, extra)
    t = num_tokens
    qk_scale = dqk ** -0.25  # q.k ~ N(0, 1)
    arrays = dict(
        q=(rng.standard_normal((t, heads, dqk)) * qk_scale).astype(np.float32),
        k=(rng.standard_normal((t, heads, dqk)) * qk_scale).astype(np.float32),
        v=rng.standard_normal((t, heads, dv)).astype(np.float32),
        offsets=offsets_of(lengths),
        timestamps=make_timestamps(rng, t),
        w_pos=(rng.standard_normal(2 * max_len - 1) * 0.5).astype(np.float32),
        w_ts=(rng.standard_normal(num_buckets + 1) * 0.5).astype(np.float32),
        cot=rng.standard_normal((t, heads, dv)).astype(np.float32),
    )
    arrays["request_times"] = make_request_times(rng, arrays["offsets"], arrays["timestamps"], max_len)
    return lengths, arrays


class AttentionLoss(nn.Cell):
    """(sum(out * cot), out) for one backend; time bias on or off; request times given or None."""

    def __init__(self, fn, max_len, with_ts, with_req=True):
        super().__init__()
        self.fn = fn
        self.max_len = max_len
        self.with_ts = with_ts
        self.with_req = with_req

    def construct(self, q, k, v, offsets, timestamps, w_pos, w_ts, cot, request_times):
        req = request_times if self.with_req else None
        if self.with_ts:
            out = self.fn(q, k, v, offsets, timestamps, w_pos, w_ts, self.max_len, req)
        else:
            out = self.fn(q, k, v, offsets, timestamps, w_pos, None, self.max_len, req)
        return (out * cot).sum(), out


GRAD_NAMES = ("dq", "dk", "dv", "dw_pos", "dw_ts")


def attention_runner(fn, max_len, with_ts, with_req=True):
    positions = (0, 1, 2, 5, 6) if with_ts else (0, 1, 2, 5)
    grad_fn = ms.value_and_grad(AttentionLoss(fn, max_len, with_ts, with_req), grad_position=positions,
                                has_aux=True)

    def run(a):
        args = [ms.Tensor(a[n]) for n in ("q", "k", "v", "offsets", "timestamps", "w_pos", "w_ts", "cot",
                                          "request_times")]
        (_, out), grads = grad_fn(*args)
        return {"out": out.asnumpy(), **{n: g.asnumpy() for n, g in zip(GRAD_NAMES, grads)}}

    return run


def compare_attention(cpu_res, ref_res, lengths, num_tokens, tag):
    for name, want in ref_res.items():
        assert_close(cpu_res[name], want, f"{tag} {name}")
    tail = int(lengths.sum())
    assert tail < num_tokens
    for name in ("out", "dq", "dk", "dv"):
        assert not np.any(cpu_res[name][tail:]), f"{tag}: {name} not zero in the unused tail"


# (heads, dqk, dv, N, rows, tokens T, buckets or None for no time bias, extra fixed lengths)
CONFIGS = [
    (1, 8, 8, 8, 6, 49, 128, ()),
    (2, 16, 32, 32, 9, 290, 20, (2, 17)),
    (2, 16, 32, 32, 9, 290, None, (2, 31)),
    (4, 32, 16, 200, 8, 1210, 128, (64, 65, 129)),
    (4, 64, 64, 70, 7, 491, None, (64, 65)),
    (2, 24, 40, 130, 4, 521, 40, (128,)),
    (1, 144, 136, 16, 4, 40, 128, ()),  # head dims above 128: column-blocked updates
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "H{}-dqk{}-dv{}-N{}-{}".format(
    c[0], c[1], c[2], c[3], "ts" if c[6] else "nots"))
def test_attention_matches_reference_graph(config):
    heads, dqk, dv, max_len, rows, tokens, buckets, extra = config
    with_ts = buckets is not None
    run_cpu = attention_runner(cpu.hstu_attention, max_len, with_ts)
    run_ref = attention_runner(reference.hstu_attention, max_len, with_ts)
    for seed in (0, 1, 2):
        lengths, a = attention_inputs(seed, rows, tokens, heads, dqk, dv, max_len, buckets or 8, extra)
        got = run_cpu(a)
        compare_attention(got, run_ref(a), lengths, tokens, f"seed {seed}")
        if not with_ts:
            assert got["dq"].shape == a["q"].shape and "dw_ts" not in got
        again = run_cpu(a)
        for name in got:
            assert np.array_equal(got[name], again[name]), f"seed {seed}: {name} differs between two calls"


def test_attention_rows_without_time_data_match_reference(monkeypatch):
    """Rows whose times and request time are all equal (ML-1M's users without time data: all 0) take the
    kernels' one-bucket path; mixed with timed rows they match the reference, bitwise run to run and for
    1 and 2 threads (dw_ts sums both kinds of rows)."""
    heads, dqk, dv, max_len, rows, tokens, buckets, extra = CONFIGS[3]
    run_cpu = attention_runner(cpu.hstu_attention, max_len, True)
    run_ref = attention_runner(reference.hstu_attention, max_len, True)
    for seed in (0, 1):
        lengths, a = attention_inputs(seed, rows, tokens, heads, dqk, dv, max_len, buckets, extra)
        ts, req, off = a["timestamps"].copy(), a["request_times"].copy(), a["offsets"]
        for b in range(seed, rows, 2):
            ts[off[b]:off[b + 1]] = 0 if seed == 0 else 12345
            req[b] = 0 if seed == 0 else 12345
        a = dict(a, timestamps=ts, request_times=req)
        got = run_cpu(a)
        compare_attention(got, run_ref(a), lengths, tokens, f"seed {seed}")
        assert np.array_equal(got["dw_ts"], run_cpu(a)["dw_ts"])
    monkeypatch.setenv("MINDGR_CPU_THREADS", "1")
    one = run_cpu(a)
    for name in got:
        assert np.array_equal(one[name], got[name]), name


def test_attention_rows_out_of_time_order_match_reference(monkeypatch):
    """The kernels give a vector of keys one bucket when its first and last gap share it only in rows whose
    keys are in time order with the request time after them (there the gaps fall along the keys). Rows
    out of order (keys shuffled) and rows whose request time precedes their keys take the per-lane path;
    mixed with ordered rows they match the reference, bitwise run to run and for 1 and 2 threads."""
    heads, dqk, dv, max_len, rows, tokens, buckets, extra = CONFIGS[3]
    run_cpu = attention_runner(cpu.hstu_attention, max_len, True)
    run_ref = attention_runner(reference.hstu_attention, max_len, True)
    for seed in (0, 1):
        rng = np.random.default_rng(100 + seed)
        lengths, a = attention_inputs(seed, rows, tokens, heads, dqk, dv, max_len, buckets, extra)
        ts, req, off = a["timestamps"].copy(), a["request_times"].copy(), a["offsets"]
        for b in range(seed, rows, 3):
            ts[off[b]:off[b + 1]] = rng.permutation(ts[off[b]:off[b + 1]])
        for b in range(seed + 1, rows, 3):
            if lengths[b] > 0:
                req[b] = ts[off[b]] - 1000
        a = dict(a, timestamps=ts, request_times=req)
        got = run_cpu(a)
        compare_attention(got, run_ref(a), lengths, tokens, f"seed {seed}")
        again = run_cpu(a)
        for name in got:
            assert np.array_equal(got[name], again[name]), name
    monkeypatch.setenv("MINDGR_CPU_THREADS", "1")
    one = run_cpu(a)
    for name in got:
        assert np.array_equal(one[name], got[name]), name


def test_time_bucket_never_falls_as_the_gap_grows():
    """The kernels' one-bucket-per-vector shortcut rests on this: every gap 0..2^17, then geometric steps
    and each bucket edge +-2 up to 2^31, for both bucket counts the tests use."""
    edges = np.exp(np.arange(0, 80) * reference.TIME_BUCKET_DIV)
    edges = np.floor(edges[edges < 2.0**31 - 3])
    gaps = np.unique(np.concatenate([np.arange(0, 2**17), np.geomspace(2**17, 2**31 - 1, 20000).astype(np.int64),
                                     (edges[:, None] + np.arange(-2, 3)[None, :]).ravel()])).astype(np.int64)
    for num_buckets in (128, 20, 40):
        got = np.array([cpu.time_bucket(int(g), num_buckets) for g in gaps])
        assert (np.diff(got) >= 0).all(), gaps[1:][np.diff(got) < 0][:5]


def test_request_times_none_is_the_last_positions_own_time():
    """request_times=None equals request times = each row's last kept timestamp, on both backends (rows
    longer than N included: their last kept position is N - 1); and a later request time changes only
    the outputs of the rows' last positions, forward (the gradients are covered above)."""
    heads, dqk, dv, max_len, tokens = 2, 8, 8, 8, 40
    lengths = np.array([11, 0, 8, 3, 1, 12], np.int64)
    _, a = attention_inputs(4, 6, tokens, heads, dqk, dv, max_len, 128)
    a["offsets"] = offsets_of(lengths)
    starts = a["offsets"][:-1].astype(np.int64)
    own = a["timestamps"][np.clip(np.minimum(a["offsets"][1:], starts + max_len) - 1, 0, tokens - 1)]
    a["request_times"] = np.where(lengths > 0, own, 0).astype(np.int64)
    last = np.minimum(lengths, max_len) + starts - 1
    for fn in (cpu.hstu_attention, reference.hstu_attention):
        none = attention_runner(fn, max_len, True, with_req=False)(a)
        given = attention_runner(fn, max_len, True)(a)
        for name in none:
            assert np.array_equal(none[name], given[name]), (fn.__module__, name)
        later = dict(a, request_times=a["request_times"] + 10 ** 6)
        moved = attention_runner(fn, max_len, True)(later)["out"]
        changed = np.flatnonzero(np.abs(moved - given["out"]).reshape(tokens, -1).max(1) > 0)
        assert set(changed) <= set(last[lengths > 0].tolist()) and len(changed) > 0, (fn.__module__, changed)


def test_attention_thread_count_invariance(monkeypatch):
    """Every output and gradient (dw_pos and dw_ts too) is bitwise the same for 1, 2 and 3 threads."""
    heads, dqk, dv, max_len, rows, tokens, buckets, extra = CONFIGS[3]
    run_cpu = attention_runner(cpu.hstu_attention, max_len, True)
    _, a = attention_inputs(5, rows, tokens, heads, dqk, dv, max_len, buckets, extra)
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        assert cpu.kernel_threads() == int(threads)
        results[threads] = run_cpu(a)
    for threads in ("2", "3"):
        for name in ("out", "dq", "dk", "dv", "dw_pos", "dw_ts"):
            assert np.array_equal(results["1"][name], results[threads][name]), (threads, name)


def test_attention_many_rows_and_time_spans_beyond_int32(monkeypatch):
    """Enough rows that the forward takes whole rows as work items (the configs above have too few);
    rows whose times span 2^31 s or more (every other row here) take the exact scalar time-bucket
    path, the others the vectorised one; equal to the reference, and bitwise the same for 1 and 2
    threads.  The vectorised bucket table is exact for these bucket counts."""
    cpu.library_path()
    for nb in (128, 20):
        assert cpu._loaded["cdll"].mindgr_time_bucket_cells_ok(nb) == 1
    heads, dqk, dv, max_len, rows, tokens, buckets = 2, 24, 40, 70, 20, 1000, 128  # >= 8 rows per thread

    def draw(seed):
        rng = np.random.default_rng(seed)
        lengths, a = attention_inputs(seed, rows, tokens, heads, dqk, dv, max_len, buckets, extra=(64, 65, 69))
        off = a["offsets"].astype(np.int64)
        jump = np.zeros(tokens, np.int64)
        for b in range(1, rows, 2):
            jump[off[b]:off[b + 1]] = np.arange(off[b + 1] - off[b]) * 2**28
        a["timestamps"] = a["timestamps"] + jump
        a["request_times"] = make_request_times(rng, a["offsets"], a["timestamps"], max_len)
        return lengths, off, a

    def near_boundary(lengths, off, a):
        """Pairs whose gap is within 1e-5 bucket of a boundary: there the reference's ~3 ulp SIMD Log
        decides (test_time_buckets_at_every_boundary), not the gap alone."""
        ts, req = a["timestamps"], a["request_times"]
        for b, L in enumerate(np.minimum(lengths, max_len)):
            t = ts[off[b]:off[b] + L]
            tq = np.append(t[1:], req[b])
            x = np.log(np.maximum(np.abs(tq[:, None] - t[None, :]), 1).astype(np.float32).astype(np.float64)) / 0.301
            close = (np.abs(x - np.round(x)) < 1e-5) & (x > 0.5)  # log(1) = 0 is exact everywhere
            if close[np.tril(np.ones((L, L), bool))].any():
                return True
        return False

    seed = next(s for s in range(11, 60) if not near_boundary(*draw(s)))
    lengths, off, a = draw(seed)
    assert (np.diff(a["timestamps"][off[1]:off[2]]) > 0).all() and lengths[1::2].max() > 9  # spans > 2^31
    run_cpu = attention_runner(cpu.hstu_attention, max_len, True)
    monkeypatch.setenv("MINDGR_CPU_THREADS", "2")
    got = run_cpu(a)
    compare_attention(got, attention_runner(reference.hstu_attention, max_len, True)(a), lengths, tokens,
                      "many rows, wide time spans")
    monkeypatch.setenv("MINDGR_CPU_THREADS", "1")
    one = run_cpu(a)
    for name in got:
        assert np.array_equal(got[name], one[name]), name


def test_attention_rows_longer_than_n_are_cut_like_reference():
    """Not a supported input (rows are <= N), but the kernels then agree with the reference."""
    heads, dqk, dv, max_len, tokens = 2, 8, 8, 8, 40
    rng = np.random.default_rng(3)
    lengths = np.array([11, 0, 8, 3, 12], np.int64)
    _, a = attention_inputs(3, 5, tokens, heads, dqk, dv, max_len, 128)
    a["offsets"] = offsets_of(lengths)
    a["cot"] = rng.standard_normal(a["cot"].shape).astype(np.float32)
    got = attention_runner(cpu.hstu_attention, max_len, True)(a)
    compare_attention(got, attention_runner(reference.hstu_attention, max_len, True)(a), lengths, tokens, "L>N")


def test_attention_pynative():
    """PyNative (eager) execution, int64 offsets, with and without time bias, incl. an all-empty batch."""
    heads, dqk, dv, max_len, rows, tokens = 2, 16, 16, 16, 5, 60
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        for with_ts in (True, False):
            lengths, a = attention_inputs(7, rows, tokens, heads, dqk, dv, max_len, 128)
            a["offsets"] = a["offsets"].astype(np.int64)
            got = attention_runner(cpu.hstu_attention, max_len, with_ts)(a)
            compare_attention(got, attention_runner(reference.hstu_attention, max_len, with_ts)(a),
                              lengths, tokens, f"pynative ts={with_ts}")
        a["offsets"] = np.zeros(rows + 1, np.int32)  # every row empty: all zeros, no error
        got = attention_runner(cpu.hstu_attention, max_len, True)(a)
        for name, value in got.items():
            assert not np.any(value), name
    finally:
        ms.set_context(mode=mode)


def test_time_buckets_at_every_boundary():
    """The kernels' table-driven bucket equals the float32 formula exactly (all integer gaps within 2
    of each bucket boundary, negative gaps, clamping), equals reference.time_buckets except for gaps
    within ~1e-6 of a boundary, and there differs from exact math by at most one bucket.

    Why not exact equality with the reference near boundaries: MindSpore's CPU Log is a ~3 ulp SIMD
    approximation on full vectors and std::log on the remainder, so the reference's bucket for such a
    gap depends on the gap's position in the tensor; the kernels' depends on the gap alone.
    """
    rng = np.random.default_rng(0)
    for num_buckets in (128, 20):
        edges = np.exp(np.arange(0, num_buckets + 3) * reference.TIME_BUCKET_DIV)
        edges = edges[edges < 2.0**62]
        gaps = np.unique((np.floor(edges)[:, None] + np.arange(-2, 3)[None, :]).ravel())
        gaps = gaps[gaps >= 0].astype(np.int64)
        gaps = np.concatenate([gaps, -gaps, rng.integers(0, 2**40, 300), [0, 1, 2, 2**62]]).astype(np.int64)
        got = np.array([cpu.time_bucket(int(g), num_buckets) for g in gaps])
        formula = np.array([cpu.time_bucket(int(g), num_buckets, formula=True) for g in gaps])
        assert np.array_equal(got, formula)
        log_gap = np.log(np.maximum(np.abs(gaps), 1).astype(np.float64))
        exact = log_gap / 0.301
        # within ~8 float32 ulps of a boundary (in log space): where float32 rounding decides
        near = np.abs(exact - np.round(exact)) * 0.301 < 1e-6 * np.maximum(log_gap, 1.0)
        math = np.clip(np.floor(exact), 0, num_buckets).astype(np.int64)
        assert np.array_equal(got[~near], math[~near])
        assert np.all(np.abs(got[near] - math[near]) <= 1)
        want = reference.time_buckets(ms.Tensor(gaps), num_buckets).asnumpy()
        assert np.array_equal(got[~near], want[~near])
        assert (~near).sum() > 400  # the comparisons above are not vacuous


# ------------------------------------------------------------------------------------------------
# Jagged <-> padded.

class ToPaddedLoss(nn.Cell):
    def __init__(self, fn, max_len):
        super().__init__()
        self.fn = fn
        self.max_len = max_len

    def construct(self, values, offsets, cot):
        out = self.fn(values, offsets, self.max_len)
        return (out * cot).sum(), out


class ToJaggedLoss(nn.Cell):
    def __init__(self, fn, num_tokens):
        super().__init__()
        self.fn = fn
        self.num_tokens = num_tokens

    def construct(self, padded, offsets, cot):
        out = self.fn(padded, offsets, self.num_tokens)
        return (out * cot).sum(), out


def run_conversion(cell, x, offsets, cot):
    (_, out), grad = ms.value_and_grad(cell, grad_position=0, has_aux=True)(
        ms.Tensor(x), ms.Tensor(offsets), ms.Tensor(cot))
    return out.asnumpy(), grad.asnumpy()


@pytest.mark.parametrize("feature_shape", [(3,), (2, 5)], ids=["F3", "F2x5"])
def test_jagged_conversions_match_reference(feature_shape):
    max_len, tokens = 8, 50
    lengths = np.array([3, 0, 8, 1, 10, 5], np.int64)  # includes an empty row and a row > N
    offsets = offsets_of(lengths)
    rows = len(lengths)
    to_padded = {f: ToPaddedLoss(f, max_len) for f in (cpu.jagged_to_padded, reference.jagged_to_padded)}
    to_jagged = {f: ToJaggedLoss(f, tokens) for f in (cpu.padded_to_jagged, reference.padded_to_jagged)}
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        values = rng.standard_normal((tokens, *feature_shape)).astype(np.float32)
        cot_p = rng.standard_normal((rows, max_len, *feature_shape)).astype(np.float32)
        got = run_conversion(to_padded[cpu.jagged_to_padded], values, offsets, cot_p)
        want = run_conversion(to_padded[reference.jagged_to_padded], values, offsets, cot_p)
        for g, w in zip(got, want):  # copies and their transposes: exact
            assert np.array_equal(g, w)

        padded = rng.standard_normal((rows, max_len, *feature_shape)).astype(np.float32)
        cot_j = rng.standard_normal((tokens, *feature_shape)).astype(np.float32)
        got = run_conversion(to_jagged[cpu.padded_to_jagged], padded, offsets, cot_j)
        want = run_conversion(to_jagged[reference.padded_to_jagged], padded, offsets, cot_j)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)


def test_jagged_conversions_pynative_and_integer_values():
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        lengths = np.array([2, 0, 4, 4], np.int64)
        offsets = ms.Tensor(offsets_of(lengths))
        ts = ms.Tensor(np.arange(100, 113, dtype=np.int64))
        got = cpu.jagged_to_padded(ts, offsets, 4).asnumpy()
        assert got.dtype == np.int64
        assert np.array_equal(got, reference.jagged_to_padded(ts, offsets, 4).asnumpy())
        back = cpu.padded_to_jagged(ms.Tensor(got), offsets, 13).asnumpy()
        assert np.array_equal(back, np.where(np.arange(13) < 10, np.arange(100, 113), 0))
        x = ms.Tensor(np.random.default_rng(0).standard_normal((13, 3)).astype(np.float32))
        grad = ms.grad(lambda v: (cpu.jagged_to_padded(v, offsets, 4) ** 2).sum())(x).asnumpy()
        assert np.allclose(grad, np.where(np.arange(13)[:, None] < 10, 2 * x.asnumpy(), 0.0))
    finally:
        ms.set_context(mode=mode)


# ------------------------------------------------------------------------------------------------
# Build.

def test_build_is_cached_and_loadable():
    path = cpu_build.build()
    assert path == cpu.library_path() == cpu_build.library_path()
    mtime = os.path.getmtime(path)
    assert cpu_build.build() == path and os.path.getmtime(path) == mtime  # no rebuild
    assert os.path.basename(path).startswith(cpu_build.LIB_PREFIX)
    assert cpu.kernel_threads() >= 1


def test_missing_compiler_names_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "mindgr-no-such-compiler")
    monkeypatch.setenv("MINDGR_CPU_BUILD_DIR", str(tmp_path))
    with pytest.raises(cpu_build.BuildError) as err:
        cpu_build.build()
    assert "not found" in str(err.value) and "ops.backend: reference" in str(err.value)


def test_concurrent_builds_are_safe(tmp_path):
    """Two processes building into an empty cache at once both succeed with the same library and
    leave no temporary files. The "compiler" is a stand-in that waits, then copies the real library
    (the real compile is exercised by every other test); the waiting makes the builds overlap."""
    fake = tmp_path / "fake-g++"
    fake.write_text('#!/bin/sh\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
                    'sleep 1\ncp "$MINDGR_TEST_REAL_LIB" "$out"\n')
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(os.environ, MINDGR_CPU_BUILD_DIR=str(cache), CXX=str(fake), MINDGR_TEST_REAL_LIB=cpu.library_path())
    code = "from mindgr.ops.cpu.build import build; import ctypes; p = build(); ctypes.CDLL(p); print(p)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1 and os.path.dirname(paths.pop()) == str(cache)
    assert not [n for n in os.listdir(cache) if n.startswith(".tmp_")]
    assert os.path.exists(cache / ".gitignore")


def test_a_failing_source_is_a_build_error_naming_it(monkeypatch, tmp_path):
    """The sources compile in parallel: the one that fails is named with the compiler's output, and no
    library or temporary file is left behind."""
    fake = tmp_path / "fake-g++"
    fake.write_text('#!/bin/sh\ncase "$*" in *sampled_logits.cc*) echo "sampled_logits.cc:1: error: boom"; exit 1;; esac\n'
                    'out=""\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n: > "$out"\n')
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("MINDGR_CPU_BUILD_DIR", str(cache))
    with pytest.raises(cpu_build.BuildError) as err:
        cpu_build.build()
    text = str(err.value)
    assert "compiling the C++ kernels failed" in text and "sampled_logits.cc:1: error: boom" in text
    assert "ops.backend: reference" in text
    assert [n for n in os.listdir(cache) if n != ".gitignore"] == []
