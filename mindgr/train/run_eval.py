"""`mindgr eval` of any run: the run's task (mindgr.train.tasks.resolve_run) evaluates it (an item-encoder
run is ranked by dot products, a generative run decoded by beam search); every task writes the same
per-user ranks files (RUN/ranks/), which `mindgr compare` pairs."""
from __future__ import annotations


def evaluate_any_run(run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                     filter_history: bool | None = None, max_users: int | None = None) -> dict:
    """max_users: a task that decodes (Task.samples_users) decodes a fixed seeded sample of that many users
    (0 = all; None = the run's eval.test_max_users for the test split); the other users' ranks are -1 (left
    out by `mindgr compare`)."""
    from mindgr.train.tasks import resolve_run
    return resolve_run(run_dir).evaluate_run(run_dir, split, which, allow_data_change, filter_history, max_users)


_META = ("run", "split", "checkpoint", "step", "filter_history", "count", "ranks_file")


def format_eval(result: dict) -> str:
    """`mindgr eval`'s table: what was evaluated, one metric per line, then notes and the ranks file."""
    history = ""
    if "filter_history" in result:
        mode = result["filter_history"]
        history = (", history skipped by the decode" if mode == "search" else ", history filtered" if mode
                   else ", history not filtered")
    lines = [f"{result['run']}: {result['split']} split, checkpoint {result['checkpoint']} (step {result.get('step')}), "
             f"{result.get('count', 0)} users{history}"]
    metrics = {k: v for k, v in result.items() if k not in _META and isinstance(v, (int, float))
               and not isinstance(v, bool)}
    for name, base in result.items():           # a reward run's baselines: {name}_baseline -> its metrics
        if name.endswith("_baseline") and isinstance(base, dict):
            metrics.update({f"{name[:-len('_baseline')]} {k}": v for k, v in base.items()
                            if k in ("rmse", "mae", "auc") and isinstance(v, float)})
    width = max([6] + [len(k) for k in metrics])
    lines.append(f"  {'metric':{width}s}  value")
    lines += [f"  {k:{width}s}  {v:.4f}" if isinstance(v, float) else f"  {k:{width}s}  {v}" for k, v in metrics.items()]
    decode = result.get("decode")
    if isinstance(decode, dict):
        if "reused" in decode:
            lines.append(f"  decode: reused the ranks of the same checkpoint ({decode['reused']})")
        elif "users_per_s" in decode:
            lines.append(f"  decode: {decode.get('users')} users, beam {decode.get('beam')}, "
                         f"{decode['users_per_s']:.0f} users/s")
    lines += [f"  {k.replace('_', ' ')}: {v}" for k, v in result.items() if isinstance(v, str) and k.endswith("note")]
    if "ranks_file" in result:
        lines.append(f"  per-user ranks: {result['ranks_file']}")
    if "predictions_file" in result:
        lines.append(f"  per-user predictions: {result['predictions_file']}")
    return "\n".join(lines)
