"""The compiled training step and the evaluation encoder: one graph each, static shapes."""
import mindspore as ms
from mindspore import nn

from mindgr.models.layers import last_positions


class TrainStep(nn.Cell):
    """loss, grads = value_and_grad(loss_net)(batch); optimizer(grads). Returns the loss."""

    def __init__(self, loss_net, optimizer):
        super().__init__()
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    def construct(self, *inputs):
        # (ids, positions, offsets, timestamps, request_times, targets, negatives..., drop): the loss decides
        # the negatives
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
