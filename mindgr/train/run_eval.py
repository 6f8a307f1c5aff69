"""`mindgr eval` of any run: an item-encoder run is ranked by dot products (mindgr.train.trainer), a
generative run (model.arch gr) is decoded by beam search (mindgr.train.generative); both write the same
per-user ranks files (RUN/ranks/), which `mindgr compare` pairs."""
from __future__ import annotations

from pathlib import Path


def evaluate_any_run(run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                     filter_history: bool | None = None, max_users: int = 0) -> dict:
    """max_users: a generative run decodes a fixed seeded sample of that many users (0 = all); the other
    users' ranks are -1 (left out by `mindgr compare`)."""
    from mindgr.train.generative import evaluate_generative_run, is_generative_config
    from mindgr.train.trainer import evaluate_run, run_config
    if is_generative_config(run_config(Path(run_dir))):
        return evaluate_generative_run(run_dir, split, which, allow_data_change, filter_history, max_users)
    if max_users:
        raise ValueError("eval: --max-users applies to generative runs (model.arch gr) only")
    return evaluate_run(run_dir, split, which, allow_data_change, filter_history)
