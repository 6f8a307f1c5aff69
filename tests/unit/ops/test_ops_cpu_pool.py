"""The fused, chunked shared-pool log-sum-exp kernel (mindgr.ops.cpu.shared_pool_lse) against the
materialised reference (mindgr.ops.reference.shared_pool_lse) (a short training run on it:
tests/system/ops/test_ops_cpu_pool_training.py).

lse[t] = log(exp(pos[t]) + sum_{k: ids[k] != 0, ids[k] != targets[t]} exp(x[t] . cand[k] - logq[k]))
for targets[t] > 0, else 0. Forward and the gradients to x, cand, logq and pos (value_and_grad of
sum(lse * cotangent)) are compared in GRAPH mode on random inputs: logits spread over [-20, 20] (unit
candidates, |x| = 1/tau) so the online max is exercised, K not a multiple of the chunk, K = 1, D not a
multiple of 16 and D > 64, an unused token tail and scattered tokens with target 0, many accidental hits
and id-0 slots, and tokens whose every candidate is masked.
Tolerance fp32: ops_fixtures.RTOL (2e-5 of each output's scale). FP16 candidates: the kernel widens
each fp16 value to fp32 exactly, so it must match the fp32 reference on the fp16-rounded candidates at
the same RTOL; against the reference's own fp16 path (which also rounds x and the products to fp16)
the lse must agree within 2e-2 absolute (logits up to 1/tau = 20, fp16 keeps ~3 digits: the bound
test_models_shared_loss.py uses for the loss).
The kernel must be bitwise reproducible run to run and across thread counts.
"""
import numpy as np
import pytest

from ops_fixtures import assert_close, needs_compiler  # noqa: E402,F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

from mindgr.ops import backend, cpu, reference, scoring  # noqa: E402

TAU = 0.05
NAMES = ("lse", "d_x", "d_cand", "d_logq", "d_pos")


class PoolLoss(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x, cand, logq, ids, targets, pos, cot):
        return (self.fn(x, cand, logq, ids, targets, pos) * cot).sum()


