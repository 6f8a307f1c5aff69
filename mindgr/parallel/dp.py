"""Data-parallel step: same global-batch semantics as one process.

One process minimises the mean over all target tokens of the global batch, S / N. Rank r computes the
mean over its own targets, S_r / n_r; scaled by n_r / N it becomes S_r / N, so the SUM over ranks of the
scaled losses (and of their gradients) is exactly the single-process loss (and gradient). Gradients are
therefore summed (DistributedGradReducer with mean=False), not averaged, and every rank applies the
same update to the same weights.

Two graphs or one (parallel.fused_step). Two (the default): LocalGrads (forward + backward, no
communication), then ReduceApply (all-reduce + optimizer); timing LocalGrads alone gives each rank's own
wall compute time. One (FusedStep): the same two cells inside one graph, as the single-process TrainStep
and MindSpore's TrainOneStepCell: the form in which the framework may start a bucket's AllReduce while
the backward still runs (on Ascend; not verified here). On CPU with mccl it measured level with two
graphs (benchmarks/results/distributed.md). A rank's wall time then includes waiting for the slowest,
so its own compute is measured in CPU time (a rank waiting in a collective burns none).

Three ways to sum (parallel.grad_reduce; auto = host when every rank is on one CPU host, else mindspore;
own beside the sharded item table):
  own        the gradients and the loss go over the wire as ONE flat buffer (FlatSum): one collective per
             step instead of one per parameter, written when the reducer below issued one AllReduce per
             parameter (measured on mccl, 2 ranks, 240k floats in 28 tensors: 28 AllReduces 21 ms wall /
             9-12 ms CPU, one AllReduce of the same floats 5.7 ms / 3.3 ms);
  mindspore  MindSpore's DATA_PARALLEL reducer, nn.DistributedGradReducer, whose per-parameter AllReduces
             MindSpore's graph compiler fuses by their `fusion` attribute into parallel.grad_buckets
             buckets (the auto-parallel context's all_reduce_fusion_config); the loss rides in the last
             bucket. The same sums: bit-identical with 2 ranks (one float32 addition per element), equal up
             to summation order with more.
"""
import numpy as np

import mindspore as ms
from mindspore import mutable, nn, ops
from mindspore.communication import GlobalComm


class ScaledLoss(nn.Cell):
    def __init__(self, loss_net):
        super().__init__()
        self.loss_net = loss_net

    def construct(self, *inputs):
        # StepInputs.as_tuple() with the rank's loss weight last
        return self.loss_net(*inputs[:-1]) * inputs[-1]


class LocalGrads(nn.Cell):
    """(scaled loss, gradients) of this rank's share of the global batch."""

    def __init__(self, loss_net, params):
        super().__init__()
        self.scaled = ScaledLoss(loss_net)
        self.grad_fn = ms.value_and_grad(self.scaled, None, params)

    def construct(self, *inputs):
        return self.grad_fn(*inputs)


def flat_bounds(shapes) -> tuple:
    """(lo, hi) of each tensor of `shapes`, in order, in one flat vector."""
    sizes = [int(np.prod(s)) for s in shapes]
    return tuple(zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()))


class FlatSplit(nn.Cell):
    """One flat vector cut back into tensors of `shapes` (the inverse of concatenating them flattened)."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.bounds = flat_bounds(self.shapes)

    def construct(self, flat):
        out = ()
        for k in range(len(self.shapes)):
            lo, hi = self.bounds[k]
            out = out + (flat[lo:hi].reshape(self.shapes[k]),)
        return out


class FlatSum(nn.Cell):
    """Sum a tuple of float32 tensors (the gradients, then the loss) over all ranks with one AllReduce:
    flatten and concatenate, reduce, cut back into the original shapes. Exact: the same sums as one
    AllReduce per tensor."""

    def __init__(self, shapes):
        super().__init__()
        self.split = FlatSplit(shapes)
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, tensors):
        flat = ops.concat([t.reshape(-1) for t in tensors])
        return self.split(self.allreduce(flat))


def _float32_params(optimizer, who: str):
    params = optimizer.parameters
    if any(p.dtype != ms.float32 for p in params):
        raise TypeError(f"{who}: the flat gradient sum expects float32 parameters, got "
                        f"{sorted({str(p.dtype) for p in params})}")
    return params


class ReduceApply(nn.Cell):
    """Sum gradients and loss shares over all ranks (one flat AllReduce), then one optimizer step;
    returns the global loss."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer
        params = _float32_params(optimizer, "ReduceApply")
        self.flat_sum = FlatSum([p.shape for p in params] + [(1,)])

    def construct(self, loss, grads):
        summed = self.flat_sum(grads + (loss,))
        self.optimizer(summed[:-1])
        return summed[-1]


