"""Delay compensation for stale embedding gradients (DC-ASGD, S. Zheng et al., *Asynchronous Stochastic
Gradient Descent with Delay Compensation*, ICML 2017), adaptive form.

With staleness tau the gradient g of step t was evaluated at the rows w_then of step t's lookup and is
applied at the end of step t + tau to rows w_now, which already hold the updates applied in between. The
first-order Taylor term of the gradient at w_now, with the Hessian's diagonal approximated by g * g, gives

    g_c = g + lam * g * g * (w_now - w_then),      lam = lam0 / sqrt(v)

where v is the row optimizer's second moment (the running mean of g^2: the paper's "-a" variant, which
makes lam0 free of the gradient's scale). w_now - w_then is the sum of the row deltas of the updates
applied since step t's lookup: every replica applies the same updates in the same order, so the
correction is the same on every replica and they stay bit-identical.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class DelayCompensated:
    """Wraps a RowAdam's `apply` (lazy: only touched rows move) with the correction above. `submitted()`
    marks a gradient as it leaves its step (no update is applied between a step's lookup and its
    gradient's submission); gradients are applied in the order they were submitted."""

    def __init__(self, row_opt, lam0: float, tau: int):
        if not row_opt.lazy:
            raise ValueError("delay compensation needs the lazy row update (only touched rows move)")
        self.opt, self.lam0 = row_opt, np.float32(lam0)
        self.applied = 0                              # applications so far
        self.waiting = deque()                        # per submitted gradient: applications before its lookup
        self.recent = deque(maxlen=tau + 2)           # (index, slots, row deltas) of the last applications

    def submitted(self):
        self.waiting.append(self.applied)

    def drift(self, slots: np.ndarray, since: int) -> np.ndarray:
        """w_now - w_then for `slots` (distinct): the deltas of the applications numbered `since` onwards."""
        out = np.zeros((len(slots), self.opt.rows.shape[1]), np.float32)
        if since < self.applied and self.recent[0][0] > since:
            raise RuntimeError(f"delay compensation: the update of application {since} is no longer held")
        for index, s, delta in self.recent:
            if index >= since:
                _, i, j = np.intersect1d(slots, s, assume_unique=True, return_indices=True)
                out[i] += delta[j]
        return out

    def apply(self, slots: np.ndarray, grads: np.ndarray):
        drift = self.drift(slots, self.waiting.popleft())
        if self.lam0 and drift.any():
            v = self.opt.v[slots]
            scale = np.where(v > 0, self.lam0 / np.sqrt(np.maximum(v, np.float32(1e-30))), np.float32(0.0))
            grads = (grads + scale * grads * grads * drift).astype(np.float32)
        before = self.opt.rows[slots]
        self.opt.apply(slots, grads)
        self.recent.append((self.applied, slots.copy(), self.opt.rows[slots] - before))
        self.applied += 1
