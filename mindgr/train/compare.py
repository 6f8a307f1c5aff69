"""Paired comparison of two runs on the same evaluation users (`mindgr compare RUN_A RUN_B`).

Test metrics of two runs differ by seed noise as much as by method: on ML-1M (6,040 test users) the
standard error of HR@10 is about 0.006. Both runs rank the SAME users' targets, so the difference is
judged per user: d_u = m_B(u) - m_A(u) for each per-user metric (hit@K, the NDCG@K gain, 1/rank), and
a paired bootstrap over users (resampling users with replacement) gives a 95% interval of mean(d).
An interval that contains 0 means the two runs are not distinguishable on that metric with these users.

Several runs per side (seeds of one setting, `mindgr compare A1,A2 B1,B2`): a side's per-user value is the
mean over its runs, and each bootstrap sample also redraws every side's runs with replacement, so the
interval carries the spread between seeds as well as between users (with 2-3 seeds only roughly; the
per-run means are reported beside it).

Many metrics are compared at once (eight or more), so one of them clears 5% by chance far more often than
5% of the time: beside each raw interval, the Holm step-down correction over all the metrics compared says
which differences survive at a family-wise 5% level (`holm`).

Extra per-user metrics that every compared ranks file carries (a GR run with a page holdout writes its
page recall@K) are compared the same way, over the users every run evaluated.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mindgr.train.metrics import per_user_metrics


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


def _add_holm(metrics: dict) -> dict:
    for name, (adjusted, survives) in holm({k: r["p"] for k, r in metrics.items()}).items():
        metrics[name].update(p_holm=adjusted, holm=survives)
    return metrics


def load_ranks(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, ties, targets) of a RUN/ranks/*.npz file. Files written before ranks were tie-aware hold
    no ties: they are read with ties = 0 (the strict rank they were computed with)."""
    with np.load(path) as f:
        ranks = f["ranks"]
        ties = f["ties"] if "ties" in f.files else np.where(ranks >= 0, 0, -1)
        return ranks, ties, f["targets"]


def _user_metrics(path) -> dict:
    """Extra per-user metrics a ranks file carries (a GR run's page recall: mindgr.train.gr_eval)."""
    from mindgr.train.gr_eval import user_metrics_of
    with np.load(path) as f:
        return {k: np.asarray(v, np.float64) for k, v in user_metrics_of(f).items()}


def compare_ranks(ranks_a, targets_a, ranks_b, targets_b, ks=(1, 10, 50, 200), samples: int = 5000,
                  seed: int = 0, ties_a=None, ties_b=None) -> dict:
    """Paired comparison of two runs' per-user ranks ([U], or [S, U] for S runs of one side) and ties
    (same shapes; None = no ties); every run must rank the same targets of the same users. Users some
    run did not rank are left out."""
    if len(targets_a) != len(targets_b) or not np.array_equal(targets_a, targets_b):
        raise ValueError(f"the two runs were evaluated on different users or targets ({len(targets_a)} vs "
                         f"{len(targets_b)} users): compare runs of the same data and split")
    ranks_a, ranks_b = np.atleast_2d(ranks_a), np.atleast_2d(ranks_b)
    ties_a = np.zeros_like(ranks_a) if ties_a is None else np.atleast_2d(ties_a)
    ties_b = np.zeros_like(ranks_b) if ties_b is None else np.atleast_2d(ties_b)
    both = (ranks_a >= 0).all(0) & (ranks_b >= 0).all(0)
    per_run = [[per_user_metrics(r[both], ks, t[both]) for r, t in zip(side, side_ties)]
               for side, side_ties in ((ranks_a, ties_a), (ranks_b, ties_b))]
    metrics = {m: paired_bootstrap(np.stack([r[m] for r in per_run[0]]), np.stack([r[m] for r in per_run[1]]),
                                   samples, seed) for m in per_run[0][0]}
    return {"users": int(both.sum()), "samples": samples, "runs": [len(ranks_a), len(ranks_b)],
            "metrics": _add_holm(metrics)}