class FlatApply(nn.Cell):
    """One optimizer step from one flat float32 vector, the gradients already summed over the ranks then the
    global loss (the host sum's output); returns the loss."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer
        params = _float32_params(optimizer, "FlatApply")
        self.split = FlatSplit([p.shape for p in params] + [(1,)])
        self.size = self.split.bounds[-1][1]          # the gradients' floats, then the loss

    def construct(self, flat):
        summed = self.split(flat)
        self.optimizer(summed[:-1])
        return summed[-1]


def reduce_mode(p, one_cpu_host: bool = False) -> str:
    """parallel.grad_reduce resolved for the config's ParallelConfig `p`: auto = the flat sum beside the
    sharded item table (parallel.sparse); else the shared-memory host sum when every rank runs on one x86-64
    CPU host (`one_cpu_host`: measured faster than both collectives there, docs/distributed.md); else
    MindSpore's reducer."""
    if p.grad_reduce != "auto":
        return p.grad_reduce
    if p.sparse != "none":
        return "own"
    return "host" if one_cpu_host else "mindspore"


def bucket_splits(sizes, buckets: int) -> list[int]:
    """all_reduce_fusion_config for `buckets` contiguous buckets of about equal element counts over tensors
    of `sizes` (in order): the index of the last tensor of every bucket but the last (MindSpore starts a
    new fusion id after each listed index). Fewer buckets when there are fewer tensors; [] = one bucket."""
    sizes = np.asarray(sizes, np.float64)
    k = min(int(buckets), len(sizes))
    if k <= 1:
        return []
    ends = np.cumsum(sizes)
    splits = []
    for j in range(1, k):
        i = int(np.searchsorted(ends, ends[-1] * j / k))      # first tensor reaching the j-th share
        lo = splits[-1] + 1 if splits else 0
        i = min(max(i, lo), len(sizes) - 1 - (k - j))          # every bucket keeps at least one tensor
        splits.append(i)
    return splits


def _set_fusion_splits(splits: list[int]):
    """all_reduce_fusion_config = splits in the auto-parallel context; [] clears an earlier one (MindSpore
    refuses an empty list, so the context is reset and its mode, device count and gradients_mean put back)."""
    if list(ms.get_auto_parallel_context("all_reduce_fusion_config")) == list(splits):
        return
    if splits:
        ms.set_auto_parallel_context(all_reduce_fusion_config=list(splits))
        return
    keep = {k: ms.get_auto_parallel_context(k) for k in ("parallel_mode", "device_num", "gradients_mean")}
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(**keep)


class MindSporeReduceApply(nn.Cell):
    """ReduceApply on MindSpore's own data-parallel reducer (nn.DistributedGradReducer under the
    DATA_PARALLEL context that mindgr.parallel.context.use_data_parallel_mode set): the gradients and the
    loss summed (gradients_mean False), then one optimizer step; returns the global loss.

    buckets: 0 = one unfused AllReduce per tensor (fusion id 0); 1 = one fusion bucket; k > 1 = k buckets
    of about equal size (all_reduce_fusion_config, set here just before the reducer reads it).
    """

    def __init__(self, optimizer, buckets: int = 1):
        super().__init__()
        self.optimizer = optimizer
        params = list(optimizer.parameters)
        # The loss joins the last bucket: this slot only lends the reducer a parameter's attributes
        # (its fusion id, no layerwise split); it is never read or updated.
        self.loss_slot = ms.Parameter(ms.Tensor(np.zeros((1,), np.float32)), name="dp_loss_slot",
                                      requires_grad=False)
        self.splits = bucket_splits([p.size for p in params] + [1], buckets) if buckets > 1 else []
        _set_fusion_splits(self.splits)
        self.reducer = nn.DistributedGradReducer(params + [self.loss_slot], mean=False,
                                                 fusion_type=0 if buckets == 0 else 1)

    def construct(self, loss, grads):
        summed = self.reducer(grads + (loss,))
        self.optimizer(summed[:-1])
        return summed[-1]


class FusedStep(nn.Cell):
    """LocalGrads then a ReduceApply cell in one graph: the data-parallel TrainStep. Returns the global loss."""

    def __init__(self, local, apply_cell):
        super().__init__()
        self.local = local
        self.apply_cell = apply_cell

    def construct(self, *inputs):
        loss, grads = self.local(*inputs)
        return self.apply_cell(loss.reshape((1,)), grads)


