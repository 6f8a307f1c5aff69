"""Negatives for one batch, drawn on the host (so a resumed run replays them exactly).

Strategies (config loss.negatives):
  per_token    R uniform ids per position: [T, R]                           (the published baseline)
  shared_pool  ONE pool of K ids for the batch, uniform or by popularity: [K]
  in_batch     the batch's own distinct target ids, up to loss.in_batch_size: [K_ib] (0 = unused slot)
  mixed        pool + in-batch, concatenated
Shared strategies also return c [K], the logQ correction per candidate: log of the candidate's expected
count in the set (K q_j when K ids are drawn from q; 1 - (1 - p_j)^n for an item of unigram frequency p_j
among n in-batch targets, times m/u when only m of the u distinct targets are kept). Subtracting it from the logit makes the negatives' sum an importance-sampling
estimate of the full softmax denominator. With loss.logq=false, c = 0.
With loss.pool_estimate=per_token, log(V / R) is added to c: the sum then estimates the per-token sampled
softmax's denominator over R uniform negatives, which is (R / V) x the full sum, instead of the full sum.
"""
from __future__ import annotations

import numpy as np

STRATEGIES = ("per_token", "shared_pool", "in_batch", "mixed")


def uniform_items(rng: np.random.Generator, num_items: int, shape) -> np.ndarray:
    """Item ids drawn uniformly from 1..num_items (never 0, the padding), int32 of `shape`: the one
    uniform negative draw (per-token negatives, a uniform pool, per-sequence draws of a rank, the
    calibration probe's synthetic batches)."""
    return rng.integers(1, num_items + 1, shape, dtype=np.int32)


def item_frequencies(train_seqs, num_items: int) -> np.ndarray:
    """[V+1] unigram frequency of each item among training targets (+1 smoothing; index 0 = 0)."""
    counts = np.ones(num_items + 1, np.float64)
    counts[0] = 0.0
    for s in train_seqs:
        np.add.at(counts, np.asarray(s[1:], np.int64), 1.0)
    return counts / counts.sum()


class NegativeSampler:
    def __init__(self, loss_cfg, num_items: int, frequencies: np.ndarray, token_capacity: int):
        self.strategy = loss_cfg.negatives
        self.num_items, self.token_capacity = num_items, token_capacity
        self.num_negatives, self.pool_size = loss_cfg.num_negatives, loss_cfg.pool_size
        self.in_batch_size, self.logq = loss_cfg.in_batch_size, loss_cfg.logq
        # log(V / R): each candidate stands for R / V of the catalogue (loss.pool_estimate=per_token)
        self.estimate_shift = (np.log(num_items / loss_cfg.num_negatives)
                               if loss_cfg.pool_estimate == "per_token" else 0.0)
        self.popularity = loss_cfg.sampling == "popularity"
        self.freq = frequencies
        q = frequencies[1:] if self.popularity else np.full(num_items, 1.0 / num_items)
        self.pool_q = np.concatenate([[0.0], q / q.sum()])
        self.pool_cdf = np.cumsum(self.pool_q[1:])

    @property
    def shared(self) -> bool:
        return self.strategy != "per_token"

    @property
    def num_candidates(self) -> int:
        return {"shared_pool": self.pool_size, "in_batch": self.in_batch_size,
                "mixed": self.pool_size + self.in_batch_size}.get(self.strategy, self.num_negatives)

    def _pool(self, rng):
        if self.popularity:
            ids = np.searchsorted(self.pool_cdf, rng.random(self.pool_size) * self.pool_cdf[-1], side="right") + 1
            ids = np.minimum(ids, self.num_items).astype(np.int32)
        else:
            ids = uniform_items(rng, self.num_items, self.pool_size)
        return ids, np.log(self.pool_size * self.pool_q[ids])

    def _in_batch(self, rng, targets):
        real = targets[targets > 0]
        ids = np.unique(real).astype(np.int32)
        keep = min(1.0, self.in_batch_size / max(len(ids), 1))  # each distinct target survives the cut with this
        if len(ids) > self.in_batch_size:
            ids = np.sort(rng.choice(ids, self.in_batch_size, replace=False)).astype(np.int32)
        out = np.zeros(self.in_batch_size, np.int32)
        out[: len(ids)] = ids
        inclusion = keep * -np.expm1(len(real) * np.log1p(-self.freq[out]))  # keep * (1 - (1 - p)^n)
        corr = np.where(out > 0, np.log(np.maximum(inclusion, 1e-30)), 0.0)
        return out, corr

    def draw(self, rng, targets: np.ndarray):
        """per_token: (ids [T, R],); shared: (ids [K] int32, correction [K] float32)."""
        if self.strategy == "per_token":
            return (uniform_items(rng, self.num_items, (self.token_capacity, self.num_negatives)),)
        parts = []
        if self.strategy in ("shared_pool", "mixed"):
            parts.append(self._pool(rng))
        if self.strategy in ("in_batch", "mixed"):
            parts.append(self._in_batch(rng, targets))
        ids = np.concatenate([p[0] for p in parts]).astype(np.int32)
        corr = np.concatenate([p[1] for p in parts])
        if self.strategy == "mixed":
            corr = corr + np.log(2.0)  # two estimates of the same sum: average them
        if not self.logq:
            corr = np.zeros_like(corr)
        corr = np.where(ids > 0, corr + self.estimate_shift, corr)
        return ids, corr.astype(np.float32)
