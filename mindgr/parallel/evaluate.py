"""Full-ranking evaluation split across ranks, with exactly the single-process result.

The eval batches are the single-process ones (same capacities, same order); rank r encodes batches
r, r + world, ... Each rank ranks its users' targets, then every rank gathers (batch number, rank of
the target) from all ranks and puts them back in batch order, so the metrics are computed on the same
array one process would build (the weights are identical on every rank).
"""
from __future__ import annotations

import numpy as np

from mindgr.datasets import plan_batches
from mindgr.parallel import comm
from mindgr.train.metrics import ranking_metrics, target_ranks
from mindgr.train.step import encoder_inputs


def evaluate_sharded(encode_last, item_table: np.ndarray, examples, evalset, ks, rank: int, world: int,
                     beat=None, encode_batch=None, score=None) -> dict:
    """`encode_batch(batch)` and `score(users)` replace the encoder call and `users @ item_table.T` (a
    sharded item table encodes from gathered rows and scores against unnormalised rows)."""
    from mindspore import Tensor
    order, ranks = [], []
    plan = plan_batches(examples.lengths, examples.token_capacity, examples.row_capacity, rng=None)
    for k in range(rank, len(plan), world):
        if beat is not None:
            beat(f"evaluating batch {k}")
        batch = examples.batch(plan[k])
        if encode_batch is not None:
            user = encode_batch(batch)[: batch.num_rows]
        else:
            user = encode_last(*[Tensor(x) for x in encoder_inputs(batch)]).asnumpy()[: batch.num_rows]
        rows = batch.rows[: batch.num_rows]
        scores = score(user) if score is not None else user @ item_table.T
        g, t = target_ranks(scores, evalset.targets[rows], [evalset.histories[i] for i in rows])
        order.append(np.stack([np.full(len(g), k), np.arange(len(g))], 1))
        ranks.append(np.stack([g, t], 1))
    mine = np.concatenate([np.concatenate(order, 0), np.concatenate(ranks, 0)], 1).astype(np.int64) \
        if ranks else np.zeros((0, 4), np.int64)
    every = comm.all_gather(mine)                               # [examples, (batch, position, greater, ties)]
    every = every[np.lexsort((every[:, 1], every[:, 0]))]
    return ranking_metrics(every[:, 2], ks, every[:, 3])
