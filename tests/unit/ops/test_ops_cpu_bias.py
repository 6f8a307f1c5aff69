"""FuXi-alpha's bias-only attention channels: the C++ kernel (mindgr.ops.cpu.bias_attention) against the
pure-MindSpore reference (mindgr.ops.reference.bias_attention).

Forward and every gradient (value_and_grad of sum(out * cotangent), same random cotangent on both) on
random jagged batches in GRAPH mode: empty rows, length-1 rows, rows of exactly N, log-normal long tails,
a non-empty unused token tail; several H and dv; with and without the temporal channel, whose last
position uses the row's request time (equal to the row's last timestamp or later). The kernel must
be bitwise reproducible and give bitwise the same results for 1, 2 and 3 threads (rows are summed in
row order, see bias_attention.cc). Tolerance as in ops_fixtures (2e-5 of each output's scale).
"""
import numpy as np
import pytest

from ops_fixtures import assert_close, needs_compiler  # noqa: F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from mindgr.ops import cpu, reference  # noqa: E402


def _near_edge(gaps):
    x = np.log(np.maximum(np.abs(gaps.astype(np.float64)), 1.0)) / 0.301
    return (np.abs(x - np.round(x)) < 2e-6 * x + 1e-6) & (np.round(x) >= 1)


def request_times_off_edges(ts, offsets, max_len, rng):
    """[B] int64: each row's last kept timestamp (about a third of the rows) or later by 1 s .. ~1e7 s,
    moved (later by a few seconds) until no gap to a key of its row lies on a bucket edge."""
    req = np.zeros(len(offsets) - 1, np.int64)
    for b in range(len(offsets) - 1):
        s, n = int(offsets[b]), min(int(offsets[b + 1] - offsets[b]), max_len)
        if n == 0:
            continue
        req[b] = ts[s + n - 1] + (int(np.exp(rng.uniform(0.0, 16.0))) if rng.random() < 0.67 else 0)
        while _near_edge(req[b] - ts[s:s + n]).any():
            req[b] += int(rng.integers(1, 7))
    return req


def avoid_bucket_edges(ts, offsets, max_len, rng):
    """Shift timestamps until no attended gap lies within float32 rounding of a bucket edge.

    The temporal weights are the raw w_ts[bucket] (no SiLU, no /N), so a gap the two implementations
    bucket differently shows up in full. MindSpore's float32 Log (the reference's) is a few ulp from
    glibc's logf (the kernel's), so gaps within ~1e-6 relative of an edge exp(0.301 k) may differ by
    one bucket (test_ops_cpu.py tests the kernel's buckets at every edge); keep the test data off them."""
    ts = ts.copy()
    for _ in range(1000):
        bad = None
        for b in range(len(offsets) - 1):
            s, n = int(offsets[b]), min(int(offsets[b + 1] - offsets[b]), max_len)
            t = ts[s:s + n].astype(np.float64)
            tq = np.concatenate([t[1:], t[-1:]])
            gap = np.maximum(np.abs(tq[:, None] - t[None, :]), 1.0)
            x = np.log(gap) / 0.301
            near = (np.abs(x - np.round(x)) < 2e-6 * x + 1e-6) & (np.round(x) >= 1)
            near &= np.tril(np.ones((n, n), bool))
            if near.any():
                bad = s + int(np.argwhere(near)[0][0])
                break
        if bad is None:
            return ts
        ts[bad + 1:] += int(rng.integers(1, 7))  # moves every gap across `bad`, keeps the order
    raise AssertionError("could not move the timestamps off the bucket edges")


def make_inputs(seed, rows, tokens, heads, dv, max_len, buckets, extra=()):
    rng = np.random.default_rng(seed)
    fixed = [0, 1, max_len, *extra][:rows]
    rest = rng.lognormal(np.log(max(1.0, 0.25 * max_len)), 1.0, rows - len(fixed))
    lengths = np.array(fixed + [int(x) for x in np.clip(np.round(rest), 1, max_len)], np.int64)
    rng.shuffle(lengths)
    assert lengths.sum() < tokens, "pick a larger T"
    steps = np.floor(np.exp(rng.uniform(0.0, 16.0, tokens))) * (rng.random(tokens) < 0.85)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    timestamps = avoid_bucket_edges((10**9 + np.cumsum(steps)).astype(np.int64), offsets, max_len, rng)
    return lengths, dict(
        request_times=request_times_off_edges(timestamps, offsets, max_len, rng),
        v=rng.standard_normal((tokens, heads, dv)).astype(np.float32),
        offsets=offsets,
        timestamps=timestamps,
        w_pos=(rng.standard_normal(2 * max_len - 1) * 0.5).astype(np.float32),
        w_ts=(rng.standard_normal(buckets + 1) * 0.5).astype(np.float32),
        cot=rng.standard_normal((tokens, heads, 2, dv)).astype(np.float32))


