"""The reward model's cells (objective `rating`): predicted satisfaction of a user with an item.

    r_hat(history, item) = <W h, sqrt(D) e_item> + b_item + b_global

h is the item encoder's output (unit vector) at the history's last position, e_item the encoder's own
item embedding (the table its inputs are gathered from, scaled as the inputs are), W a D x D matrix
(zero at the start: the first predictions are b_global, the training mean the task writes in), b_item
a bias per item (zero at the start). Training (RatingLoss) predicts, at every position t-1 of a training
sequence, the value of its target item t and takes the mean squared error over the positions with a
target (one jagged pass, the loss normalised by the number of targets). With value_input (config
model.value_input), each history item enters the encoder with the value the user gave it: its embedding
plus (value - b_global) times a learned direction (zero at the start), so the encoder can read a user's
rating scale and tastes, not only which items were consumed. Scoring (ScoreLast) takes
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
    request_times, in_values [T] float32 the value of each history token (read only with value_input),
    targets [T] item of the next position (0 = none), values [T] float32 its value, drop, and a rank's loss
    weight `scale` when it has one)."""

    def __init__(self, encoder, num_items: int, value_input: bool = False):
        super().__init__()
        self.encoder = encoder
        self.head = RatingHead(num_items, encoder.dim)
        self.value_input = bool(value_input)
        self.value_dir = param(np.zeros((encoder.dim,), np.float32), "rating.value_dir")

    def states(self, ids, positions, offsets, timestamps, request_times, in_values, drop=None):
        """The encoder's output [T, D], the history's values added to its item vectors under value_input."""
        if not self.value_input:
            return self.encoder(ids, positions, offsets, timestamps, drop, request_times)
        vectors = ops.gather(self.encoder.item_emb, ids, 0)
        vectors = vectors + (in_values - self.head.global_bias).reshape(-1, 1) * self.value_dir.reshape(1, -1)
        return self.encoder.encode(vectors, positions, offsets, timestamps, drop, request_times)

    def predictions(self, ids, positions, offsets, timestamps, request_times, in_values, targets, drop=None):
        """r_hat of every token's target [T] (meaningless where targets == 0)."""
        h = self.states(ids, positions, offsets, timestamps, request_times, in_values, drop)
        return self.head.scores(h, targets.reshape(-1, 1), self.encoder.item_emb).reshape(-1)

    def construct(self, ids, positions, offsets, timestamps, request_times, in_values, targets, values, drop,
                  scale=None):
        pred = self.predictions(ids, positions, offsets, timestamps, request_times, in_values, targets, drop)
        mask = (targets > 0).astype(pred.dtype)
        err = (pred - values) * mask
        loss = (err * err).sum() / ops.maximum(mask.sum(), ops.ones_like(mask.sum()))
        return loss if scale is None else loss * scale


class ScoreLast(nn.Cell):
    """r_hat of G candidate items for each row's history: (ids, positions, offsets, timestamps, request_times,
    in_values, items [B, G] int32) -> [B, G] float32 (rows without tokens score garbage; the caller drops
    them)."""

    def __init__(self, loss: RatingLoss):
        super().__init__()
        self.loss = loss

    def construct(self, ids, positions, offsets, timestamps, request_times, in_values, items):
        h = last_positions(self.loss.states(ids, positions, offsets, timestamps, request_times, in_values), offsets)
        return self.loss.head.scores(h, items, self.loss.encoder.item_emb)


def build_rating(cfg, encoder, num_items: int):
    """The objective registry's builder (mindgr.models.objectives, `rating`)."""
    return RatingLoss(encoder, num_items, cfg.model.value_input)


def rating_flops(model_cfg, num_targets: int, num_candidates: int) -> float:
    """The head per target: W h (2*D*D) and the dot with the item (2*D)."""
    d = model_cfg.dim
    return (2.0 * d * d + 2.0 * d) * num_targets
