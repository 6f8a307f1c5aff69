"""List-level measures of a generative run's recommendations (`mindgr compare --judge / --coverage`).

A GR run's ranks files keep each user's decoded list (mindgr.train.gr_eval.LIST_KEEP items, before history
filtering). Its top-K list is what the user would be shown: the list's items in order, dead slots dropped
and, when the ranks file is history-filtered, the user's history items other than the target dropped
(as its hit@K counts them, mindgr.generate.beam.beam_ranks); then the first K. From those lists:
- judge reward: the mean score of a user's top-K items under a reward model (`--judge REWARD_RUN`, a run of
  loss.objective rating on the same data; for an honest judge, not the one the aligned run optimised:
  another seed, or a model of other users), per user, paired between A and B;
- catalogue coverage: the distinct items in all users' top-K lists over the catalogue size.
"""
from __future__ import annotations

import numpy as np


def top_lists(lists, targets, histories, k: int) -> np.ndarray:
    """[U, k] int64, each user's first k listed items (0 = fewer than k left); lists [U, W] int (0 = dead
    slot); histories: U arrays of items to drop (other than that user's target), or None."""
    lists = np.asarray(lists)
    out = np.zeros((len(lists), k), np.int64)
    for u, row in enumerate(lists.tolist()):
        seen = set(int(i) for i in histories[u]) - {int(targets[u])} if histories is not None else set()
        kept = [it for it in row if it != 0 and it not in seen][:k]
        out[u, : len(kept)] = kept
    return out


def coverage(top: np.ndarray, num_items: int) -> float:
    """Distinct items (1..num_items) in the lists `top` [U, k] (0 = empty slot) over num_items."""
    items = np.unique(np.asarray(top)[np.asarray(top) > 0])
    return len(items) / float(num_items)


def coverage_bootstrap(tops_a, tops_b, num_items: int, samples: int = 1000, seed: int = 0) -> dict:
    """Coverage of each side (the mean over its runs' [U, k] lists) and B - A with a 95% interval that
    redraws the users (the same users on both sides). Distinct items of a resample of U users are fewer
    than of the U users themselves, so the interval is of the difference under resampling, centred near
    but not exactly on the observed difference."""
    tops_a, tops_b = [np.asarray(t) for t in tops_a], [np.asarray(t) for t in tops_b]
    n = tops_a[0].shape[0]
    if n == 0:
        raise ValueError("no user was evaluated by both runs: nothing to compare")
    cov_a = [coverage(t, num_items) for t in tops_a]
    cov_b = [coverage(t, num_items) for t in tops_b]
    rng = np.random.default_rng(seed)

    def drawn(tops, users):
        seen = np.zeros(num_items + 1, bool)
        vals = []
        for t in tops:
            seen[:] = False
            seen[t[users].ravel()] = True
            vals.append(seen[1:].sum() / float(num_items))
        return float(np.mean(vals))
    diffs = np.empty(samples)
    for s in range(samples):
        users = rng.integers(0, n, n)
        diffs[s] = drawn(tops_b, users) - drawn(tops_a, users)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    p = min(1.0, 2.0 * min((diffs <= 0).mean(), (diffs >= 0).mean()))
    a, b = float(np.mean(cov_a)), float(np.mean(cov_b))
    out = {"a": a, "b": b, "diff": b - a, "ci95": [float(lo), float(hi)], "p": float(p)}
    if len(tops_a) > 1 or len(tops_b) > 1:
        out.update(a_runs=cov_a, b_runs=cov_b)
    return out


def judge_rewards(scorer, histories, history_values, top: np.ndarray) -> np.ndarray:
    """[U] float64: each user's mean reward-model score over its top-K items (NaN for an empty list).
    scorer: a mindgr.train.reward.RewardScorer; histories / history_values: each user's history and its
    values (None for a scorer that does not read them)."""
    top = np.asarray(top)
    filled = top > 0
    out = np.full(len(top), np.nan)
    users = np.flatnonzero(filled.any(1) & np.array([len(h) > 0 for h in histories], bool))
    if not len(users):
        return out
    items = np.where(filled[users], top[users], top[users, :1])     # empty slots: scored, then ignored
    values = None if history_values is None else [history_values[u] for u in users]
    scores = scorer.score([histories[u] for u in users], items, history_values=values)
    out[users] = (scores * filled[users]).sum(1) / filled[users].sum(1)
    return out


def load_judge(judge_run, num_items: int, run_dir):
    """The reward scorer of `judge_run`, checked against the compared runs' data (its fingerprint, the
    catalogue): one-line errors for a run that is not a reward model or was trained on other data."""
    import json
    from pathlib import Path
    from mindgr.train.checkpoint import CheckpointError
    from mindgr.train.data import FINGERPRINT_FILE
    from mindgr.train.reward import load_reward_scorer
    judge_run, run_dir = Path(judge_run), Path(run_dir)
    try:
        scorer = load_reward_scorer(judge_run, "best", setup=False)
    except CheckpointError as e:
        raise ValueError(f"--judge {judge_run}: {e}") from None
    fps = [p / FINGERPRINT_FILE for p in (judge_run, run_dir)]
    if all(p.is_file() for p in fps):
        own = [{k: v for k, v in json.loads(p.read_text()).items() if k not in ("align", "codes")} for p in fps]
        if own[0] != own[1]:
            raise ValueError(f"--judge {judge_run}: trained on other data than {run_dir} (data.json differs)")
    if scorer.num_items != num_items:
        raise ValueError(f"--judge {judge_run}: a reward model of {scorer.num_items} items, the compared runs "
                         f"have {num_items}")
    if scorer.uses_times:
        raise ValueError(f"--judge {judge_run}: a reward model with a time bias (model.time_bias); the judge "
                         "scores histories without times")
    return scorer
