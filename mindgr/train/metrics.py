"""Full-ranking metrics: the target is ranked against every item, the user's history filtered out.

Ties are broken uniformly at random, in expectation: a user's rank is a pair (greater = items scored
strictly above the target, ties = other items scored equal to it). The target's 0-based position is
then uniform on greater .. greater + ties, and HR@K, NDCG@K and MRR are the exact expectations over
that position. A model that scores every item alike gets chance-level metrics (HR@K = K / candidates),
never the perfect ones that counting only strictly higher scores would give. Non-finite scores are an
error: NaN compares unequal to everything and would rank the target first.
"""
from __future__ import annotations

import numpy as np


def check_finite(values: np.ndarray, what: str):
    """FloatingPointError naming `what` if `values` hold NaN or inf (one line)."""
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(values.size - finite.sum())
        kinds = "NaN" if np.isnan(values).any() else "inf"
        raise FloatingPointError(f"{what}: {bad} of {values.size} values are non-finite ({kinds}); "
                                 "the weights have diverged (lower train.lr), nothing can be ranked")


def target_ranks(scores: np.ndarray, targets: np.ndarray, histories: list) -> tuple[np.ndarray, np.ndarray]:
    """(greater, ties) of each target among all items 1..V. scores [U, V+1] (column 0 is padding).

    greater counts the items scored strictly above the target, ties the other items scored equal to it.
    Items of the user's history other than the target itself are removed from the ranking, and so is
    padding id 0.
    """
    scores = np.array(scores, dtype=np.float32, copy=True)
    check_finite(scores[:, 1:], "scores")
    scores[:, 0] = -np.inf
    rows = np.arange(len(targets))
    target_scores = scores[rows, targets].copy()
    for u, hist in enumerate(histories):
        if len(hist):
            scores[u, hist] = -np.inf
    scores[rows, targets] = target_scores
    greater = (scores > target_scores[:, None]).sum(1)
    ties = (scores == target_scores[:, None]).sum(1) - 1      # the target itself is not a tie
    return greater, ties


def _prefix(fn, n: int) -> np.ndarray:
    """[n + 1] cumulative sums: out[r] = sum of fn(j) for j < r."""
    out = np.zeros(n + 1, np.float64)
    np.cumsum(fn(np.arange(n, dtype=np.float64)), out=out[1:])
    return out


def per_user_metrics(ranks: np.ndarray, ks, ties: np.ndarray | None = None) -> dict:
    """{metric: [U] per-user values}: hit@K, the NDCG@K gain (one relevant item: 1/log2(rank+2) if
    rank < K) and 1/(rank+1), each the expectation over the target's position uniform on
    ranks .. ranks + ties (ties None or 0: that one position). Their means are ranking_metrics; paired
    comparisons of two runs (mindgr.train.compare) use the per-user values."""
    g = np.asarray(ranks, np.int64)
    t = np.zeros_like(g) if ties is None else np.asarray(ties, np.int64)
    n = t + 1                                                 # positions the target may take
    hi = g + n                                                # one past the last of them
    exact = t == 0                                            # no tie: the plain formulas, bit for bit
    gf = g.astype(np.float64)
    top = int(hi.max()) if len(hi) else 0
    gain_sum = _prefix(lambda r: 1.0 / np.log2(r + 2.0), top)
    recip_sum = _prefix(lambda r: 1.0 / (r + 1.0), top)
    out = {}
    for k in ks:
        hit = np.where(exact, (gf < k).astype(np.float64), np.clip(k - g, 0, n) / n)
        out[f"hr@{k}"] = hit
        if k > 1:
            capped_hi, capped_lo = np.minimum(hi, k), np.minimum(g, k)
            spread = (gain_sum[capped_hi] - gain_sum[capped_lo]) / n
            out[f"ndcg@{k}"] = np.where(exact, (1.0 / np.log2(gf + 2.0)) * (gf < k), spread)
    out["mrr"] = np.where(exact, 1.0 / (gf + 1.0), (recip_sum[hi] - recip_sum[g]) / n)
    return out


def ranking_metrics(ranks: np.ndarray, ks=(1, 10, 50, 200), ties: np.ndarray | None = None) -> dict:
    """HR@K, NDCG@K and MRR from 0-based ranks (and ties): the means of per_user_metrics."""
    out = {"count": int(len(ranks))}
    if len(ranks) == 0:
        return out
    out.update({name: float(values.mean()) for name, values in per_user_metrics(ranks, ks, ties).items()})
    return out


def popularity_scores(train_seqs, num_items: int) -> np.ndarray:
    """[V+1] training counts of each item: the non-personalised baseline every model must beat."""
    counts = np.zeros(num_items + 1, np.float32)
    for s in train_seqs:
        np.add.at(counts, s, 1.0)
    return counts


def popularity_metrics(train_seqs, num_items: int, evalset, ks, chunk: int = 256) -> dict:
    # users in chunks: a dense [users, V+1] score matrix is 3.5 GB at 4,000 users x 221k items.
    # Items of equal count tie (many never-seen items do): tie-aware like every other ranking.
    pop = popularity_scores(train_seqs, num_items)
    n = len(evalset.targets)
    pairs = [target_ranks(np.broadcast_to(pop, (min(chunk, n - lo), num_items + 1)), evalset.targets[lo: lo + chunk],
                          evalset.histories[lo: lo + chunk]) for lo in range(0, n, chunk)]
    if not pairs:
        return ranking_metrics(np.zeros(0, np.int64), ks)
    return ranking_metrics(np.concatenate([g for g, _ in pairs]), ks, np.concatenate([t for _, t in pairs]))
