"""The paired bootstrap over users and Holm's correction: what every paired comparison of runs rests on
(mindgr.train.compare, mindgr.train.value_split)."""
from __future__ import annotations

import numpy as np


def paired_bootstrap(a: np.ndarray, b: np.ndarray, samples: int = 5000, seed: int = 0,
                     chunk: int = 500) -> dict:
    """Mean of b - a over users, its 95% paired-bootstrap interval and the two-sided bootstrap p-value
    (twice the smaller share of resampled means on either side of 0). a and b are [U] per-user values of
    one run each, or [S, U] for S runs per side: then each sample also redraws each side's runs."""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if samples < 1:
        raise ValueError(f"bootstrap samples = {samples}: need at least 1 (e.g. --samples 5000)")
    n = a.shape[1]
    if n == 0:
        raise ValueError("no user was evaluated by both runs: nothing to compare")
    rng = np.random.default_rng(seed)
    means = []
    for lo in range(0, samples, chunk):
        users = rng.integers(0, n, (min(chunk, samples - lo), n))
        if len(a) == len(b) == 1:                 # one run per side: nothing to redraw, the plain paired bootstrap
            means.append((b[0][users] - a[0][users]).mean(1))
            continue
        side_means = []
        for runs in (a, b):                       # [S, chunk] user-resampled means of each run
            per_run = np.stack([r[users].mean(1) for r in runs])
            picks = rng.integers(0, len(runs), (len(runs), len(users)))
            side_means.append(np.take_along_axis(per_run, picks, 0).mean(0))
        means.append(side_means[1] - side_means[0])
    means = np.concatenate(means)
    lo, hi = np.quantile(means, [0.025, 0.975])
    p = min(1.0, 2.0 * min((means <= 0).mean(), (means >= 0).mean()))
    out = {"a": float(a.mean()), "b": float(b.mean()), "diff": float(b.mean() - a.mean()),
           "ci95": [float(lo), float(hi)], "p": float(p)}
    if len(a) > 1 or len(b) > 1:
        out.update(a_runs=[float(v) for v in a.mean(1)], b_runs=[float(v) for v in b.mean(1)])
    return out


def holm(pvalues: dict, alpha: float = 0.05) -> dict:
    """Holm's step-down correction of several p-values: {name: (adjusted p, survives at alpha)}. The i-th
    smallest p (0-based, m in all) is compared with alpha / (m - i), stopping at the first that fails;
    the adjusted p is the running maximum of min(1, (m - i) p_(i)), so `survives` = adjusted p <= alpha."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[name]))
        out[name] = (running, running <= alpha)
    return out
