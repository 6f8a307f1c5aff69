"""The compiled step of the sharded layout: the item rows come in as an input, their gradient goes out.

The host gathers the rows of the step's distinct ids (padded to the fixed capacity U_cap, slot 0 always
item 0 = padding) and remaps every id of the batch to its slot; the graph computes the same loss as
SampledSoftmaxLoss with `rows` in place of the whole table. The gradient with respect to `rows` is
exactly the nonzero part of the replicated table's gradient (l2 normalisation is per row, and every use
of the table is a gather), so a sharded step computes what the data-parallel step computes.
With loss.negatives=shared_pool (RowsPoolLoss) the pool's ids are among the step's distinct ids like any
other and the loss is SharedNegativesLoss's on those slots (remapping keeps id 0 at slot 0 and equal ids
equal, so the padding and accidental-hit masks are unchanged).
Dense gradients are summed over all ranks synchronously, as in mindgr.parallel.dp.
"""
import mindspore as ms
from mindspore import nn, ops

from mindgr.models.layers import l2_normalize, last_positions
from mindgr.models.losses import sampled_softmax_mean, shared_negatives_mean


class RowsLoss(nn.Cell):
    """Sampled softmax (per-token negatives) on gathered rows; ids, targets, negatives are slots of rows."""

    def __init__(self, encoder, temperature: float, score_all: bool):
        super().__init__()
        self.encoder = encoder
        self.inv_tau = 1.0 / temperature
        self.score_all = score_all

    def construct(self, rows, ids, positions, offsets, timestamps, request_times, targets, negatives, drop, scale):
        out = self.encoder.encode(ops.gather(rows, ids, 0), positions, offsets, timestamps, drop, request_times)
        table = l2_normalize(rows)                                           # [U_cap, D]
        return sampled_softmax_mean(out, table, targets, negatives, self.inv_tau, self.score_all) * scale


class RowsPoolLoss(nn.Cell):
    """The shared-pool sampled softmax (SharedNegativesLoss) on gathered rows: ids, targets and the pool's
    ids are slots of rows; pool_logq is the sampler's correction of each pool entry."""

    def __init__(self, encoder, temperature: float, fp16: bool):
        super().__init__()
        self.encoder = encoder
        self.inv_tau = 1.0 / temperature
        self.fp16 = fp16

    def construct(self, rows, ids, positions, offsets, timestamps, request_times, targets, pool, pool_logq, drop,
                  scale):
        out = self.encoder.encode(ops.gather(rows, ids, 0), positions, offsets, timestamps, drop, request_times)
        table = l2_normalize(rows)                                           # [U_cap, D]
        return shared_negatives_mean(out, table, targets, pool, pool_logq, self.inv_tau, self.fp16) * scale


class RowsGrads(nn.Cell):
    """(scaled loss, (gradient of rows, gradients of the dense parameters))."""

    def __init__(self, loss_net, dense_params):
        super().__init__()
        self.grad_fn = ms.value_and_grad(loss_net, 0, dense_params)

    def construct(self, rows, *inputs):
        return self.grad_fn(rows, *inputs)


class DenseState(nn.Cell):
    """What the dense checkpoint holds: the encoder (item table excluded by the caller) and its optimizer."""

    def __init__(self, encoder, optimizer):
        super().__init__()
        self.encoder = encoder
        self.optimizer = optimizer


class EncodeRows(nn.Cell):
    """The user embedding (output at each row's last token, no dropout) from gathered item rows."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def construct(self, rows, ids, positions, offsets, timestamps, request_times):
        out = self.encoder.encode(ops.gather(rows, ids, 0), positions, offsets, timestamps, None, request_times)
        return last_positions(out, offsets)
