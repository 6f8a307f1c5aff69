"""One block's value and gradients in one graph, for the block-vs-numpy tests of HSTU and FuXi-alpha, and
the check of gradients against central differences of a float64 numpy oracle."""
import mindspore as ms
import numpy as np
from mindspore import nn


class BlockLoss(nn.Cell):
    """f = sum(block(x) * c): its gradient w.r.t. the block's output is c."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def construct(self, x, offsets, timestamps, c):
        y = self.block(x, offsets, timestamps)
        return (y * c).sum(), y


class BlockGrad(nn.Cell):
    """((f, y), (dx, (dw for each trainable parameter))) in one graph."""

    def __init__(self, block):
        super().__init__()
        self.loss = BlockLoss(block)
        self.weights = block.trainable_params()
        self.fn = ms.value_and_grad(self.loss, grad_position=0, weights=self.weights, has_aux=True)

    def construct(self, x, offsets, timestamps, c):
        return self.fn(x, offsets, timestamps, c)


def check_directional_grads(objective, p: dict, grads: dict, rng, directions: int = 1, eps: float = 1e-5,
                            context=()):
    """Each gradient grads[name] against the oracle: along `directions` random directions d, g . d equals
    the central difference (objective(p + eps d) - objective(p - eps d)) / 2 eps of the float64 objective."""
    for name, g in grads.items():
        for _ in range(directions):
            d = rng.standard_normal(g.shape)
            plus, minus = dict(p), dict(p)
            plus[name], minus[name] = p[name] + eps * d, p[name] - eps * d
            fd = (objective(plus) - objective(minus)) / (2 * eps)
            an = float((g.astype(np.float64) * d).sum())
            assert abs(an - fd) <= 3e-4 * float(np.abs(g * d).sum()) + 1e-6, (name, *context, an, fd)
