"""x [T, K] @ w [K, N] for 2-D operands, with a bprop written with MatMul's transpose flags:
dx = MatMul(transpose_b)(dout, w), dw = MatMul(transpose_a)(x, dout).

Why: in MindSpore 2.10 (CPU) the autodiff of `ops.matmul` materialises x^T for dw with a scalar
index-array Transpose (benchmarks/results/ops.md, "Per-part profile of the steady-state step": ~2 core-ms
per [13824, 50] operand, 4 per ML-1M step), where MatMul(transpose_a=True) reads x in place. Same math on
every backend (oneDNN sums dw in its own order either way).
"""
from mindspore import nn, ops

_MM = ops.MatMul()
_MM_TB = ops.MatMul(transpose_b=True)
_MM_TA = ops.MatMul(transpose_a=True)


class _Linear(nn.Cell):
    """Stateless: one shared instance serves every call site."""

    def construct(self, x, w):
        return _MM(x, w)

    def bprop(self, x, w, out, dout):
        return _MM_TB(dout, w), _MM_TA(x, dout)


_LINEAR = _Linear()


def linear(x, w):
    """x @ w for x [T, K], w [K, N] -> [T, N] (both 2-D)."""
    return _LINEAR(x, w)