class PoolGrad(nn.Cell):
    """(lse, d_x, d_cand, d_logq, d_pos) in one graph."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.grad = ms.value_and_grad(PoolLoss(fn), grad_position=(0, 1, 2, 5))

    def construct(self, x, cand, logq, ids, targets, pos, cot):
        _, grads = self.grad(x, cand, logq, ids, targets, pos, cot)
        return (self.fn(x, cand, logq, ids, targets, pos),) + grads


def make_inputs(seed, T, D, K, num_ids=12):
    """Ids and targets from a small range (accidental hits everywhere, id 0 included); the last fifth of
    the tokens is an unused tail (target 0) and a few scattered tokens have target 0 too."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, D))
    x *= (1 / TAU) / np.linalg.norm(x, axis=1, keepdims=True)
    cand = rng.standard_normal((K, D))
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    logq = rng.normal(0.0, 2.0, K)
    ids = rng.integers(0, num_ids, K).astype(np.int32)
    targets = rng.integers(1, num_ids, T).astype(np.int32)
    targets[T - T // 5:] = 0
    targets[rng.random(T) < 0.1] = 0
    pos = rng.normal(0.0, 5.0, T)
    cot = rng.standard_normal(T)
    f32 = [a.astype(np.float32) for a in (x, cand, logq)]
    return f32[0], f32[1], f32[2], ids, targets, pos.astype(np.float32), cot.astype(np.float32)


def run(net, arrays):
    return [o.asnumpy() for o in net(*[ms.Tensor(a) for a in arrays])]


def compare(got, want, tag, rtol=None):
    for name, g, w in zip(NAMES, got, want):
        if rtol is None:
            assert_close(g, w, f"{tag} {name}")
        else:
            assert_close(g, w, f"{tag} {name}", rtol)


CONFIGS = [  # T, D, K (chunk = 32 KB / (4 D) rounded down to 32, within 32..512)
    (1, 1, 1),
    (6, 3, 1),
    (7, 5, 3),
    (40, 16, 31),
    (97, 50, 200),     # chunk 160: a full and a partial chunk
    (33, 64, 513),     # chunk 128: four full chunks and one candidate
    (50, 130, 700),    # D > 64: column groups of 4 + 4 + 1 vectors; chunk 32 -> 22 chunks, 8 slabs
    (300, 50, 2000),   # large enough for the threaded paths
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "T%d_D%d_K%d" % c)
def test_pool_lse_matches_reference(config):
    fused, ref = PoolGrad(cpu.shared_pool_lse), PoolGrad(reference.shared_pool_lse)
    for seed in (0, 1):
        arrays = make_inputs(seed, *config)
        got, want = run(fused, arrays), run(ref, arrays)
        compare(got, want, f"{config} seed {seed}")
        real = arrays[4] > 0
        assert not np.any(got[0][~real]) and not np.any(got[1][~real]) and not np.any(got[4][~real]), \
            "tokens with target 0 must have lse 0 and zero gradients"


def test_all_candidates_masked_gives_the_positive_alone():
    # K = 1: the one candidate is id 0 or each token's own target, so lse = pos and only d_pos flows
    x, cand, logq, _, _, pos, cot = make_inputs(3, 5, 8, 1)
    for cid, targets in ((0, np.array([1, 2, 3, 4, 5], np.int32)), (4, np.full(5, 4, np.int32))):
        arrays = (x, cand, logq, np.array([cid], np.int32), targets, pos, cot)
        got = run(PoolGrad(cpu.shared_pool_lse), arrays)
        np.testing.assert_allclose(got[0], pos, rtol=1e-6)
        np.testing.assert_allclose(got[4], cot, rtol=1e-6)
        assert not np.any(got[1]) and not np.any(got[2]) and not np.any(got[3])


def test_fp16_candidates():
    x, cand, logq, ids, targets, pos, cot = make_inputs(4, 60, 50, 300)
    half = cand.astype(np.float16)
    got = run(PoolGrad(cpu.shared_pool_lse), (x, half, logq, ids, targets, pos, cot))
    assert got[2].dtype == np.float16  # d_cand comes back in the candidates' dtype
    # exact widening: the fp32 math on the fp16-rounded candidates
    want = run(PoolGrad(reference.shared_pool_lse), (x, half.astype(np.float32), logq, ids, targets, pos, cot))
    compare(got[:2] + got[3:], want[:2] + want[3:], "fp16 vs fp32 on rounded candidates")
    assert_close(got[2], want[2], "fp16 d_cand", rtol=1e-3)  # d_cand itself rounded to fp16
    # the reference's fp16 path rounds x and the products too
    ref16 = run(PoolGrad(reference.shared_pool_lse), (x, half, logq, ids, targets, pos, cot))
    assert np.max(np.abs(got[0] - ref16[0])) <= 2e-2


def test_pool_lse_bitwise_deterministic(monkeypatch):
    arrays = make_inputs(5, 400, 50, 1500)
    net = PoolGrad(cpu.shared_pool_lse)
    first, second = run(net, arrays), run(net, arrays)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # tokens are independent in the forward and the backward adds fixed slabs in order: the thread
    # count changes no bit
    x, cand, logq, ids, targets, pos, cot = [ms.Tensor(a) for a in arrays]
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        lse = cpu._P.pool_lse(x, cand, logq, ids, targets, pos)
        grads = cpu._P.pool_lse_bwd(x, cand, logq, ids, targets, pos, lse, cot)
        results[threads] = [lse.asnumpy()] + [g.asnumpy() for g in grads]
    for threads in ("2", "3"):
        for a, b in zip(results["1"], results[threads]):
            np.testing.assert_array_equal(a, b)


def test_scoring_dispatch():
    arrays = [ms.Tensor(a) for a in make_inputs(7, 12, 8, 20)[:6]]
    previous = backend.get_backend()
    backend.set_backend("reference")
    want = scoring.shared_pool_lse(*arrays).asnumpy()
    np.testing.assert_array_equal(want, reference.shared_pool_lse(*arrays).asnumpy())
    backend.set_backend("cpu")
    try:
        assert_close(scoring.shared_pool_lse(*arrays).asnumpy(), want, "dispatched lse")
    finally:
        backend.set_backend(previous)
