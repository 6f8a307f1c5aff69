"""Full-ranking evaluation split across ranks, with exactly the single-process result.

The eval batches are the single-process ones (same capacities, same order); rank r encodes batches
r, r + world, ... Each rank ranks its users' targets, then every rank gathers (batch number, rank of
the target) from all ranks and puts them back in batch order, so the metrics are computed on the same
array one process would build (the weights are identical on every rank).
"""
from __future__ import annotations

import numpy as np

from mindgr.parallel import comm
from mindgr.train.evaluate import batch_ranks, encode_with
from mindgr.train.metrics import check_finite, ranking_metrics


def evaluate_sharded(encode_last, item_table: np.ndarray, examples, evalset, ks, rank: int, world: int,
                     beat=None, encode_batch=None, score=None, filter_history: bool = True) -> dict:
    """`encode_batch(batch)` and `score(users)` replace the encoder call and `users @ item_table.T` (a
    sharded item table encodes from gathered rows and scores against unnormalised rows)."""
    if score is None:
        check_finite(item_table[1:], "item table")
        score = lambda users: users @ item_table.T                    # noqa: E731
    order, ranks = [], []
    for k, _, g, t in batch_ranks(examples, evalset, encode_batch or encode_with(encode_last), score,
                                  filter_history, (rank, world), beat):
        order.append(np.stack([np.full(len(g), k), np.arange(len(g))], 1))
        ranks.append(np.stack([g, t], 1))
    mine = np.concatenate([np.concatenate(order, 0), np.concatenate(ranks, 0)], 1).astype(np.int64) \
        if ranks else np.zeros((0, 4), np.int64)
    every = comm.all_gather(mine)                               # [examples, (batch, position, greater, ties)]
    every = every[np.lexsort((every[:, 1], every[:, 0]))]
    return ranking_metrics(every[:, 2], ks, every[:, 3])