class Ballot:
    """One float every rank adds to the host sum's vector beside its gradients: `vote` is this rank's for the
    next sum, `total` the sum over the ranks of the last one. The ranks' stop agreement rides on it
    (mindgr.parallel.executor._AgreedStop) instead of a collective of its own."""

    def __init__(self):
        self.vote, self.total = 0.0, 0.0


def host_sum_op(host_sum, ballot: Ballot):
    """A graph op (a MindSpore pyfunc Custom op, run on the host inside the graph) that puts a flat float32
    vector and the ballot's vote into this rank's slot of `host_sum` and returns the vector's sum over the
    ranks (the votes' sum goes to ballot.total)."""
    def add_over_ranks(flat):
        slot = host_sum.slot()
        slot[:-1] = flat
        slot[-1] = ballot.vote
        summed = host_sum.sum()
        ballot.total = float(summed[-1])
        return summed[:-1]
    return ops.Custom(add_over_ranks, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc")


class FusedHostStep(nn.Cell):
    """The one-graph step with the shared-memory sum: gradients, flattened with the loss, summed over the
    ranks by host_sum_op inside the graph, then FlatApply. Returns the global loss."""

    def __init__(self, local, apply_cell, host_sum, ballot: Ballot):
        super().__init__()
        self.local = local
        self.apply_cell = apply_cell
        self.add_over_ranks = host_sum_op(host_sum, ballot)

    def construct(self, *inputs):
        loss, grads = self.local(*inputs)
        flat = ops.concat([g.reshape(-1) for g in grads] + [loss.reshape(1)])
        return self.apply_cell(self.add_over_ranks(flat)).reshape((1,))


class DataParallelStep:
    """Holds the graphs: `grads()` then `apply()` (two graphs, the first timed per rank), or `step()` (one).
    reduce: "own" (FlatSum), "mindspore" (MindSporeReduceApply with `buckets`) or "host" (the gradients, the
    loss and a Ballot's vote summed by `host_sum`, a mindgr.parallel.host_sum.HostSum, between the two graphs
    or inside the one; then FlatApply). The
    fused graph shares the two cells' parameters, so a run may use either at any step (the calibration times
    `local`)."""

    def __init__(self, loss_net, optimizer, reduce: str = "own", buckets: int = 1, fused: bool = False,
                 host_sum=None):
        self.local = LocalGrads(loss_net, optimizer.parameters)
        self.reduce = reduce
        self.host_sum = host_sum
        self.ballot = Ballot() if reduce == "host" else None
        if reduce == "host":
            if host_sum is None:
                raise ValueError("DataParallelStep: reduce='host' needs host_sum")
            self.apply_cell = FlatApply(optimizer)
            if host_sum.n != self.apply_cell.size + 1:
                raise ValueError(f"DataParallelStep: host_sum holds {host_sum.n} floats, the gradients, the "
                                 f"loss and the vote {self.apply_cell.size + 1}")
            self.bounds = self.apply_cell.split.bounds[:-1]      # each gradient's place; the loss follows
        else:
            self.apply_cell = (MindSporeReduceApply(optimizer, buckets) if reduce == "mindspore"
                               else ReduceApply(optimizer))
        if not fused:
            self.fused = None
        elif reduce == "host":
            self.fused = FusedHostStep(self.local, self.apply_cell, host_sum, self.ballot)
        else:
            self.fused = FusedStep(self.local, self.apply_cell)

    def step(self, *inputs) -> float:
        """One fused graph: gradients, their sum over the ranks, the update; the global loss."""
        return float(self.fused(*inputs).asnumpy()[0])

    def grads(self, *inputs):
        loss, grads = self.local(*inputs)
        loss.asnumpy()                       # the host clock must see the work done
        return loss, grads

    def apply(self, loss, grads) -> float:
        if self.reduce == "host":
            slot = self.host_sum.slot()
            for g, (lo, hi) in zip(grads, self.bounds):
                slot[lo:hi] = g.asnumpy().reshape(-1)
            slot[-2] = loss.asnumpy().reshape(-1)[0]
            slot[-1] = self.ballot.vote
            summed = self.host_sum.sum()
            self.ballot.total = float(summed[-1])
            return float(self.apply_cell(ms.Tensor(summed[:-1])).asnumpy()[0])
        # A plain tuple argument is a graph constant: every new one recompiles (~55 ms measured even for
        # a trivial graph); mutable() makes it an ordinary input.
        return float(self.apply_cell(loss.reshape((1,)), mutable(grads)).asnumpy()[0])
