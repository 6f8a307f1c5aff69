"""Full-ranking evaluation: the last position's embedding scores every item; history is filtered out."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from mindgr.train.metrics import ranking_metrics, target_ranks


def evaluate(encode_last, item_table: np.ndarray, examples, evalset, ks, per_user: bool = False):
    """encode_last: the compiled EncodeLast cell; item_table [V+1, D] (unit rows); evalset gives the
    targets and full histories (the examples hold only the last max_len items of each history).
    With per_user, also returns every evaluated user's target rank, indexed like evalset (-1 = not
    evaluated), for paired comparisons of two runs (mindgr.train.compare)."""
    ranks, rows_seen = [], []
    for batch in examples.in_order():
        user = encode_last(Tensor(batch.ids), Tensor(batch.positions), Tensor(batch.offsets),
                           Tensor(batch.timestamps)).asnumpy()[: batch.num_rows]
        rows = batch.rows[: batch.num_rows]
        scores = user @ item_table.T
        ranks.append(target_ranks(scores, evalset.targets[rows], [evalset.histories[r] for r in rows]))
        rows_seen.append(rows)
    metrics = ranking_metrics(np.concatenate(ranks) if ranks else np.zeros(0), ks)
    if not per_user:
        return metrics
    by_user = np.full(len(evalset.targets), -1, np.int64)
    if ranks:
        by_user[np.concatenate(rows_seen)] = np.concatenate(ranks)
    return metrics, by_user
