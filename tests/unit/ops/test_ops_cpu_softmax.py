"""SASRec's causal softmax attention: the C++ kernel (mindgr.ops.cpu.softmax_attention, online softmax over
blocks of keys) against the padded reference (mindgr.ops.reference.softmax_attention).

Forward and the gradients of q, k, v (value_and_grad of sum(out * cotangent), the same random cotangent on
both) on random jagged batches in GRAPH mode: empty rows, length-1 rows, rows of exactly N, log-normal
long tails, rows crossing the kernel's 64-key blocks, a non-empty unused token tail; several H, d, dv
(d != dv too); large score ranges (the online maximum must be tracked). The kernel must be bitwise
reproducible and give bitwise the same results for 1, 2 and 3 threads. Tolerance as in ops_fixtures
(2e-5 of each output's scale).
"""
import numpy as np
import pytest

from ops_fixtures import assert_close, needs_compiler  # noqa: F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from mindgr.ops import cpu, reference  # noqa: E402


def make_inputs(seed, rows, tokens, heads, d, dv, max_len, extra=(), spread=1.0):
    rng = np.random.default_rng(seed)
    fixed = [0, 1, max_len, *extra][:rows]
    rest = rng.lognormal(np.log(max(1.0, 0.25 * max_len)), 1.0, rows - len(fixed))
    lengths = np.array(fixed + [int(x) for x in np.clip(np.round(rest), 1, max_len)], np.int64)
    rng.shuffle(lengths)
    assert lengths.sum() < tokens, "pick a larger T"
    return lengths, dict(
        q=(rng.standard_normal((tokens, heads, d)) * spread).astype(np.float32),
        k=(rng.standard_normal((tokens, heads, d)) * spread).astype(np.float32),
        v=rng.standard_normal((tokens, heads, dv)).astype(np.float32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        cot=rng.standard_normal((tokens, heads, dv)).astype(np.float32))


class SoftmaxLoss(nn.Cell):
    def __init__(self, fn, max_len):
        super().__init__()
        self.fn, self.max_len = fn, max_len

    def construct(self, q, k, v, offsets, cot):
        out = self.fn(q, k, v, offsets, self.max_len)
        return (out * cot).sum(), out


def runner(fn, max_len):
    grad_fn = ms.value_and_grad(SoftmaxLoss(fn, max_len), grad_position=(0, 1, 2), has_aux=True)

    def run(a):
        (_, out), grads = grad_fn(*[ms.Tensor(a[n]) for n in ("q", "k", "v", "offsets", "cot")])
        return {"out": out.asnumpy(), **{n: g.asnumpy() for n, g in zip(("dq", "dk", "dv"), grads)}}

    return run


# (heads, d, dv, N, rows, tokens, extra fixed lengths, score spread)
CONFIGS = [
    (1, 8, 8, 8, 6, 49, (), 1.0),
    (2, 16, 12, 32, 9, 290, (2, 17), 1.0),
    (1, 64, 64, 20, 40, 704, (19, 2), 1.0),         # the Beauty SASRec shape: N 20, d 64
    (1, 50, 50, 200, 8, 1210, (64, 65, 129), 1.0),  # the ML-1M shape, rows across 64-key blocks
    (3, 7, 5, 70, 7, 491, (64, 65), 3.0),           # large scores: the running maximum moves
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "H{}-d{}-dv{}-N{}".format(*c[:4]))
def test_softmax_attention_matches_reference(config):
    heads, d, dv, max_len, rows, tokens, extra, spread = config
    run_cpu, run_ref = runner(cpu.softmax_attention, max_len), runner(reference.softmax_attention, max_len)
    for seed in (0, 1):
        lengths, a = make_inputs(seed, rows, tokens, heads, d, dv, max_len, extra, spread)
        got, want = run_cpu(a), run_ref(a)
        assert got["out"].shape == (tokens, heads, dv)
        for name in want:
            assert_close(got[name], want[name], f"seed {seed} {name}")
        tail = int(lengths.sum())
        for name in got:
            assert not np.any(got[name][tail:]), f"{name}: unused tail not zero"
        one = int(a["offsets"][list(lengths).index(1)])   # a length-1 row attends to itself only
        np.testing.assert_allclose(got["out"][one], a["v"][one], rtol=1e-6, atol=1e-6)
        again = run_cpu(a)
        for name in got:
            assert np.array_equal(got[name], again[name]), f"seed {seed}: {name} differs between two calls"


def test_softmax_attention_thread_count_invariance(monkeypatch):
    """Every output and gradient is bitwise the same for 1, 2 and 3 threads."""
    heads, d, dv, max_len, rows, tokens, extra, spread = CONFIGS[3]
    run_cpu = runner(cpu.softmax_attention, max_len)
    _, a = make_inputs(5, rows, tokens, 2, d, dv, max_len, extra, spread)
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        assert cpu.kernel_threads() == int(threads)
        results[threads] = run_cpu(a)
    for threads in ("2", "3"):
        for name, value in results["1"].items():
            assert np.array_equal(value, results[threads][name]), (threads, name)


def test_softmax_attention_rows_longer_than_n_and_all_empty():
    """Rows longer than N are cut to N like the reference (their later tokens give zeros); an all-empty
    batch gives zeros."""
    heads, d, dv, max_len, tokens = 2, 4, 6, 8, 40
    _, a = make_inputs(3, 5, tokens, heads, d, dv, max_len)
    a["offsets"] = np.concatenate([[0], np.cumsum([11, 0, 8, 3, 12])]).astype(np.int32)
    got = runner(cpu.softmax_attention, max_len)(a)
    want = runner(reference.softmax_attention, max_len)(a)
    for name in want:
        assert_close(got[name], want[name], f"L>N {name}")
    assert not np.any(got["out"][8:11]) and not np.any(got["dq"][8:11])
    a["offsets"] = np.zeros(6, np.int32)
    for name, value in runner(cpu.softmax_attention, max_len)(a).items():
        assert not np.any(value), name


def test_softmax_attention_pynative_int64_offsets():
    heads, d, dv, max_len, rows, tokens = 2, 5, 3, 16, 5, 60
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        _, a = make_inputs(7, rows, tokens, heads, d, dv, max_len)
        a["offsets"] = a["offsets"].astype(np.int64)
        got = runner(cpu.softmax_attention, max_len)(a)
        want = runner(reference.softmax_attention, max_len)(a)
        for name in want:
            assert_close(got[name], want[name], f"pynative {name}")
    finally:
        ms.set_context(mode=mode)


def test_sasrec_encoder_on_cpu_equals_the_reference_backend():
    """The whole SASRec encoder (the op as the model calls it): outputs and every parameter's gradient
    with the cpu backend against the reference backend, same seed and inputs, dropout masks on."""
    from mindgr.models.sasrec import SASRec
    from mindgr.ops.backend import get_backend, set_backend
    previous = get_backend()
    rng = np.random.default_rng(9)
    num_items, dim, max_len, tokens = 30, 16, 12, 40
    lengths = [12, 0, 1, 7, 5, 9]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(offsets[-1])
    ids = np.zeros(tokens, np.int32)
    ids[:total] = rng.integers(1, num_items + 1, total)
    positions = np.zeros(tokens, np.int32)
    positions[:total] = np.concatenate([np.arange(n) for n in lengths])
    cot = rng.standard_normal((tokens, dim)).astype(np.float32)
    results = {}
    try:
        for backend in ("reference", "cpu"):
            set_backend(backend)
            enc = SASRec(num_items, dim, num_blocks=2, num_heads=2, max_len=max_len, dropout=0.2, seed=4)
            masks = ((np.random.default_rng(2).random((enc.dropout_sites, tokens, enc.dropout_width)) >= 0.2)
                     / 0.8).astype(np.float32)

            class Loss(nn.Cell):
                def __init__(self):
                    super().__init__()
                    self.enc = enc

                def construct(self, i, p, o, t, d, c):
                    out = self.enc(i, p, o, t, d)
                    return (out * c).sum(), out

            fn = ms.value_and_grad(Loss(), grad_position=None, weights=enc.trainable_params(), has_aux=True)
            (_, out), grads = fn(*[ms.Tensor(a) for a in (ids, positions, offsets, np.zeros(tokens, np.int64),
                                                        masks, cot)])
            results[backend] = [out.asnumpy()[:total]] + [g.asnumpy() for g in grads]
    finally:
        set_backend(previous)
    for k, (want, got) in enumerate(zip(results["reference"], results["cpu"])):
        assert_close(got, want, f"output/grad {k}", rtol=1e-4)