class BiasLoss(nn.Cell):
    def __init__(self, fn, max_len, with_ts, with_req=True):
        super().__init__()
        self.fn, self.max_len, self.with_ts, self.with_req = fn, max_len, with_ts, with_req

    def construct(self, v, offsets, timestamps, w_pos, w_ts, cot, request_times):
        if not self.with_req:
            request_times = None
        if self.with_ts:
            out = self.fn(v, offsets, timestamps, w_pos, w_ts, self.max_len, request_times)
        else:
            out = self.fn(v, offsets, timestamps, w_pos, None, self.max_len, request_times)
        return (out * cot[:, :, : out.shape[2]]).sum(), out


def runner(fn, max_len, with_ts, with_req=True):
    positions = (0, 3, 4) if with_ts else (0, 3)
    names = ("dv", "dw_pos", "dw_ts") if with_ts else ("dv", "dw_pos")
    grad_fn = ms.value_and_grad(BiasLoss(fn, max_len, with_ts, with_req), grad_position=positions, has_aux=True)

    def run(a):
        args = [ms.Tensor(a[n]) for n in ("v", "offsets", "timestamps", "w_pos", "w_ts", "cot", "request_times")]
        (_, out), grads = grad_fn(*args)
        return {"out": out.asnumpy(), **{n: g.asnumpy() for n, g in zip(names, grads)}}

    return run


# (heads, dv, N, rows, tokens, buckets or None, extra fixed lengths)
CONFIGS = [
    (1, 8, 8, 6, 49, 128, ()),
    (2, 16, 32, 9, 290, 20, (2, 17)),
    (2, 16, 32, 9, 290, None, (2, 31)),
    (4, 25, 200, 8, 1210, 128, (64, 65, 129)),
    (3, 7, 70, 7, 491, None, (64, 65)),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "H{}-dv{}-N{}-{}".format(
    c[0], c[1], c[2], "ts" if c[5] else "nots"))
def test_bias_attention_matches_reference(config):
    heads, dv, max_len, rows, tokens, buckets, extra = config
    with_ts = buckets is not None
    run_cpu, run_ref = runner(cpu.bias_attention, max_len, with_ts), runner(reference.bias_attention, max_len, with_ts)
    for seed in (0, 1):
        lengths, a = make_inputs(seed, rows, tokens, heads, dv, max_len, buckets or 8, extra)
        got, want = run_cpu(a), run_ref(a)
        assert got["out"].shape == (tokens, heads, 2 if with_ts else 1, dv)
        for name in want:
            assert_close(got[name], want[name], f"seed {seed} {name}")
        tail = int(lengths.sum())
        assert not np.any(got["out"][tail:]) and not np.any(got["dv"][tail:]), "unused tail not zero"
        assert np.any(got["dw_pos"]) and (not with_ts or np.any(got["dw_ts"]))
        again = run_cpu(a)
        for name in got:
            assert np.array_equal(got[name], again[name]), f"seed {seed}: {name} differs between two calls"


def test_bias_attention_thread_count_invariance(monkeypatch):
    """Every output, weight gradients included, is bitwise the same for 1, 2 and 3 threads."""
    heads, dv, max_len, rows, tokens, buckets, extra = CONFIGS[3]
    run_cpu = runner(cpu.bias_attention, max_len, True)
    _, a = make_inputs(5, rows, tokens, heads, dv, max_len, buckets, extra)
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        assert cpu.kernel_threads() == int(threads)
        results[threads] = run_cpu(a)
    for threads in ("2", "3"):
        for name, value in results["1"].items():
            assert np.array_equal(value, results[threads][name]), (threads, name)


