"""The fused SiLU split (mindgr/ops/cpu/silu.cc) against the reference split(SiLU(x)), and the fused
L2 norm (layernorm.cc) against the reference's x / sqrt(sum(x^2) + eps^2).

silu_split(x, widths) of the cpu backend is compared with mindgr.ops.reference (generic SiLU and
Split and their autodiff gradients): every output and x's gradient of sum_k sum(out_k * c_k) for
random cotangents, on widths with and without a vector tail (4, 8 or 16 lanes), widths below VL, one
width, a 3-D input, T = 0 and 1, and large |x| (exp clamped, sigmoid saturated). Tolerance: scale-
relative RTOL (ops_fixtures). Also: bitwise reproducible and equal for 1 and 2 threads (an input above
the kernel's one-thread threshold). One case runs in GRAPH mode (the training path); the rest in
PyNative (no compile per shape: test time).
"""

import numpy as np
import pytest

from ops_fixtures import RTOL, assert_close, needs_compiler, pynative  # noqa: F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mindgr.ops import backend, cpu, reference  # noqa: E402


class SplitLoss(nn.Cell):
    def __init__(self, fn, widths):
        super().__init__()
        self.fn, self.widths = fn, tuple(widths)

    def construct(self, x, c):
        outs = self.fn(x, self.widths)
        loss = 0.0
        start = 0
        for o, w in zip(outs, self.widths):
            loss = loss + (o * c[..., start:start + w]).sum()
            start += w
        return loss, outs


def run(fn, x, c, widths):
    grad = ms.value_and_grad(SplitLoss(fn, widths), grad_position=0, has_aux=True)
    (_, outs), dx = grad(Tensor(x), Tensor(c))
    return [o.asnumpy() for o in outs] + [dx.asnumpy()]


def check(shape, widths, scale=3.0, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    c = rng.standard_normal(shape).astype(np.float32)
    if x.size:
        x.reshape(-1)[:4] = [100.0, -100.0, 0.0, -30.0]      # saturated, zero, far negative
    got, want = run(cpu.silu_split, x, c, widths), run(reference.silu_split, x, c, widths)
    assert len(got) == len(widths) + 1
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{shape} {widths} output {i}", rtol=RTOL)
    again = run(cpu.silu_split, x, c, widths)
    for i, (g, a) in enumerate(zip(got, again)):
        np.testing.assert_array_equal(a, g, err_msg=f"{shape} {widths} output {i}: not reproducible")


def test_silu_split_matches_reference_graph():
    check((37, 200), (50, 50, 50, 50))
    # and through the dispatch (mindgr.ops.norm, its width check included) inside a compiled graph
    from mindgr.ops import norm
    saved = backend.get_backend()
    try:
        backend.set_backend("cpu")
        x = np.random.default_rng(1).standard_normal((6, 20)).astype(np.float32)
        c = np.ones((6, 20), np.float32)
        got, want = run(norm.silu_split, x, c, (5, 15)), run(cpu.silu_split, x, c, (5, 15))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    finally:
        backend.set_backend(saved)


@pynative
def test_silu_split_matches_reference_pynative():
    for shape, widths in [((9, 64), (16, 16, 16, 16)), ((5, 23), (7, 7, 4, 5)), ((1, 40), (40,)),
                          ((4, 3, 34), (3, 31)), ((6, 10), (1, 1, 4, 4))]:
        check(shape, widths)


@pynative
def test_empty_input_gives_empty_results():
    outs = run(cpu.silu_split, np.zeros((0, 12), np.float32), np.zeros((0, 12), np.float32), (5, 7))
    assert [o.shape for o in outs] == [(0, 5), (0, 7), (0, 12)]


@pynative
def test_thread_count_invariance(monkeypatch):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((11000, 200)).astype(np.float32)   # 2.2M floats: above the 2M threshold
    c = rng.standard_normal((11000, 200)).astype(np.float32)
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        results.append(run(cpu.silu_split, x, c, (50, 50, 50, 50)))
    for i, (a, b) in enumerate(zip(*results)):
        np.testing.assert_array_equal(b, a, err_msg=f"output {i}")


def test_cpu_backend_provides_the_fused_silu_split():
    assert backend.provided("cpu")["silu_split"] is cpu.silu_split
    assert backend.provided("reference")["silu_split"] is reference.silu_split


class L2Loss(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x, c):
        y = self.fn(x, 1e-6)
        return (y * c).sum(), y


def run_l2(fn, x, c):
    (_, y), dx = ms.value_and_grad(L2Loss(fn), grad_position=0, has_aux=True)(Tensor(x), Tensor(c))
    return y.asnumpy(), dx.asnumpy()


@pynative
def test_l2_normalize_matches_reference():
    """The fused L2 norm (layernorm.cc) against the reference's composition: rows with and without a
    vector tail, a zero row (only eps: y = 0), a 3-D input, T = 0; forward and x's gradient."""
    rng = np.random.default_rng(5)
    for shape in [(37, 50), (5, 7), (1, 16), (4, 3, 33), (0, 50)]:
        x = (rng.standard_normal(shape) * 2.0).astype(np.float32)
        c = rng.standard_normal(shape).astype(np.float32)
        if x.size:
            x.reshape(-1, shape[-1])[0] = 0.0
        got, want = run_l2(cpu.l2_normalize, x, c), run_l2(reference.l2_normalize, x, c)
        for name, g, w in zip(("y", "dx"), got, want):
            assert_close(g, w, f"{shape} {name}", rtol=RTOL)
        again = run_l2(cpu.l2_normalize, x, c)
        for g, a in zip(got, again):
            np.testing.assert_array_equal(a, g)
    assert backend.provided("cpu")["l2_normalize"] is cpu.l2_normalize


@pynative
def test_silu_split_widths_must_cover_the_last_dimension():
    import pytest
    from mindgr.ops import norm
    with pytest.raises(ValueError, match="must sum to the last dimension 12"):
        norm.silu_split(Tensor(np.zeros((3, 12), np.float32)), (5, 5))


def test_linear_matches_matmul_and_its_gradients():
    """mindgr.ops.linear (MatMul with a transpose-flag bprop, no materialised x^T) against ops.matmul's
    autodiff, inside a compiled graph."""
    from mindspore import ops
    from mindgr.ops.linear import linear

    class Lin(nn.Cell):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def construct(self, x, w, c):
            return (self.fn(x, w) * c).sum()

    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((53, 20)).astype(np.float32), rng.standard_normal((20, 7)).astype(np.float32)
    c = rng.standard_normal((53, 7)).astype(np.float32)
    res = {}
    for name, fn in (("linear", linear), ("matmul", ops.matmul)):
        loss, (dx, dw) = ms.value_and_grad(Lin(fn), (0, 1))(Tensor(x), Tensor(w), Tensor(c))
        res[name] = [loss.asnumpy(), dx.asnumpy(), dw.asnumpy()]
    for i, (a, b) in enumerate(zip(res["linear"], res["matmul"])):
        assert_close(a, b, f"linear output {i}", rtol=RTOL)
