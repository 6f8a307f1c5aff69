"""Data-parallel step: same global-batch semantics as one process.

One process minimises the mean over all target tokens of the global batch, S / N. Rank r computes the
mean over its own targets, S_r / n_r; scaled by n_r / N it becomes S_r / N, so the SUM over ranks of the
scaled losses (and of their gradients) is exactly the single-process loss (and gradient). Gradients are
therefore summed (DistributedGradReducer with mean=False), not averaged, and every rank applies the
same update to the same weights.

Two graphs instead of one: LocalGrads (forward + backward, no communication) and ReduceApply
(all-reduce + optimizer). Timing LocalGrads alone gives each rank's own compute time, which is what the
load balancer is judged on; inside one graph a fast rank's time would include waiting for the slowest.
"""
import mindspore as ms
from mindspore import mutable, nn, ops
from mindspore.communication import GlobalComm


class ScaledLoss(nn.Cell):
    def __init__(self, loss_net):
        super().__init__()
        self.loss_net = loss_net

    def construct(self, ids, positions, offsets, timestamps, targets, negatives, drop, scale):
        return self.loss_net(ids, positions, offsets, timestamps, targets, negatives, drop) * scale


class LocalGrads(nn.Cell):
    """(scaled loss, gradients) of this rank's share of the global batch."""

    def __init__(self, loss_net, params):
        super().__init__()
        self.scaled = ScaledLoss(loss_net)
        self.grad_fn = ms.value_and_grad(self.scaled, None, params)

    def construct(self, ids, positions, offsets, timestamps, targets, negatives, drop, scale):
        return self.grad_fn(ids, positions, offsets, timestamps, targets, negatives, drop, scale)


class ReduceApply(nn.Cell):
    """Sum gradients and loss shares over all ranks, then one optimizer step; returns the global loss."""

    def __init__(self, optimizer, world: int):
        super().__init__()
        self.optimizer = optimizer
        self.reducer = nn.DistributedGradReducer(optimizer.parameters, mean=False, degree=world)
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, loss, grads):
        self.optimizer(self.reducer(grads))
        return self.allreduce(loss)


class DataParallelStep:
    """Holds the two graphs; `grads()` is timed per rank, `apply()` synchronises the ranks."""

    def __init__(self, loss_net, optimizer, world: int):
        self.local = LocalGrads(loss_net, optimizer.parameters)
        self.apply_cell = ReduceApply(optimizer, world)

    def grads(self, *inputs):
        loss, grads = self.local(*inputs)
        loss.asnumpy()                       # the host clock must see the work done
        return loss, grads

    def apply(self, loss, grads) -> float:
        # A plain tuple argument is a graph constant: every new one recompiles (~55 ms measured even for
        # a trivial graph); mutable() makes it an ordinary input.
        return float(self.apply_cell(loss.reshape((1,)), mutable(grads)).asnumpy()[0])
