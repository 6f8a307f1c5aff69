"""The fused C++ sampled-scoring kernel (mindgr.ops.cpu.sampled_logits) against the reference.

logits[t, r] = out[t] . table[ids[t, r]]. Forward and both gradients (value_and_grad of
sum(logits * cotangent)) are compared in GRAPH mode inside an nn.Cell on random inputs with repeated
ids and id 0 present, for several (T, D, R, V+1) including D not a multiple of 16, D < 16, and a
catalogue large enough for the kernel's second d_table algorithm (counting sort instead of chunk partials).
Tolerance as in test_ops_cpu.py: max|cpu - reference| <= 2e-5 * max|reference| per tensor.
The kernel must be bitwise reproducible run to run and across thread counts.
Skipped only when no C++ compiler (g++) is available.
"""

import numpy as np
import pytest

from ops_fixtures import RTOL, assert_close, needs_compiler  # noqa: E402,F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

from mindgr.ops import backend, cpu, reference, scoring  # noqa: E402


class ScoreLoss(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, out, table, ids, cot):
        return (self.fn(out, table, ids) * cot).sum()


class ScoreGrad(nn.Cell):
    """(logits, d_out, d_table) in one graph."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.grad = ms.value_and_grad(ScoreLoss(fn), grad_position=(0, 1))

    def construct(self, out, table, ids, cot):
        _, (d_out, d_table) = self.grad(out, table, ids, cot)
        return self.fn(out, table, ids), d_out, d_table


def make_inputs(seed, T, D, R, V1, id_dtype=np.int32):
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((T, D)).astype(np.float32)
    table = rng.standard_normal((V1, D)).astype(np.float32)
    # a skewed id distribution: many repeats of a few ids, including 0, plus every id somewhere
    ids = np.minimum(rng.zipf(1.5, (T, R)) - 1, V1 - 1).astype(id_dtype)
    ids.flat[: min(V1, ids.size)] = np.arange(min(V1, ids.size))
    ids.flat[-1] = 0
    cot = rng.standard_normal((T, R)).astype(np.float32)
    return [ms.Tensor(x) for x in (out, table, ids, cot)]


CONFIGS = [  # T, D, R, V+1
    (1, 1, 1, 1),
    (7, 5, 3, 4),
    (40, 16, 9, 30),
    (97, 50, 33, 200),
    (64, 64, 128, 17),
    (50, 64, 20, 33000),  # a catalogue too large for the kernel's padded table copy
    (20, 130, 19, 50),    # D above the unrolled row widths (the kernel's run-time row loop on AVX-512)
    (1300, 50, 5, 300),   # several token blocks and id partitions in the backward
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "T%d_D%d_R%d_V%d" % c)
def test_sampled_logits_matches_reference_graph(config):
    fused, ref = ScoreGrad(cpu.sampled_logits), ScoreGrad(reference.sampled_logits)
    for seed in (0, 1):
        args = make_inputs(seed, *config)
        for name, got, want in zip(("logits", "d_out", "d_table"), fused(*args), ref(*args)):
            assert_close(got.asnumpy(), want.asnumpy(), f"{name} {config} seed {seed}")


def test_sampled_logits_int64_ids_and_pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        out, table, ids, cot = make_inputs(3, 23, 20, 7, 11, np.int64)
        assert_close(cpu.sampled_logits(out, table, ids).asnumpy(),
                     reference.sampled_logits(out, table, ids).asnumpy(), "pynative int64 logits")
        got = ms.grad(lambda o, t: (cpu.sampled_logits(o, t, ids) * cot).sum(), grad_position=(0, 1))(out, table)
        want = ms.grad(lambda o, t: (reference.sampled_logits(o, t, ids) * cot).sum(),
                       grad_position=(0, 1))(out, table)
        for name, g, w in zip(("d_out", "d_table"), got, want):
            assert_close(g.asnumpy(), w.asnumpy(), "pynative int64 " + name)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


@pytest.mark.parametrize("num_ids", [300, 33000], ids=["padded", "unpadded"])
def test_sampled_logits_bitwise_deterministic(monkeypatch, num_ids):
    # large enough for the kernel to use several threads (it goes serial below ~2^18 multiply-adds)
    args = make_inputs(5, 1100, 50, 32, num_ids)  # 2 token blocks
    net = ScoreGrad(cpu.sampled_logits)
    first = [x.asnumpy() for x in net(*args)]
    second = [x.asnumpy() for x in net(*args)]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # the bprop sums in an order fixed by the shapes, so the thread count does not change any bit
    prim = cpu._P.sampled_logits_bwd
    monkeypatch.setenv("MINDGR_CPU_THREADS", "1")
    one = [x.asnumpy() for x in prim(*args)]
    monkeypatch.setenv("MINDGR_CPU_THREADS", "2")
    two = [x.asnumpy() for x in prim(*args)]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_scoring_dispatch():
    args = make_inputs(7, 12, 8, 5, 9)[:3]
    previous = backend.get_backend()
    backend.set_backend("reference")
    want = scoring.sampled_logits(*args).asnumpy()
    np.testing.assert_array_equal(want, reference.sampled_logits(*args).asnumpy())
    backend.set_backend("cpu")
    try:
        assert_close(scoring.sampled_logits(*args).asnumpy(), want, "dispatched logits")
    finally:
        backend.set_backend(previous)


def test_sampled_logits_rejects_out_of_range_ids():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        out, table, ids, _ = make_inputs(9, 4, 3, 2, 5)
        bad = ms.Tensor(np.array([[0, 1], [2, 5], [0, 0], [1, 1]], np.int32))
        with pytest.raises(Exception, match="17"):
            cpu.sampled_logits(out, table, bad).asnumpy()
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


# ------------------------------------------------------------------------------------------------
# The loss tail fused with the scoring (cpu.sampled_lse) against the reference composition that
# models/losses.py uses on the reference backend: sampled_logits, accidental-hit mask, log-sum-exp
# with the positive logit. Compared: lse and the gradients w.r.t. x, table and pos of sum(lse * cot).

_MASKED = -1e9


def reference_lse(x, table, ids, tgt, pos):
    neg = reference.sampled_logits(x, table, ids)
    neg = ops.where(ops.equal(ids, tgt[:, None]), ops.full_like(neg, _MASKED), neg)
    lse = ops.logsumexp(ops.concat((pos[:, None], neg), 1), 1)
    return ops.where(tgt > 0, lse, ops.zeros_like(lse))


class LseGrad(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.grad = ms.value_and_grad(self.loss, grad_position=(0, 1, 4))

    def loss(self, x, table, ids, tgt, pos, cot):
        return (self.fn(x, table, ids, tgt, pos) * cot).sum()

    def construct(self, x, table, ids, tgt, pos, cot):
        _, (d_x, d_table, d_pos) = self.grad(x, table, ids, tgt, pos, cot)
        return self.fn(x, table, ids, tgt, pos), d_x, d_table, d_pos


def make_lse_inputs(seed, T, D, R, V1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, D)) * 0.7).astype(np.float32)
    table = rng.standard_normal((V1, D)).astype(np.float32)
    ids = rng.integers(0, V1, (T, R)).astype(np.int32)
    tgt = rng.integers(0, V1, T).astype(np.int32)
    tgt[::5] = 0                                      # tokens without a target
    hits = rng.random((T, R)) < 0.1                   # accidental hits
    ids[hits] = np.repeat(tgt[:, None], R, 1)[hits]
    if T > 3:
        tgt[3] = max(1, tgt[3])
        ids[3, :] = tgt[3]                            # every negative a hit: lse = pos
    pos = (x * table[tgt]).sum(1).astype(np.float32)
    cot = rng.standard_normal(T).astype(np.float32)
    return [ms.Tensor(a) for a in (x, table, ids, tgt, pos, cot)]


LSE_CONFIGS = [  # T, D, R, V+1
    (1, 3, 1, 2),
    (9, 5, 7, 6),
    (40, 50, 33, 61),
    (300, 64, 128, 400),   # threaded
    (50, 20, 17, 33000),   # no padded table copy (large catalogue)
]  # several token blocks / id partitions / groups: test_sampled_lse_backward_groups_and_threads


@pytest.mark.parametrize("config", LSE_CONFIGS, ids=lambda c: "T%d_D%d_R%d_V%d" % c)
def test_sampled_lse_matches_reference_graph(config):
    fused, ref = LseGrad(cpu.sampled_lse), LseGrad(reference_lse)
    for seed in (0, 1):
        args = make_lse_inputs(seed, *config)
        got = [g.asnumpy() for g in fused(*args)]
        for name, g, w in zip(("lse", "d_x", "d_table", "d_pos"), got, ref(*args)):
            assert_close(g, w.asnumpy(), f"{name} {config} seed {seed}")
        if config[0] > 3:
            np.testing.assert_allclose(got[0][3], args[4].asnumpy()[3], rtol=1e-6)  # all hits: lse = pos
        assert np.all(got[0][::5] == 0) and np.all(got[3][::5] == 0)  # no target: no loss, no gradient
        again = [g.asnumpy() for g in fused(*args)]
        for a, b in zip(got, again):
            np.testing.assert_array_equal(a, b)


def test_sampled_lse_thread_count_invariant(monkeypatch):
    x, table, ids, tgt, pos, cot = make_lse_inputs(4, 1400, 50, 64, 300)  # 3 token blocks, 5 id partitions
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        lse, probs, u = cpu._P.sampled_lse(x, table, ids, tgt, pos)
        runs.append([lse.asnumpy(), probs.asnumpy(), u.asnumpy()] +
                    [g.asnumpy() for g in cpu._P.sampled_lse_bwd(x, table, ids, tgt, pos, lse, probs, u, cot)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_sampled_softmax_loss_cpu_backend_matches_reference(monkeypatch):
    """models/losses.py on the cpu backend (fused tail) vs the reference backend: loss and gradients."""
    from mindgr.models.losses import SampledSoftmaxLoss
    from loss_fixtures import TinyEncoder
    rng = np.random.default_rng(11)
    V, D, T, R = 40, 8, 30, 17
    emb = rng.standard_normal((V + 1, D)).astype(np.float32)
    w = rng.standard_normal((D, D)).astype(np.float32)
    ids = rng.integers(1, V + 1, T).astype(np.int32)
    targets = rng.integers(0, V + 1, T).astype(np.int32)
    negatives = rng.integers(1, V + 1, (T, R)).astype(np.int32)
    negatives[:, 0] = np.maximum(targets, 1)  # accidental hits
    args = [ms.Tensor(a) for a in (ids, np.zeros(T, np.int32), np.array([0, T], np.int32), np.zeros(T, np.int64),
                                   np.zeros(1, np.int64), targets, negatives, np.ones((T, D), np.float32))]
    results = {}
    previous = backend.get_backend()
    try:
        for name in ("reference", "cpu"):
            backend.set_backend(name)   # read when the cell compiles
            loss = SampledSoftmaxLoss(TinyEncoder(emb, w), 0.05, score_all=False)
            value, grads = ms.value_and_grad(loss, None, loss.trainable_params())(*args)
            results[name] = [value.asnumpy()] + [g.asnumpy() for g in grads]
    finally:
        backend.set_backend(previous)
    for label, got, want in zip(("loss", "d_emb", "d_w"), results["cpu"], results["reference"]):
        assert_close(got, want, f"SampledSoftmaxLoss {label}")


# ------------------------------------------------------------------------------------------------
# Edges called straight through the library's AOT entry points (no MindSpore: empty tensors).

def _aot(name, arrays):
    import ctypes
    lib = ctypes.CDLL(cpu.library_path())
    n = len(arrays)
    shp = [(ctypes.c_int64 * max(1, a.ndim))(*a.shape) for a in arrays]
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    return fn(n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]), (ctypes.c_int * n)(*[a.ndim for a in arrays]),
              (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s_, ctypes.POINTER(ctypes.c_int64)) for s_ in shp]),
              (ctypes.c_char_p * n)(*[str(a.dtype).encode() for a in arrays]), None, None)


def _lse_np(x, table, ids, tgt, pos):
    l = np.einsum("td,trd->tr", x.astype(np.float64), table.astype(np.float64)[ids])
    l[ids == tgt[:, None]] = -np.inf
    m = np.maximum(pos, l.max(1, initial=-np.inf))
    lse = m + np.log(np.exp(pos - m) + np.exp(l - m[:, None]).sum(1))
    return np.where(tgt > 0, lse, 0.0)


def _probs_np(x, table, ids, tgt, pos):
    """The forward's second output: exp(l - lse) on kept pairs, 0 on hits and tokens without a target."""
    l = np.einsum("td,trd->tr", x.astype(np.float64), table.astype(np.float64)[ids])
    p = np.exp(l - _lse_np(x, table, ids, tgt, pos)[:, None])
    return np.where((ids != tgt[:, None]) & (tgt[:, None] > 0), p, 0.0)


