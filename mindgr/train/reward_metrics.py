"""Metrics of a reward model (numpy): RMSE of predicted values, and the AUC of liked against disliked
targets; the baselines a reward model must beat (global, item and user means of training values).

AUC = P(score of a liked target > score of a disliked one), a tie counting 1/2 (Mann-Whitney with average
ranks), so a constant predictor scores exactly 0.5. It is undefined (None, with the counts) when either set
is empty; any non-finite prediction makes every metric None (counted in "nonfinite"), never a number.
"""
from __future__ import annotations

import numpy as np

LIKED = 4.0          # a target valued >= this is liked
DISLIKED = 2.0       # <= this is disliked


def auc(pos_scores, neg_scores) -> float | None:
    """P(pos > neg) + P(pos == neg) / 2 over every (pos, neg) pair; None if either set is empty."""
    pos = np.asarray(pos_scores, np.float64)
    neg = np.asarray(neg_scores, np.float64)
    n_pos, n_neg = len(pos), len(neg)
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(np.concatenate([pos, neg]), return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts                   # 0-based rank of each distinct value's first copy
    ranks = (first + (counts + 1) / 2.0)[inverse.reshape(-1)]   # 1-based average ranks
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def rating_metrics(pred, true, liked: float = LIKED, disliked: float = DISLIKED) -> dict:
    """rmse, mae, auc (liked vs disliked), mean prediction and the counts of predicted targets."""
    pred = np.asarray(pred, np.float64).reshape(-1)
    true = np.asarray(true, np.float64).reshape(-1)
    if pred.shape != true.shape:
        raise ValueError(f"rating_metrics: {len(pred)} predictions for {len(true)} targets")
    is_liked, is_disliked = true >= liked, true <= disliked
    out = {"count": int(len(true)), "liked": int(is_liked.sum()), "disliked": int(is_disliked.sum()),
           "nonfinite": int((~np.isfinite(pred)).sum())}
    if out["count"] == 0 or out["nonfinite"]:
        return {**out, "rmse": None, "mae": None, "auc": None, "mean_prediction": None}
    err = pred - true
    return {**out, "rmse": float(np.sqrt(np.mean(err * err))), "mae": float(np.mean(np.abs(err))),
            "auc": auc(pred[is_liked], pred[is_disliked]), "mean_prediction": float(pred.mean())}


class MeanBaselines:
    """Global, item and user means of training values; an item or user without training values gets the
    global mean. fit(train_users [n] int, train_items [n] int, train_values [n], num_items, num_users)."""

    def __init__(self, users, items, values, num_items: int, num_users: int):
        users = np.asarray(users, np.int64)
        items = np.asarray(items, np.int64)
        values = np.asarray(values, np.float64)
        self.global_mean = float(values.mean()) if len(values) else 0.0
        self.item_mean = self._means(items, values, num_items + 1)
        self.user_mean = self._means(users, values, num_users)

    def _means(self, keys, values, size):
        total = np.bincount(keys, values, minlength=size)
        count = np.bincount(keys, minlength=size)
        return np.where(count > 0, total / np.maximum(count, 1), self.global_mean)

    def predictions(self, users, items) -> dict:
        """{baseline name: predictions} for (user, item) targets."""
        users = np.asarray(users, np.int64)
        items = np.asarray(items, np.int64)
        return {"global-mean": np.full(len(items), self.global_mean), "item-mean": self.item_mean[items],
                "user-mean": self.user_mean[users]}
