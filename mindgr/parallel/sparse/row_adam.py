"""AdamWeightDecay on the rows of one shard, the same float32 arithmetic as mindspore.nn.AdamWeightDecay:

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  u = m / (eps + sqrt(v)) + wd p;  p = p - lr u

(no bias correction, as MindSpore's). `lazy=True` updates only the rows that received a gradient this
step (LazyAdam: the usual choice for large tables, O(touched rows) per step); `lazy=False` updates every
row, which is exactly what the replicated table's optimizer does (rows without a gradient still move by
their decaying moments) and is what the "sharded = data parallel" test uses.
"""
from __future__ import annotations

import numpy as np


class RowAdam:
    def __init__(self, rows: np.ndarray, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float, lazy: bool):
        self.rows = rows                                  # updated in place
        self.m = np.zeros_like(rows)
        self.v = np.zeros_like(rows)
        f = np.float32
        self.lr, self.b1, self.b2, self.eps, self.wd = f(lr), f(beta1), f(beta2), f(eps), f(weight_decay)
        self.lazy = lazy

    def _update(self, p, m, v, g):
        one = np.float32(1.0)
        m = self.b1 * m + (one - self.b1) * g
        v = self.b2 * v + (one - self.b2) * (g * g)
        u = m / (self.eps + np.sqrt(v))
        if self.wd:
            u = self.wd * p + u
        return p - self.lr * u, m, v

    def apply(self, slots: np.ndarray, grads: np.ndarray):
        """One step with the summed gradient `grads[k]` of shard row `slots[k]` (distinct slots)."""
        if self.lazy:
            p, m, v = self._update(self.rows[slots], self.m[slots], self.v[slots], grads)
            self.rows[slots], self.m[slots], self.v[slots] = p, m, v
            return
        g = np.zeros_like(self.rows)
        g[slots] = grads
        self.rows[...], self.m[...], self.v[...] = self._update(self.rows, self.m, self.v, g)
