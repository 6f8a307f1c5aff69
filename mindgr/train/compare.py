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

Alignment measures (`alignment` in the result, a Holm family of its own): on data with values, hit@K split
by the target's own value (`by_value`, mindgr.train.value_split); for generative runs, the mean score of
the top-K lists under a judge reward model and the lists' catalogue coverage (`judge`, `coverage`,
mindgr.train.judge).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mindgr.train.bootstrap import holm, paired_bootstrap  # noqa: F401  (compare's API)
from mindgr.train.metrics import per_user_metrics


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
    w = max([9] + [len(m) for m in list(result["metrics"]) + list(result.get("alignment") or {})])
    lines.append(f"{'metric':{w}s} {'A':>8s} {'B':>8s} {'B - A':>9s}  {'95% interval of B - A':>22s} {'p':>6s}"
                 f" {'Holm p':>6s}  verdict (raw interval; Holm over {len(result['metrics'])} metrics)")
    for m, r in result["metrics"].items():
        lo, hi = r["ci95"]
        verdict = "B better" if lo > 0 else "A better" if hi < 0 else "not distinguishable"
        if verdict != "not distinguishable":
            verdict += ", survives Holm" if r.get("holm") else ", not after Holm"
        lines.append(f"{m:{w}s} {r['a']:8.4f} {r['b']:8.4f} {r['diff']:+9.4f}  [{lo:+.4f}, {hi:+.4f}] "
                     f"{r['p']:6.3f} {r.get('p_holm', float('nan')):6.3f}  {verdict}")
    extra = result.get("alignment")
    if extra:
        lines.append(f"alignment measures (Holm over these {len(extra)}):")
        for m, r in extra.items():
            lo, hi = r["ci95"]
            verdict = "B higher" if lo > 0 else "B lower" if hi < 0 else "not distinguishable"
            if verdict != "not distinguishable":
                verdict += ", survives Holm" if r.get("holm") else ", not after Holm"
            users = r.get("users")
            users = f"  ({'/'.join(map(str, users)) if isinstance(users, list) else users} users)" if users else ""
            a_b = f"{r['a']:8.4f} {r['b']:8.4f}" if "a" in r else f"{'':8s} {'':8s}"
            lines.append(f"{m:{w}s} {a_b} {r['diff']:+9.4f}  [{lo:+.4f}, {hi:+.4f}] {r['p']:6.3f} "
                         f"{r.get('p_holm', float('nan')):6.3f}  {verdict}{users}")
    if result.get("runs", [1, 1]) != [1, 1]:     # several seeds: show each run's mean beside the pooled figure
        lines.append(f"per run (A: {result['runs'][0]} runs, B: {result['runs'][1]} runs; A and B means in "
                     "the order given)")
        for m, r in result["metrics"].items():
            lines.append(f"{m:{w}s} A " + " ".join(f"{v:.4f}" for v in r["a_runs"])
                         + "   B " + " ".join(f"{v:.4f}" for v in r["b_runs"]))
    return "\n".join(lines)


def compare_runs(runs_a, runs_b, split: str = "test", which: str = "best", samples: int = 5000,
                 filter_history: bool | None = None, max_users: int | None = None, by_value=None,
                 value_metric: str = "hr@10", judge=None, coverage: bool = False, list_k: int = 10) -> dict:
    """Evaluate every run (their per-user ranks are saved under RUN/ranks/) and compare side A with side B;
    a side is one run directory or a list of them (seeds of one setting). filter_history: None = each run's
    eval.filter_history. The metrics compared are the K every run evaluated (a generative run's list is
    only eval.beam long). max_users: generative runs decode (or reuse the ranks of) `mindgr eval --max-users`'s
    fixed sample of users; encoder runs rank everyone, and the pairing keeps the users both sides ranked.
    by_value: value groups (mindgr.train.value_split.parse_groups) to split `value_metric` by; judge: a
    reward run scoring each run's top-list_k lists; coverage: the lists' catalogue coverage (also with judge)."""
    from mindgr.train.run_eval import evaluate_any_run
    from mindgr.train.tasks import resolve_run
    sides = [[runs] if isinstance(runs, (str, Path)) else list(runs) for runs in (runs_a, runs_b)]
    for runs in sides:                  # checked for both sides before any (slow) evaluation
        if not runs or any(not str(run) for run in runs):
            raise ValueError(f"a side of the comparison names an empty run directory ({runs}): give DIR or "
                             "DIR1,DIR2,... without empty entries")
    if by_value is not None:
        from mindgr.train.value_split import parse_groups
        by_value = parse_groups(by_value)           # a bad spec fails before any evaluation
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
    if by_value is not None or judge is not None or coverage:
        files = [[r["ranks_file"] for r in side] for side in evaluated]
        both = np.all([entry[0] >= 0 for side in loaded for entry in side], 0)
        out["alignment"] = _add_holm(alignment_measures(sides, files, both, split, samples, by_value, value_metric,
                                                        judge, coverage, list_k, which))
    info = [[{"run": str(run), "checkpoint": r["checkpoint"]} for run, r in zip(runs, side)]
            for runs, side in zip(sides, evaluated)]
    out.update(split=split, a=info[0][0] if len(info[0]) == 1 else info[0],
               b=info[1][0] if len(info[1]) == 1 else info[1])
    return out


