"""The fused LayerNorm kernels (mindgr/ops/cpu/layernorm.cc) against the reference composition.

layer_norm(x) and gated_layer_norm(u, y) = u * layer_norm(y) of the cpu backend are compared with
mindgr.ops.reference (the oracle: generic MindSpore ops and their autodiff gradients): forward and
every gradient (x; u and y) of sum(out * cot) for random cotangents, on rows whose D has a vector
tail (D % VL != 0, D < VL) or none, T = 0 and 1, rows far from zero mean, and constant rows (zero
variance). Tolerance: scale-relative RTOL (ops_fixtures). Also: results bitwise equal run to run and
for 1 and 2 threads (an input above the kernel's threading threshold), and one HSTUBlock forward +
backward (with a dropout mask) on the cpu backend against the reference backend (everything else in
the block, the jagged attention, also differs by summation order: 1e-4 of the scale). One shape runs
in GRAPH mode (the training path: custom ops with bprops inside a compiled Cell); the others, T = 0
and the block run in PyNative (same kernels and bprops, no compile per shape: test time).
"""

import numpy as np
import pytest

from ops_fixtures import RTOL, assert_close, needs_compiler, pynative  # noqa: F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from mindgr.ops import backend, cpu, reference  # noqa: E402


class NormLoss(nn.Cell):
    """sum(layer_norm(x) * c1) + sum(gated_layer_norm(u, y) * c2) for one backend's two functions."""

    def __init__(self, mod):
        super().__init__()
        self.ln, self.gated = mod.layer_norm, mod.gated_layer_norm

    def construct(self, x, u, y, c1, c2):
        a = self.ln(x, 1e-6)
        b = self.gated(u, y, 1e-6)
        return (a * c1).sum() + (b * c2).sum(), a, b


def run(mod, arrays):
    fn = ms.value_and_grad(NormLoss(mod), grad_position=(0, 1, 2), has_aux=True)
    (_, a, b), (dx, du, dy) = fn(*(Tensor(arrays[k]) for k in ("x", "u", "y", "c1", "c2")))
    return {"layer_norm": a, "gated": b, "dx": dx, "du": du, "dy": dy}


def inputs(rng, shape, shift=0.0, scale=1.0):
    arrays = {k: rng.standard_normal(shape).astype(np.float32) for k in ("x", "u", "y", "c1", "c2")}
    arrays["x"] = (arrays["x"] * scale + shift).astype(np.float32)
    arrays["y"] = (arrays["y"] * scale - shift).astype(np.float32)
    return arrays


# (shape, shift, scale): D with and without a tail of the vector width (4, 8 or 16 lanes), D < VL,
# a 3-D input, T = 1, and rows far from zero mean (mean 20, std 0.5: the float32 inputs themselves
# then carry ~1e-6 of the std, and the two sides round the mean differently: 1e-4 of the scale)
CASES = [((9, 16), 0.0, 1.0), ((5, 7), 0.0, 1.0), ((1, 33), 0.0, 1.0), ((6, 3, 20), 0.0, 1.0),
         ((40, 64), 20.0, 0.5), ((11, 3), 3.0, 5.0)]


def test_layer_norms_match_reference_graph():
    check_cases([((37, 50), 0.0, 1.0)])


@pynative
def test_layer_norms_match_reference_pynative():
    check_cases(CASES)


def check_cases(cases):
    rng = np.random.default_rng(0)
    for shape, shift, scale in cases:
        arrays = inputs(rng, shape, shift, scale)
        arrays["x"][0] = 2.5          # a constant row: zero variance, rstd = 1 / sqrt(eps)
        arrays["y"][-1] = -1.0
        got = {k: v.asnumpy() for k, v in run(cpu, arrays).items()}
        want = {k: v.asnumpy() for k, v in run(reference, arrays).items()}
        for k, w in want.items():
            assert_close(got[k], w, f"{shape} {k}", rtol=RTOL if shift == 0.0 else 1e-4)
        again = {k: v.asnumpy() for k, v in run(cpu, arrays).items()}
        for k in got:
            np.testing.assert_array_equal(again[k], got[k], err_msg=f"{shape} {k}: not reproducible")


@pynative
def test_empty_input_gives_empty_results():
    res = run(cpu, inputs(np.random.default_rng(1), (0, 50)))
    assert all(v.shape == (0, 50) for v in res.values())


@pynative
def test_thread_count_invariance(monkeypatch):
    rng = np.random.default_rng(2)
    arrays = inputs(rng, (43000, 50))   # 2.15M floats: above the kernel's one-thread threshold (128K)
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("MINDGR_CPU_THREADS", threads)
        results.append({k: v.asnumpy() for k, v in run(cpu, arrays).items()})
    for k in results[0]:
        np.testing.assert_array_equal(results[1][k], results[0][k], err_msg=k)


def test_cpu_backend_provides_the_fused_layer_norms():
    table = backend.provided("cpu")
    assert table["layer_norm"] is cpu.layer_norm and table["gated_layer_norm"] is cpu.gated_layer_norm
    assert backend.provided("reference")["layer_norm"] is reference.layer_norm


@pynative
def test_hstu_block_cpu_backend_matches_reference_backend():
    from mindgr.models.hstu import HSTUBlock
    rng = np.random.default_rng(3)
    t, d, h, dh, n = 96, 24, 2, 12, 16
    lengths = [0, 1, n, 5, 9, 16, 3, 11]
    offsets = Tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ts = Tensor((10 ** 9 + np.cumsum(rng.integers(0, 10 ** 4, t))).astype(np.int64))
    x = Tensor(rng.standard_normal((t, d)).astype(np.float32))
    cot = Tensor(rng.standard_normal((t, d)).astype(np.float32))
    mask = Tensor((rng.random((t, h * dh)) > 0.2).astype(np.float32) / 0.8)

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.b = HSTUBlock(np.random.default_rng(4), d, h, dh, dh, n, 16, True, "b")

        def construct(self, x, o, s, m, c):
            return (self.b(x, o, s, drop_mask=m) * c).sum()

    saved = backend.get_backend()
    got = {}
    try:
        for name in ("reference", "cpu"):
            backend.set_backend(name)
            cell = Loss()
            loss, (gx, gw) = ms.value_and_grad(cell, 0, cell.trainable_params())(x, offsets, ts, mask, cot)
            got[name] = [loss.asnumpy(), gx.asnumpy(), *(g.asnumpy() for g in gw)]
    finally:
        backend.set_backend(saved)
    for i, (a, b) in enumerate(zip(got["cpu"], got["reference"])):
        assert_close(a, b, f"block output {i}", rtol=1e-4)
