"""The compiled training step and the evaluation encoder: one graph each, static shapes; and the step's
inputs as one named structure (StepInputs), the only place their order is written down."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import mindspore as ms
from mindspore import nn

from mindgr.models.layers import last_positions

# An evaluation batch's encoder inputs, in the order EncodeLast (and the sharded EncodeRows) take them.
ENCODER_FIELDS = ("ids", "positions", "offsets", "timestamps", "request_times")


def encoder_inputs(batch) -> tuple:
    """A packed batch's encoder inputs (host arrays), in ENCODER_FIELDS order (evaluation, serving)."""
    return tuple(getattr(batch, name) for name in ENCODER_FIELDS)


class StepInputs(NamedTuple):
    """One training step's host arrays. `as_tuple()` is the order the loss cells take them:
    the encoder inputs (ENCODER_FIELDS), the targets, the negatives (as many arrays as the objective's
    negative strategy draws), the dropout masks, and a rank's loss weight when it has one.

    A new per-step input is one field here (plus `from_batch` and the cells that read it)."""
    ids: np.ndarray            # [T_cap] int32 item ids of the packed tokens (0 = padding)
    positions: np.ndarray      # [T_cap] int32 position of each token in its sequence
    offsets: np.ndarray        # [B_cap + 1] int32 row starts
    timestamps: np.ndarray     # [T_cap] int64 each token's time
    request_times: np.ndarray  # [B_cap] int64 each row's request time (training: its last target's time)
    targets: np.ndarray        # [T_cap] int32 next item of each token (0 = no target)
    negatives: tuple           # per_token: (ids [T, R],); shared: (ids [K], log-correction [K])
    drop: np.ndarray           # [sites, T_cap, width] float32 dropout masks
    scale: object = None       # float32 loss weight of a rank's share (data parallel), or None

    @classmethod
    def from_batch(cls, batch, negatives, drop, scale=None) -> "StepInputs":
        """From a packed batch (mindgr.datasets.packer) and its host draws."""
        negatives = negatives if isinstance(negatives, tuple) else (negatives,)
        return cls(batch.ids, batch.positions, batch.offsets, batch.timestamps, batch.request_times, batch.targets,
                   negatives, drop, None if scale is None else np.float32(scale))

    def encoder(self) -> tuple:
        return tuple(getattr(self, name) for name in ENCODER_FIELDS)

    def as_tuple(self) -> tuple:
        head = self.encoder() + (self.targets, *self.negatives, self.drop)
        return head if self.scale is None else head + (self.scale,)

    def tensors(self) -> list:
        """MindSpore tensors of as_tuple(), sharing the host arrays' memory (no copy: the step only reads
        them, and every batch's arrays are its own, or constant); scalars and strided arrays are copied."""
        return [host_tensor(x) for x in self.as_tuple()]


def host_tensor(x):
    """A MindSpore tensor over a C-contiguous numpy array's own memory (mindspore.from_numpy), else a copy."""
    from mindspore import Tensor, from_numpy
    if isinstance(x, np.ndarray) and x.flags.c_contiguous and x.flags.aligned and x.flags.writeable:
        return from_numpy(x)
    return Tensor(x)


class TrainStep(nn.Cell):
    """loss, grads = value_and_grad(loss_net)(batch); optimizer(grads). Returns the loss."""

    def __init__(self, loss_net, optimizer):
        super().__init__()
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    def construct(self, *inputs):
        # StepInputs.as_tuple(): the loss decides how many negative arrays it takes
        loss, grads = self.grad_fn(*inputs)
        self.optimizer(grads)
        return loss


class EncodeLast(nn.Cell):
    """The encoder's output at each row's last token (no dropout): the user embedding for ranking.
    request_times [B] int64: when each row's recommendation is requested (the held-out target's time)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def construct(self, ids, positions, offsets, timestamps, request_times):
        return last_positions(self.encoder(ids, positions, offsets, timestamps, None, request_times), offsets)


def build_optimizer(params, train_cfg):
    t = train_cfg
    return nn.AdamWeightDecay(params, learning_rate=t.lr, beta1=t.beta1, beta2=t.beta2, eps=t.eps,
                              weight_decay=t.weight_decay)
