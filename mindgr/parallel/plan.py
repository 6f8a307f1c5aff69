"""From the global batch (the one a single process would train on) to this rank's packed batch.

The global batches are the single-process EpochPlan at the global capacities (data.token_capacity /
row_capacity or their auto values), whatever the number of ranks: a run may resume with another rank
count and the data cursor (epoch, batch) means the same thing. Each global batch is split by
mindgr.parallel.balance; per-rank capacities are the global ones / world, plus parallel.capacity_slack
headroom (without it a 99.9%-full global batch often has no split that fits, let alone a balanced one).

Host draws are those of one process: negatives are drawn for the GLOBAL batch and each rank takes the
rows of its own tokens; dropout masks are drawn for the rank's own token rows only (mindgr.train.masks
can jump to any row). A token sees the same negatives and masks whatever the number of ranks, so 1 and
N processes train the same model (up to float summation order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mindgr.parallel.balance import CostModel, partition
from mindgr.train.negatives import uniform_items


def rank_capacities(token_capacity: int, row_capacity: int, world: int, slack: float) -> tuple[int, int]:
    """Per-rank (tokens, rows): the global capacities / world with `slack` headroom, tokens rounded to 8."""
    t = math.ceil(token_capacity / world * (1.0 + slack) / 8) * 8
    b = math.ceil(row_capacity / world * (1.0 + slack))
    return int(t), int(max(b, 1))


@dataclass
class RankShare:
    """What one rank trains in one step, and what every rank was given (for logging)."""
    indices: np.ndarray        # this rank's example indices, in global-batch order
    token_src: np.ndarray      # for each of this rank's tokens, its position in the global packed batch
    scale: float               # this rank's target tokens / global target tokens (loss weight)
    rank_cost: np.ndarray      # predicted cost of every rank (cost-model units)
    rank_tokens: np.ndarray    # real tokens of every rank
    global_tokens: int
    global_targets: int
    lengths: np.ndarray        # lengths of every sequence of the global batch (FLOPs)


class RankPlanner:
    """Splits global batches for `rank` of `world`; every rank computes the same split independently."""

    def __init__(self, examples, world: int, rank: int, token_capacity: int, row_capacity: int,
                 cost_model: CostModel, method: str = "cost", seed: int = 0):
        self.lengths = examples.lengths
        self.targets = np.array([int((np.asarray(t) > 0).sum()) for t in examples.targets], dtype=np.int64)
        self.world, self.rank = world, rank
        self.token_capacity, self.row_capacity = token_capacity, row_capacity
        self.cost_model, self.method, self.seed = cost_model, method, seed

    def split(self, epoch: int, batch: int, indices) -> list:
        """Every rank's part of the global batch, as positions into `indices` (ascending)."""
        lengths = self.lengths[indices]
        method = {"cost": "balanced", "tokens": "tokens", "random": "random"}[self.method]
        rng = np.random.default_rng([self.seed, epoch, batch, 11]) if method == "random" else None
        return partition(lengths, self.world, self.token_capacity, self.row_capacity, self.cost_model,
                         method, rng)

    def share(self, epoch: int, batch: int, indices) -> RankShare:
        indices = np.asarray(indices, dtype=np.int64)
        parts = self.split(epoch, batch, indices)
        lengths = self.lengths[indices]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
        mine = parts[self.rank]
        src = (np.concatenate([np.arange(starts[k], starts[k] + lengths[k]) for k in mine])
               if len(mine) else np.zeros(0, np.int64))
        costs = self.cost_model(lengths)
        tg = self.targets[indices]
        total_targets = int(tg.sum())
        return RankShare(
            indices=indices[mine], token_src=src.astype(np.int64),
            scale=float(tg[mine].sum()) / max(total_targets, 1),
            rank_cost=np.array([costs[p].sum() for p in parts]),
            rank_tokens=np.array([lengths[p].sum() for p in parts], dtype=np.int64),
            global_tokens=int(lengths.sum()), global_targets=total_targets, lengths=lengths)


def local_rows(global_rows: np.ndarray, token_src: np.ndarray, capacity: int, fill, axis: int = 0) -> np.ndarray:
    """This rank's rows of a host draw made for the global batch, padded with `fill` to `capacity`."""
    shape = list(global_rows.shape)
    shape[axis] = capacity
    out = np.full(shape, fill, dtype=global_rows.dtype)
    index = [slice(None)] * len(shape)
    index[axis] = slice(0, len(token_src))
    out[tuple(index)] = np.take(global_rows, token_src, axis=axis)
    return out


class SequenceDraws:
    """parallel.draws=sequence: negatives and dropout masks drawn per sequence, from a generator keyed by
    (seed, epoch, example index). A rank draws only its own tokens (O(own tokens), not O(global batch)),
    and every token gets the same draws whatever the number of ranks; the stream differs from the
    single-process trainer's (which draws per batch), so 1 process is matched only in distribution.
    """

    def __init__(self, seed: int, num_items: int, num_negatives: int, dropout: float, sites: int, width: int):
        self.seed, self.num_items, self.num_negatives = seed, num_items, num_negatives
        self.p, self.sites, self.width = dropout, sites, width

    def draw(self, epoch: int, indices, lengths, capacity: int):
        negatives = np.ones((capacity, self.num_negatives), np.int32)
        drop = np.ones((self.sites, capacity, self.width), np.float32)
        at = 0
        for i, n in zip(indices, lengths):
            rng = np.random.default_rng([self.seed, epoch, int(i), 13])
            negatives[at: at + n] = uniform_items(rng, self.num_items, (n, self.num_negatives))
            if self.p > 0:
                keep = rng.random((self.sites, n, self.width), dtype=np.float32) >= self.p
                drop[:, at: at + n] = keep * np.float32(1.0 / (1.0 - self.p))
            at += n
        return negatives, drop