def format_comparison(result: dict, name_a: str, name_b: str) -> str:
    lines = [f"paired comparison over {result['users']} users ({result['samples']} bootstrap samples); "
             f"A = {name_a}, B = {name_b}",
             ]
    w = max([9] + [len(m) for m in result["metrics"]])
    lines.append(f"{'metric':{w}s} {'A':>8s} {'B':>8s} {'B - A':>9s}  {'95% interval of B - A':>22s} {'p':>6s}"
                 f" {'Holm p':>6s}  verdict (raw interval; Holm over {len(result['metrics'])} metrics)")
    for m, r in result["metrics"].items():
        lo, hi = r["ci95"]
        verdict = "B better" if lo > 0 else "A better" if hi < 0 else "not distinguishable"
        if verdict != "not distinguishable":
            verdict += ", survives Holm" if r.get("holm") else ", not after Holm"
        lines.append(f"{m:{w}s} {r['a']:8.4f} {r['b']:8.4f} {r['diff']:+9.4f}  [{lo:+.4f}, {hi:+.4f}] "
                     f"{r['p']:6.3f} {r.get('p_holm', float('nan')):6.3f}  {verdict}")
    if result.get("runs", [1, 1]) != [1, 1]:     # several seeds: show each run's mean beside the pooled figure
        lines.append(f"per run (A: {result['runs'][0]} runs, B: {result['runs'][1]} runs; A and B means in "
                     "the order given)")
        for m, r in result["metrics"].items():
            lines.append(f"{m:{w}s} A " + " ".join(f"{v:.4f}" for v in r["a_runs"])
                         + "   B " + " ".join(f"{v:.4f}" for v in r["b_runs"]))
    return "\n".join(lines)


def compare_runs(runs_a, runs_b, split: str = "test", which: str = "best", samples: int = 5000,
                 filter_history: bool | None = None, max_users: int | None = None) -> dict:
    """Evaluate every run (their per-user ranks are saved under RUN/ranks/) and compare side A with side B;
    a side is one run directory or a list of them (seeds of one setting). filter_history: None = each run's
    eval.filter_history. The metrics compared are the K every run evaluated (a generative run's list is
    only eval.beam long). max_users: generative runs decode (or reuse the ranks of) `mindgr eval --max-users`'s
    fixed sample of users; encoder runs rank everyone, and the pairing keeps the users both sides ranked."""
    from mindgr.train.run_eval import evaluate_any_run
    from mindgr.train.tasks import resolve_run
    sides = [[runs] if isinstance(runs, (str, Path)) else list(runs) for runs in (runs_a, runs_b)]
    for runs in sides:                  # checked for both sides before any (slow) evaluation
        if not runs or any(not str(run) for run in runs):
            raise ValueError(f"a side of the comparison names an empty run directory ({runs}): give DIR or "
                             "DIR1,DIR2,... without empty entries")
    for run in (run for runs in sides for run in runs):
        if not resolve_run(run).ranks_users:
            raise ValueError(f"{run}: a {resolve_run(run).name} run ranks no items per user: `mindgr compare` "
                             "pairs retrieval or generative runs (use `mindgr eval` for its metrics)")

    def evaluate(run):
        sample = max_users if max_users is None or resolve_run(run).samples_users else 0
        return evaluate_any_run(Path(run), split, which, filter_history=filter_history, max_users=sample)
    evaluated = [[evaluate(run) for run in runs] for runs in sides]
    loaded = [[load_ranks(r["ranks_file"]) for r in side] for side in evaluated]
    targets = loaded[0][0][2]
    for runs, side in zip(sides, loaded):
        for run, (_, _, other) in zip(runs, side):
            if not np.array_equal(other, targets):
                raise ValueError(f"{run} was evaluated on other users or targets than {sides[0][0]}: "
                                 "compare runs of the same data and split")
    ks = sorted(set.intersection(*[{int(k.split("@")[1]) for k in r if k.startswith("hr@")}
                                   for side in evaluated for r in side]))
    stacked = [[np.stack([entry[i] for entry in side]) for i in (0, 1)] for side in loaded]
    out = compare_ranks(stacked[0][0], targets, stacked[1][0], targets, ks, samples,
                        ties_a=stacked[0][1], ties_b=stacked[1][1])
    extra = [[_user_metrics(r["ranks_file"]) for r in side] for side in evaluated]
    for name in sorted(set.intersection(*[set(m) for side in extra for m in side])):   # e.g. page recall
        a, b = (np.stack([m[name] for m in side]) for side in extra)
        seen = (a >= 0).all(0) & (b >= 0).all(0)
        if seen.any():
            out["metrics"][name] = paired_bootstrap(a[:, seen], b[:, seen], samples)
    _add_holm(out["metrics"])          # over every metric compared, the extra ones included
    info = [[{"run": str(run), "checkpoint": r["checkpoint"]} for run, r in zip(runs, side)]
            for runs, side in zip(sides, evaluated)]
    out.update(split=split, a=info[0][0] if len(info[0]) == 1 else info[0],
               b=info[1][0] if len(info[1]) == 1 else info[1])
    return out
