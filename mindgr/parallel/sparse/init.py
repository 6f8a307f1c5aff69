"""The item table's initial rows, drawn from the encoder's own generator exactly as the replicated model
draws them (mindgr.models.layers.trunc_normal), but holding only this shard's rows.

A shard starts from the same values as the replicated table, so a sharded run and a data-parallel run
begin identically, and a table of 0.2B parameters never exists whole in one process. The generator is
left where trunc_normal leaves it, so every parameter drawn after the table is the same too.
"""
from __future__ import annotations

import numpy as np

from mindgr.train.table_checkpoint import owned_rows  # noqa: F401  (row ownership: the file format's)

_CHUNK = 1 << 22          # values drawn at a time


class ShardDraw:
    """An `item_init(rng, shape, std)` for build_encoder: draws like trunc_normal, keeps rows `keep`
    (`self.rows`, float32) and gives the encoder a 1-row placeholder table."""

    def __init__(self, keep: np.ndarray):
        self.keep = np.asarray(keep, np.int64)
        self.rows = None

    def __call__(self, rng: np.random.Generator, shape, std: float) -> np.ndarray:
        n, d = shape
        total = n * d
        kept = np.zeros((len(self.keep), d), np.float64)
        pos = np.full(n, -1, np.int64)
        pos[self.keep] = np.arange(len(self.keep))
        bad = []
        step = max(d, _CHUNK - _CHUNK % d)
        for lo in range(0, total, step):              # chunked draws = one draw (same generator stream)
            x = rng.standard_normal(min(step, total - lo))
            bad.append(lo + np.flatnonzero(np.abs(x) > 2.0))
            r0 = lo // d
            block = x.reshape(-1, d)
            mine = pos[r0: r0 + len(block)]
            kept[mine[mine >= 0]] = block[mine >= 0]
        bad = np.concatenate(bad) if bad else np.zeros(0, np.int64)
        while len(bad):                               # trunc_normal's redraws, in the same order
            x = rng.standard_normal(len(bad))
            where = pos[bad // d]
            ok = where >= 0
            kept[where[ok], (bad % d)[ok]] = x[ok]
            bad = bad[np.abs(x) > 2.0]
        self.rows = (kept * std).astype(np.float32)
        return np.zeros((1, d), np.float32)