@pytest.mark.parametrize("dtable", ["owners", "entries"])
@pytest.mark.parametrize("T,R", [(0, 5), (6, 0), (1, 1)], ids=["T0", "R0", "T1R1"])
def test_sampled_kernels_empty_and_single(T, R, dtable, monkeypatch):
    monkeypatch.setenv("MINDGR_CPU_DTABLE", dtable)
    rng = np.random.default_rng(2)
    D, V1 = 7, 5
    x = rng.standard_normal((T, D)).astype(np.float32)
    table = rng.standard_normal((V1, D)).astype(np.float32)
    ids = rng.integers(0, V1, (T, R)).astype(np.int32)
    tgt = (np.arange(T) % (V1 - 1) + 1).astype(np.int32)
    tgt[2::3] = 0                         # tokens without a target
    pos = rng.standard_normal(T).astype(np.float32)
    lse, probs, u = np.full(T, np.nan, np.float32), np.full((T, R), np.nan, np.float32), np.full((T, D), np.nan, np.float32)
    assert _aot("MindgrSampledLse", [x, table, ids, tgt, pos, lse, probs, u]) == 0
    np.testing.assert_allclose(lse, _lse_np(x, table, ids, tgt, pos), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(probs, _probs_np(x, table, ids, tgt, pos), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(u, np.einsum("tr,trd->td", _probs_np(x, table, ids, tgt, pos), table[ids]),
                               rtol=1e-5, atol=1e-6)
    dlse = rng.standard_normal(T).astype(np.float32)
    d_x, d_t, d_p = np.full((T, D), np.nan, np.float32), np.full((V1, D), np.nan, np.float32), np.full(T, np.nan, np.float32)
    assert _aot("MindgrSampledLseBwd", [x, table, ids, tgt, pos, lse, probs, u, dlse, d_x, d_t, d_p]) == 0
    assert not np.isnan(d_x).any() and not np.isnan(d_p).any()
    if R == 0:  # no negatives: lse = pos, all of the gradient goes to pos
        np.testing.assert_array_equal(d_x, 0)
        np.testing.assert_allclose(d_p, np.where(tgt > 0, dlse, 0), rtol=1e-6)
    if T == 0 or R == 0:
        np.testing.assert_array_equal(d_t, 0)
    logits = np.full((T, R), np.nan, np.float32)
    assert _aot("MindgrSampledLogits", [x, table, ids, logits]) == 0
    np.testing.assert_allclose(logits, np.einsum("td,trd->tr", x, table[ids]), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal((T, R)).astype(np.float32)
    d_x, d_t = np.full((T, D), np.nan, np.float32), np.full((V1, D), np.nan, np.float32)
    assert _aot("MindgrSampledLogitsBwd", [x, table, ids, g, d_x, d_t]) == 0
    np.testing.assert_allclose(d_x, np.einsum("tr,trd->td", g, table[ids]), rtol=1e-5, atol=1e-5)
    want = np.zeros((V1, D))
    np.add.at(want, ids.ravel(), (g[..., None] * x[:, None, :]).reshape(-1, D))
    np.testing.assert_allclose(d_t, want, rtol=1e-5, atol=1e-5)


def test_sampled_lse_int64_ids_bitwise_and_bad_ids():
    x, table, ids, tgt, pos, cot = [a.asnumpy() for a in make_lse_inputs(8, 70, 20, 19, 45)]
    outs = {}
    for dt in (np.int32, np.int64):
        lse, probs, u = np.empty(70, np.float32), np.empty((70, 19), np.float32), np.empty((70, 20), np.float32)
        assert _aot("MindgrSampledLse", [x, table, ids.astype(dt), tgt, pos, lse, probs, u]) == 0
        d = [np.empty((70, 20), np.float32), np.empty((45, 20), np.float32), np.empty(70, np.float32)]
        assert _aot("MindgrSampledLseBwd", [x, table, ids.astype(dt), tgt, pos, lse, probs, u, cot, *d]) == 0
        outs[dt] = [lse, probs, u] + d
    for a, b in zip(outs[np.int32], outs[np.int64]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(outs[np.int32][0], _lse_np(x, table, ids, tgt, pos), rtol=1e-5, atol=1e-5)
    for t, value in ((int(np.flatnonzero(tgt == 0)[0]), 45), (69, -1)):  # also on a token without a target
        bad = ids.copy()
        bad[t, -1] = value
        for dt in (np.int32, np.int64):
            lse, probs, u = np.empty(70, np.float32), np.zeros((70, 19), np.float32), np.zeros((70, 20), np.float32)
            assert _aot("MindgrSampledLse", [x, table, bad.astype(dt), tgt, pos, lse, probs, u]) == 17
            d = [np.empty((70, 20), np.float32), np.empty((45, 20), np.float32), np.empty(70, np.float32)]
            assert _aot("MindgrSampledLseBwd", [x, table, bad.astype(dt), tgt, pos, lse, probs, u, cot, *d]) == 17


def test_sampled_lse_backward_groups_and_threads(monkeypatch):
    """R large enough that the backward's groups of token blocks follow the thread count (one block
    per group on 1 thread, two on 2): same bits either way, and d_x / d_table against float64."""
    x, table, ids, tgt, pos, cot = [a.asnumpy() for a in make_lse_inputs(6, 1400, 50, 420, 300)]
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        lse, probs, u = np.empty(1400, np.float32), np.empty((1400, 420), np.float32), np.empty((1400, 50), np.float32)
        assert _aot("MindgrSampledLse", [x, table, ids, tgt, pos, lse, probs, u]) == 0
        d = [np.empty((1400, 50), np.float32), np.empty((300, 50), np.float32), np.empty(1400, np.float32)]
        assert _aot("MindgrSampledLseBwd", [x, table, ids, tgt, pos, lse, probs, u, cot, *d]) == 0
        runs.append([lse, probs, u] + d)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    l = np.einsum("td,trd->tr", x.astype(np.float64), table.astype(np.float64)[ids])
    w = np.where(ids == tgt[:, None], 0.0, np.exp(l - lse[:, None]) * cot[:, None]) * (tgt > 0)[:, None]
    want_dx = np.einsum("tr,trd->td", w, table.astype(np.float64)[ids])
    s = np.zeros((1400, 300))
    np.add.at(s, (np.repeat(np.arange(1400), 420), ids.ravel()), w.ravel())
    want_dt = s.T @ x.astype(np.float64)
    assert_close(runs[0][3], want_dx, "d_x")
    assert_close(runs[0][4], want_dt, "d_table")


@pytest.mark.parametrize("T,D,R,V1", [(700, 50, 64, 300), (333, 20, 37, 1200), (90, 3, 130, 7)])
def test_sampled_backward_d_table_passes_agree_bitwise(T, D, R, V1, monkeypatch):
    """The two d_table passes (owners: threads own id ranges and walk all pairs; entries: pairs bucketed
    by id partition) sum each row in the same (t, r) order: the same bits, for 1, 2 and 3 threads, for
    the loss tail and for the plain scoring's backward."""
    x, table, ids, tgt, pos, cot = [a.asnumpy() for a in make_lse_inputs(9, T, D, R, V1)]
    g = np.random.default_rng(3).standard_normal((T, R)).astype(np.float32)
    lse, probs, u = np.empty(T, np.float32), np.empty((T, R), np.float32), np.empty((T, D), np.float32)
    assert _aot("MindgrSampledLse", [x, table, ids, tgt, pos, lse, probs, u]) == 0
    np.testing.assert_allclose(probs, _probs_np(x, table, ids, tgt, pos), rtol=1e-5, atol=1e-7)
    runs = {}
    for dtable in ("owners", "entries"):
        for threads in ("1", "2", "3"):
            monkeypatch.setenv("MINDGR_CPU_DTABLE", dtable)
            monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
            d = [np.full((T, D), np.nan, np.float32), np.full((V1, D), np.nan, np.float32), np.full(T, np.nan, np.float32)]
            assert _aot("MindgrSampledLseBwd", [x, table, ids, tgt, pos, lse, probs, u, cot, *d]) == 0
            e = [np.full((T, D), np.nan, np.float32), np.full((V1, D), np.nan, np.float32)]
            assert _aot("MindgrSampledLogitsBwd", [x, table, ids, g, *e]) == 0
            runs[(dtable, threads)] = d + e
    first = runs[("owners", "1")]
    for key, got in runs.items():
        for a, b in zip(first, got):
            np.testing.assert_array_equal(a, b, err_msg=str(key))
    want = np.zeros((V1, D))
    np.add.at(want, ids.ravel(), (g[..., None] * x[:, None, :]).reshape(-1, D))
    assert_close(first[4], want, "logits d_table")
