"""Next-item metrics split by the target's own value (`mindgr compare --by-value`): did a change of model
move hits toward the targets the user valued and away from those they did not?

On data with a value per interaction (MovieLens ratings), each evaluated user's held-out target has the
value the user gave it. A group is a closed interval of values, `NAME=LO:HI` (either end may be left open:
`liked=4:` is value >= 4, `disliked=:2` is value <= 2). For each group, the per-user metric (hit@10 by
default) of the users whose target falls in it is compared between A and B by the paired bootstrap of
mindgr.train.bootstrap. The first two groups also give the difference of their changes,
(B - A on the first) - (B - A on the second), with a bootstrap interval that redraws the users of each
group separately (the groups are disjoint sets of users; with several runs per side, the runs are redrawn
once per sample, the same draw for both groups: a seed's quality moves both groups together).
"""
from __future__ import annotations

import numpy as np

from mindgr.train.bootstrap import paired_bootstrap

DEFAULT_GROUPS = ("liked=4:", "disliked=:2")


def parse_groups(words) -> list:
    """["liked=4:", "disliked=:2"] -> [("liked", 4.0, inf), ("disliked", -inf, 2.0)]; bad words are a
    one-line ValueError. No words: DEFAULT_GROUPS."""
    groups = []
    for word in (list(words) or list(DEFAULT_GROUPS)):
        name, eq, span = str(word).partition("=")
        lo, colon, hi = span.partition(":")
        if not eq or not colon or not name.strip():
            raise ValueError(f"--by-value {word!r}: expected NAME=LO:HI (e.g. liked=4: disliked=:2; an end may "
                             "be left open)")
        try:
            bounds = (float(lo) if lo.strip() else -np.inf, float(hi) if hi.strip() else np.inf)
        except ValueError:
            raise ValueError(f"--by-value {word!r}: the bounds must be numbers (NAME=LO:HI)") from None
        if bounds[0] > bounds[1]:
            raise ValueError(f"--by-value {word!r}: the lower bound is above the upper one")
        if name.strip() in [g[0] for g in groups]:
            raise ValueError(f"--by-value: the group name {name.strip()!r} is given twice")
        groups.append((name.strip(), *bounds))
    return groups


def group_masks(values: np.ndarray, groups) -> dict:
    """{name: [U] bool}: the users whose target value lies in the group's closed interval."""
    values = np.asarray(values, np.float64)
    return {name: (values >= lo) & (values <= hi) for name, lo, hi in groups}


def contrast_bootstrap(a1, b1, a2, b2, samples: int = 5000, seed: int = 0, chunk: int = 500) -> dict:
    """(mean(b1) - mean(a1)) - (mean(b2) - mean(a2)) over two disjoint groups of users, each [U_g] (one run
    per side) or [S, U_g] (S runs per side), with its 95% bootstrap interval and two-sided p-value: each
    sample redraws the users of each group with replacement (and the runs of each side, one draw shared by
    both groups)."""
    sides = [np.atleast_2d(np.asarray(x, np.float64)) for x in (a1, b1, a2, b2)]
    if samples < 1:
        raise ValueError(f"bootstrap samples = {samples}: need at least 1 (e.g. --samples 5000)")
    n1, n2 = sides[0].shape[1], sides[2].shape[1]
    if n1 == 0 or n2 == 0:
        raise ValueError("a value group holds no evaluated user: nothing to compare in it")
    s_a, s_b = len(sides[0]), len(sides[1])
    rng = np.random.default_rng(seed)
    out = []
    for lo in range(0, samples, chunk):
        c = min(chunk, samples - lo)
        u1, u2 = rng.integers(0, n1, (c, n1)), rng.integers(0, n2, (c, n2))
        means = [np.stack([r[u].mean(1) for r in side]) for side, u in zip(sides, (u1, u1, u2, u2))]   # [S, c]
        if s_a == s_b == 1:
            pooled = [m[0] for m in means]
        else:
            pick_a, pick_b = rng.integers(0, s_a, (s_a, c)), rng.integers(0, s_b, (s_b, c))
            pooled = [np.take_along_axis(m, pick, 0).mean(0)
                      for m, pick in zip(means, (pick_a, pick_b, pick_a, pick_b))]
        out.append((pooled[1] - pooled[0]) - (pooled[3] - pooled[2]))
    out = np.concatenate(out)
    lo, hi = np.quantile(out, [0.025, 0.975])
    point = (sides[1].mean() - sides[0].mean()) - (sides[3].mean() - sides[2].mean())
    p = min(1.0, 2.0 * min((out <= 0).mean(), (out >= 0).mean()))
    return {"diff": float(point), "ci95": [float(lo), float(hi)], "p": float(p), "users": [int(n1), int(n2)]}


def compare_by_value(per_user_a, per_user_b, values, groups, metric: str = "hr@10", samples: int = 5000,
                     seed: int = 0) -> dict:
    """per_user_a / per_user_b: [S, U] per-user values of `metric` for each run of a side, over users every
    run evaluated; values [U]: their targets' values. Returns {"METRIC NAME": paired bootstrap of the
    group's users (with its user count), "METRIC NAME1 - NAME2 change": contrast_bootstrap of the first two
    groups}."""
    a, b = np.atleast_2d(per_user_a), np.atleast_2d(per_user_b)
    values = np.asarray(values, np.float64)
    if not np.isfinite(values).all():
        raise ValueError("--by-value: some evaluated targets have no value")
    masks = group_masks(values, groups)
    out = {}
    for name, mask in masks.items():
        if not mask.any():
            raise ValueError(f"--by-value: group {name!r} holds no evaluated user (no target value in "
                             f"its interval)")
        out[f"{metric} {name}"] = dict(paired_bootstrap(a[:, mask], b[:, mask], samples, seed), users=int(mask.sum()))
    if len(groups) >= 2:
        (n1, _, _), (n2, _, _) = groups[:2]
        if (masks[n1] & masks[n2]).any():
            raise ValueError(f"--by-value: groups {n1!r} and {n2!r} overlap; the difference of their changes "
                             "needs disjoint groups")
        m1, m2 = masks[n1], masks[n2]
        out[f"{metric} {n1} - {n2} change"] = contrast_bootstrap(a[:, m1], b[:, m1], a[:, m2], b[:, m2], samples,
                                                                 seed)
    return out
