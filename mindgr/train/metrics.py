"""Full-ranking metrics: the target is ranked against every item, the user's history filtered out."""
from __future__ import annotations

import numpy as np


def target_ranks(scores: np.ndarray, targets: np.ndarray, histories: list) -> np.ndarray:
    """0-based rank of each target among all items 1..V. scores [U, V+1] (column 0 is padding).

    Items of the user's history other than the target itself are removed from the ranking, and so is
    padding id 0; an item ranks above the target only with a strictly higher score.
    """
    scores = np.array(scores, dtype=np.float32, copy=True)
    scores[:, 0] = -np.inf
    rows = np.arange(len(targets))
    target_scores = scores[rows, targets].copy()
    for u, hist in enumerate(histories):
        if len(hist):
            scores[u, hist] = -np.inf
    scores[rows, targets] = target_scores
    return (scores > target_scores[:, None]).sum(1)


def per_user_metrics(ranks: np.ndarray, ks) -> dict:
    """{metric: [U] per-user values} from 0-based target ranks: hit@K, the NDCG@K gain (one relevant
    item: 1/log2(rank+2) if rank < K) and 1/(rank+1). Their means are ranking_metrics; paired
    comparisons of two runs (mindgr.train.compare) use the per-user values."""
    ranks = np.asarray(ranks, np.float64)
    gain = 1.0 / np.log2(ranks + 2.0)
    out = {}
    for k in ks:
        hit = (ranks < k).astype(np.float64)
        out[f"hr@{k}"] = hit
        if k > 1:
            out[f"ndcg@{k}"] = gain * hit
    out["mrr"] = 1.0 / (ranks + 1.0)
    return out


def ranking_metrics(ranks: np.ndarray, ks=(1, 10, 50, 200)) -> dict:
    """HR@K, NDCG@K and MRR from 0-based ranks: the means of per_user_metrics."""
    out = {"count": int(len(ranks))}
    if len(ranks) == 0:
        return out
    out.update({name: float(values.mean()) for name, values in per_user_metrics(ranks, ks).items()})
    return out


def popularity_scores(train_seqs, num_items: int) -> np.ndarray:
    """[V+1] training counts of each item: the non-personalised baseline every model must beat."""
    counts = np.zeros(num_items + 1, np.float32)
    for s in train_seqs:
        np.add.at(counts, s, 1.0)
    return counts


def popularity_metrics(train_seqs, num_items: int, evalset, ks, chunk: int = 256) -> dict:
    # users in chunks: a dense [users, V+1] score matrix is 3.5 GB at 4,000 users x 221k items
    pop = popularity_scores(train_seqs, num_items)
    n = len(evalset.targets)
    ranks = [target_ranks(np.broadcast_to(pop, (min(chunk, n - lo), num_items + 1)), evalset.targets[lo: lo + chunk],
                          evalset.histories[lo: lo + chunk]) for lo in range(0, n, chunk)]
    return ranking_metrics(np.concatenate(ranks) if ranks else np.zeros(0, np.int64), ks)