def test_bias_attention_rows_longer_than_n_and_all_empty():
    """Rows longer than N are cut to N like the reference; an all-empty batch gives zeros."""
    heads, dv, max_len, tokens = 2, 4, 8, 40
    _, a = make_inputs(3, 5, tokens, heads, dv, max_len, 16)
    a["offsets"] = np.concatenate([[0], np.cumsum([11, 0, 8, 3, 12])]).astype(np.int32)
    a["request_times"] = request_times_off_edges(a["timestamps"], a["offsets"], max_len, np.random.default_rng(3))
    got = runner(cpu.bias_attention, max_len, True)(a)
    want = runner(reference.bias_attention, max_len, True)(a)
    for name in want:
        assert_close(got[name], want[name], f"L>N {name}")
    # request_times=None: the last kept position's own time (rows longer than N: position N - 1)
    starts = a["offsets"][:-1].astype(np.int64)
    own = a["timestamps"][np.clip(np.minimum(a["offsets"][1:], starts + max_len) - 1, 0, tokens - 1)]
    a["request_times"] = np.where(np.diff(a["offsets"]) > 0, own, 0).astype(np.int64)
    for fn in (cpu.bias_attention, reference.bias_attention):
        none, given = runner(fn, max_len, True, with_req=False)(a), runner(fn, max_len, True)(a)
        for name in none:
            assert np.array_equal(none[name], given[name]), (fn.__module__, name)
    a["offsets"] = np.zeros(6, np.int32)
    for name, value in runner(cpu.bias_attention, max_len, True)(a).items():
        assert not np.any(value), name


def test_bias_attention_pynative_int64_offsets():
    heads, dv, max_len, rows, tokens = 2, 5, 16, 5, 60
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        for with_ts in (True, False):
            _, a = make_inputs(7, rows, tokens, heads, dv, max_len, 128)
            a["offsets"] = a["offsets"].astype(np.int64)
            got = runner(cpu.bias_attention, max_len, with_ts)(a)
            want = runner(reference.bias_attention, max_len, with_ts)(a)
            for name in want:
                assert_close(got[name], want[name], f"pynative ts={with_ts} {name}")
    finally:
        ms.set_context(mode=mode)


def test_bias_attention_matches_loops():
    """Both implementations against the definition, written as plain loops (float64)."""
    heads, dv, max_len, rows, tokens, nb = 2, 3, 6, 4, 20, 12
    lengths, a = make_inputs(11, rows, tokens, heads, dv, max_len, nb)
    v, off, ts, wp, wt, req = (a[n] for n in ("v", "offsets", "timestamps", "w_pos", "w_ts", "request_times"))
    want = np.zeros((tokens, heads, 2, dv))
    for b in range(rows):
        s, n = int(off[b]), int(off[b + 1] - off[b])
        for i in range(n):
            tq = ts[s + i + 1] if i + 1 < n else req[b]   # the last position: the row's request time
            for j in range(i + 1):
                gap = max(abs(int(tq - ts[s + j])), 1)
                bucket = int(min(max(np.floor(np.log(gap) / 0.301), 0), nb))
                want[s + i, :, 0] += wp[max_len - 1 + j - i] * v[s + j]
                want[s + i, :, 1] += wt[bucket] * v[s + j]
    for fn in (cpu.bias_attention, reference.bias_attention):
        got = runner(fn, max_len, True)(a)["out"]
        assert_close(got, want, fn.__module__)


def test_time_bucket_table_equals_the_formula_at_every_edge():
    """The kernel's log-free bucket lookup equals its float32 formula clamp(floor(logf(gap) / 0.301f), 0, nb)
    on every integer gap within 3 of each bucket edge, on negative gaps and at the int64 extremes."""
    import ctypes
    lib = ctypes.CDLL(cpu.library_path())
    table, formula = lib.mindgr_bias_time_bucket, lib.mindgr_bias_time_bucket_formula
    for fn_ in (table, formula):
        fn_.argtypes, fn_.restype = (ctypes.c_int64, ctypes.c_int), ctypes.c_int
    for nb in (1, 16, 128):
        gaps = {0, 1, 2, 3, 2**62, 2**63 - 1}
        for k in range(1, min(nb, 140) + 1):
            edge = int(round(np.exp(0.301 * k)))
            gaps.update(g for g in range(edge - 3, edge + 4) if 0 <= g < 2**63)
        for g in sorted(gaps):
            for dt in (g, -g):
                assert table(dt, nb) == formula(dt, nb), (nb, dt)
        assert table(2**63 - 1, nb) == nb and table(0, nb) == 0
    assert [table(g, 128) for g in (1, 2, 3, 4, 5)] == [0, 2, 3, 4, 5]
