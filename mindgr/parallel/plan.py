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
from mindgr.train.rank_draws import SequenceDraws, local_rows  # noqa: F401  (their home is train/)


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
                 cost_model: CostModel, method: str = "cost", seed: int = 0, weights=None):
        """weights: each example's share of the loss's normaliser, indexable by an index array (default: its
        target tokens); a rank's loss weight is its examples' sum over the global batch's."""
        self.lengths = examples.lengths
        self.targets = weights if weights is not None else \
            np.array([int((np.asarray(t) > 0).sum()) for t in examples.targets], dtype=np.int64)
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
        total = tg.sum()
        return RankShare(
            indices=indices[mine], token_src=src.astype(np.int64),
            scale=float(tg[mine].sum()) / (float(total) if total > 0 else 1.0),
            rank_cost=np.array([costs[p].sum() for p in parts]),
            rank_tokens=np.array([lengths[p].sum() for p in parts], dtype=np.int64),
            global_tokens=int(lengths.sum()), global_targets=int(total), lengths=lengths)
