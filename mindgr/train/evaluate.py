"""Full-ranking evaluation: the last position's embedding scores every item; the history is filtered out
(eval.filter_history, the default) or not."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor

from mindgr.train.metrics import check_finite, ranking_metrics, target_ranks
from mindgr.train.step import encoder_inputs


def batch_ranks(examples, evalset, encode, score, filter_history: bool = True, share=(0, 1), beat=None):
    """The one ranking loop: for every eval batch k with k % world == rank (share = (rank, world)), in
    order, yields (k, rows, greater, ties): the batch's users (evalset rows) and their targets' tie-aware
    ranks. `encode(batch)` -> user vectors [rows, D]; `score(users)` -> scores [rows, V+1]. The batches are
    the same for every share, so the shares of all ranks together are exactly the one-process loop."""
    rank, world = share
    for k, idx in enumerate(examples.plan()):
        if k % world != rank:
            continue
        if beat is not None:
            beat(f"evaluating batch {k}")
        batch = examples.batch(idx)
        user = encode(batch)[: batch.num_rows]
        check_finite(user, "user embeddings")
        rows = batch.rows[: batch.num_rows]
        hist = [evalset.histories[r] if filter_history else () for r in rows]
        g, t = target_ranks(score(user), evalset.targets[rows], hist)
        yield k, rows, g, t


def encode_with(encode_last):
    """`encode(batch)` for batch_ranks from a compiled EncodeLast cell."""
    return lambda batch: encode_last(*[Tensor(x) for x in encoder_inputs(batch)]).asnumpy()


def evaluate(encode_last, item_table: np.ndarray, examples, evalset, ks, per_user: bool = False,
             filter_history: bool = True):
    """encode_last: the compiled EncodeLast cell; item_table [V+1, D] (unit rows); evalset gives the
    targets and full histories (the examples hold only the last max_len items of each history).
    Ranks are tie-aware (mindgr.train.metrics). With per_user, also returns every evaluated user's
    (greater, ties) pair, indexed like evalset (-1 = not evaluated), for paired comparisons of two runs
    (mindgr.train.compare). filter_history=False ranks the target against every item, history included."""
    check_finite(item_table[1:], "item table")
    greater, ties, rows_seen = [], [], []
    for _, rows, g, t in batch_ranks(examples, evalset, encode_with(encode_last), lambda u: u @ item_table.T,
                                     filter_history):
        greater.append(g)
        ties.append(t)
        rows_seen.append(rows)
    if greater:
        metrics = ranking_metrics(np.concatenate(greater), ks, np.concatenate(ties))
    else:
        metrics = ranking_metrics(np.zeros(0), ks)
    if not per_user:
        return metrics
    by_user = np.full(len(evalset.targets), -1, np.int64)
    ties_by_user = np.full(len(evalset.targets), -1, np.int64)
    if greater:
        seen = np.concatenate(rows_seen)
        by_user[seen], ties_by_user[seen] = np.concatenate(greater), np.concatenate(ties)
    return metrics, by_user, ties_by_user
