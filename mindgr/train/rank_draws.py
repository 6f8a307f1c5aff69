"""A rank's share of the host draws of a global batch, for any task an executor splits over ranks.

local_rows: the rows of this rank's tokens out of a draw made for the whole global batch (1 and N processes
then see the same draws). SequenceDraws (parallel.draws=sequence): negatives and masks keyed by example, so a
rank draws only its own tokens.
"""
from __future__ import annotations

import numpy as np

from mindgr.train.negatives import uniform_items


def local_rows(global_rows: np.ndarray, token_src: np.ndarray, capacity: int, fill, axis: int = 0) -> np.ndarray:
    """This rank's rows of a host draw made for the global batch, padded with `fill` to `capacity`."""
    shape = list(global_rows.shape)
    shape[axis] = capacity
    out = np.full(shape, fill, dtype=global_rows.dtype)
    index = [slice(None)] * len(shape)
    index[axis] = slice(0, len(token_src))
    out[tuple(index)] = np.take(global_rows, token_src, axis=axis)
    return out


class SequenceDraws:
    """parallel.draws=sequence: negatives and dropout masks drawn per sequence, from a generator keyed by
    (seed, epoch, example index). A rank draws only its own tokens (O(own tokens), not O(global batch)),
    and every token gets the same draws whatever the number of ranks; the stream differs from the
    single-process trainer's (which draws per batch), so 1 process is matched only in distribution.
    """

    def __init__(self, seed: int, num_items: int, num_negatives: int, dropout: float, sites: int, width: int):
        self.seed, self.num_items, self.num_negatives = seed, num_items, num_negatives
        self.p, self.sites, self.width = dropout, sites, width

    def draw(self, epoch: int, indices, lengths, capacity: int):
        negatives = np.ones((capacity, self.num_negatives), np.int32)
        drop = np.ones((self.sites, capacity, self.width), np.float32)
        at = 0
        for i, n in zip(indices, lengths):
            rng = np.random.default_rng([self.seed, epoch, int(i), 13])
            negatives[at: at + n] = uniform_items(rng, self.num_items, (n, self.num_negatives))
            if self.p > 0:
                keep = rng.random((self.sites, n, self.width), dtype=np.float32) >= self.p
                drop[:, at: at + n] = keep * np.float32(1.0 / (1.0 - self.p))
            at += n
        return negatives, drop
