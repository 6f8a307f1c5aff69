"""The reward model's cells (objective `rating`): predicted satisfaction of a user with an item.

    r_hat(history, item) = <W h, sqrt(D) e_item> + b_item + b_global

h is the item encoder's output (unit vector) at the history's last position, e_item the encoder's own
item embedding (the table its inputs are gathered from, scaled as the inputs are), W a D x D matrix
(zero at the start: the first predictions are b_global, the training mean the task writes in), b_item
a bias per item (zero at the start). Training (RatingLoss) predicts, at every position t-1 of a training
sequence, the value of its target item t and takes the mean squared error over the positions with a
target (one jagged pass, the loss normalised by the number of targets). Scoring (ScoreLast) takes
the state at each row's last position and a group of G candidate items per row: the same arithmetic
(RatingHead.scores), so a scorer and the training graph agree on every (history, item).
"""
from __future__ import annotations

import numpy as np
from mindspore import nn, ops

from mindgr.models.layers import last_positions, param


class RatingHead(nn.Cell):
    """W, b_item, b_global; scores(h [N, D], items [N, G], item_emb [V+1, D]) -> [N, G] (the item table is
    the encoder's, passed in: the head holds no second reference to the encoder)."""

    def __init__(self, num_items: int, dim: int):
        super().__init__()
        self.scale = float(np.sqrt(dim))
        self.proj = param(np.zeros((dim, dim), np.float32), "rating.proj")
        self.item_bias = param(np.zeros((num_items + 1,), np.float32), "rating.item_bias")
        self.global_bias = param(np.zeros((1,), np.float32), "rating.global_bias")

    def scores(self, h, items, item_emb):
        n, g = items.shape
        e = ops.gather(item_emb, items.reshape(-1), 0).reshape(n, g, -1) * self.scale
        wh = ops.matmul(h, self.proj)                                     # [N, D]
        dot = (e * wh.reshape(n, 1, -1)).sum(-1)                          # [N, G]
        return dot + ops.gather(self.item_bias, items.reshape(-1), 0).reshape(n, g) + self.global_bias


class RatingLoss(nn.Cell):
    """Mean squared error of r_hat at every token with a target: inputs (ids, positions, offsets, timestamps,
    request_times, targets [T] item of the next position (0 = none), values [T] float32 its value, drop,
    and a rank's loss weight `scale` when it has one)."""

    def __init__(self, encoder, num_items: int):
        super().__init__()
        self.encoder = encoder
        self.head = RatingHead(num_items, encoder.dim)

    def predictions(self, ids, positions, offsets, timestamps, request_times, targets, drop=None):
        """r_hat of every token's target [T] (meaningless where targets == 0)."""
        h = self.encoder(ids, positions, offsets, timestamps, drop, request_times)
        return self.head.scores(h, targets.reshape(-1, 1), self.encoder.item_emb).reshape(-1)

    def construct(self, ids, positions, offsets, timestamps, request_times, targets, values, drop, scale=None):
        pred = self.predictions(ids, positions, offsets, timestamps, request_times, targets, drop)
        mask = (targets > 0).astype(pred.dtype)
        err = (pred - values) * mask
        loss = (err * err).sum() / ops.maximum(mask.sum(), ops.ones_like(mask.sum()))
        return loss if scale is None else loss * scale


class ScoreLast(nn.Cell):
    """r_hat of G candidate items for each row's history: (ids, positions, offsets, timestamps, request_times,
    items [B, G] int32) -> [B, G] float32 (rows without tokens score garbage; the caller drops them)."""

    def __init__(self, loss: RatingLoss):
        super().__init__()
        self.encoder = loss.encoder
        self.head = loss.head

    def construct(self, ids, positions, offsets, timestamps, request_times, items):
        h = last_positions(self.encoder(ids, positions, offsets, timestamps, None, request_times), offsets)
        return self.head.scores(h, items, self.encoder.item_emb)


def build_rating(cfg, encoder, num_items: int):
    """The objective registry's builder (mindgr.models.objectives, `rating`)."""
    return RatingLoss(encoder, num_items)


def rating_flops(model_cfg, num_targets: int, num_candidates: int) -> float:
    """The head per target: W h (2*D*D) and the dot with the item (2*D)."""
    d = model_cfg.dim
    return (2.0 * d * d + 2.0 * d) * num_targets
