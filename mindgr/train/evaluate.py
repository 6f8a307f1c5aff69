"""Full-ranking evaluation: the last position's embedding scores every item; history is filtered out."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from mindgr.train.metrics import ranking_metrics, target_ranks


def evaluate(encode_last, item_table: np.ndarray, examples, evalset, ks) -> dict:
    """encode_last: the compiled EncodeLast cell; item_table [V+1, D] (unit rows); evalset gives the
    targets and full histories (the examples hold only the last max_len items of each history)."""
    ranks = []
    for batch in examples.in_order():
        user = encode_last(Tensor(batch.ids), Tensor(batch.positions), Tensor(batch.offsets),
                           Tensor(batch.timestamps)).asnumpy()[: batch.num_rows]
        rows = batch.rows[: batch.num_rows]
        scores = user @ item_table.T
        ranks.append(target_ranks(scores, evalset.targets[rows], [evalset.histories[r] for r in rows]))
    return ranking_metrics(np.concatenate(ranks) if ranks else np.zeros(0), ks)
