"""One block's value and gradients in one graph, for the block-vs-numpy tests of HSTU and FuXi-alpha."""
import mindspore as ms
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