def _ranks_array(run, path, key: str, why: str) -> tuple:
    """(array `key` of a ranks file, whether the file is history-filtered); a one-line error without it."""
    with np.load(path) as f:
        if key not in f.files:
            raise ValueError(f"{run}: its ranks file {Path(path).name} holds no {key} ({why})")
        return f[key], bool(f["filter_history"]) if "filter_history" in f.files else True


TARGET_LOGP = "target_logp"   # --by-value-metric: log p(held-out target | history), generative runs only


def _target_log_probs(run, split: str, which: str, rows) -> np.ndarray:
    """log p(target | history) [len(rows)] of a generative run's checkpoint (`which`) for the split's users `rows`
    (mindgr.train.gr_eval.target_log_probs); another kind of run is a one-line error."""
    from mindgr.train.data import RunData
    from mindgr.train.generative import load_generative_run
    from mindgr.train.gr_eval import target_log_probs
    from mindgr.train.tasks import resolve_run
    task = resolve_run(run)
    if task.serving != "generative":
        raise ValueError(f"--by-value-metric {TARGET_LOGP}: {run} is a {task.name} run; the "
                         "target's log-probability is a generative run's")
    loaded = load_generative_run(run, which)
    evalset = getattr(RunData(loaded.cfg).split, split)
    return target_log_probs(loaded.decoder, loaded.codes, evalset, rows, loaded.max_history,
                            loaded.cfg.eval.batch_size)


def alignment_measures(sides, files, both, split, samples, by_value, value_metric, judge, coverage,
                       list_k, which: str = "best") -> dict:
    """The alignment family of `compare_runs`: {name: bootstrap result} over the users every run evaluated
    (`both`): by value group (value_split), judge reward and coverage of the top-list_k lists (judge)."""
    out = {}
    if by_value is not None:
        from mindgr.train.value_split import compare_by_value
        values = [[_ranks_array(run, f, "target_values", "--by-value needs data with a value per interaction, "
                                "e.g. ratings")[0] for run, f in zip(runs, side)] for runs, side in zip(sides, files)]
        k = int(value_metric.split("@")[1]) if "@" in value_metric else 0
        per_user = []
        for runs, side in zip(sides, files):
            rows = []
            for run, f in zip(runs, side):
                if value_metric == TARGET_LOGP:
                    rows.append(_target_log_probs(run, split, which, np.flatnonzero(both)))
                    continue
                ranks, ties, _ = load_ranks(f)
                got = per_user_metrics(ranks[both], [k] if k else [1], ties[both])
                if value_metric not in got:
                    raise ValueError(f"--by-value-metric {value_metric}: one of {', '.join(got)} (K of the run) "
                                     f"or {TARGET_LOGP}")
                rows.append(got[value_metric])
            per_user.append(np.stack(rows))
        out.update(compare_by_value(per_user[0], per_user[1], values[0][0][both], by_value, value_metric, samples))
    if judge is not None or coverage:
        from mindgr.train.data import RunData
        from mindgr.train.judge import coverage_bootstrap, judge_rewards, load_judge, top_lists
        from mindgr.train.rundir import run_config
        if list_k < 1:
            raise ValueError(f"--list-k {list_k}: at least 1")
        data = RunData(run_config(Path(sides[0][0])))
        evalset = getattr(data.split, split)
        rows = np.flatnonzero(both)
        hist = [evalset.histories[r] for r in rows]
        targets = np.asarray(evalset.targets)[rows]
        tops = []
        for runs, side in zip(sides, files):
            tops.append([])
            for run, f in zip(runs, side):
                lists, filtered = _ranks_array(run, f, "lists", "the top-K lists are kept by generative runs' "
                                               "evaluation; an older ranks file: run `mindgr eval` again")
                if lists.shape[1] < list_k:
                    raise ValueError(f"{run}: its lists hold {lists.shape[1]} items, fewer than --list-k {list_k}")
                tops[-1].append(top_lists(lists[rows], targets, hist if filtered else None, list_k))
        out[f"coverage@{list_k}"] = coverage_bootstrap(tops[0], tops[1], data.num_items, min(samples, 1000))
        if judge is not None:
            scorer = load_judge(judge, data.num_items, sides[0][0])
            hv = getattr(evalset, "history_values", None)
            if scorer.uses_values and hv is None:
                raise ValueError(f"--judge {judge}: the judge reads the history's values and the data has none")
            hv = [hv[r] for r in rows] if scorer.uses_values else None
            scores = [np.stack([judge_rewards(scorer, hist, hv, t) for t in side]) for side in tops]
            seen = np.isfinite(scores[0]).all(0) & np.isfinite(scores[1]).all(0)
            out[f"judge reward@{list_k}"] = dict(paired_bootstrap(scores[0][:, seen], scores[1][:, seen], samples),
                                                users=int(seen.sum()), judge=str(judge))
    return out
