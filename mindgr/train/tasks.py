"""The task registry: which task (mindgr.train.task) a config trains and a saved run holds. This is the one
place that decides "is this a generative run?"; everything else asks the task it gets.

A new task is one entry of TASKS: its name, the function that says whether a config is one of its runs,
and its class (imported when first asked, so that no task's dependencies load for another's runs). The
entries are tried in order; the last one takes every config.
"""
from __future__ import annotations

from pathlib import Path


def _generative_config(cfg) -> bool:
    """The GR decoder (model.arch gr) or a generative objective (next-token prediction of semantic IDs)."""
    from mindgr.models.objectives import GENERATIVE_ARCH, _OBJECTIVES
    spec = _OBJECTIVES.get(cfg.loss.objective)
    return cfg.model.arch == GENERATIVE_ARCH or bool(spec is not None and spec.generative)


def _alignment_config(cfg) -> bool:
    """GRPO-SR preference alignment of a trained GR run (loss.objective grpo_sr)."""
    return cfg.loss.objective == "grpo_sr"


def _alignment_task():
    from mindgr.train.alignment import AlignmentTask
    return AlignmentTask


def _generative_task():
    from mindgr.train.generative import GenerativeTask
    return GenerativeTask


def _reward_config(cfg) -> bool:
    """The reward model: an item encoder regressing observed values (loss.objective rating)."""
    return cfg.loss.objective == "rating"


def _reward_task():
    from mindgr.train.reward import RewardTask
    return RewardTask


def _retrieval_task():
    from mindgr.train.task import RetrievalTask
    return RetrievalTask


# name, whether a config is this task's, its class
TASKS = (
    ("reward", _reward_config, _reward_task),
    ("alignment", _alignment_config, _alignment_task),
    ("generative", _generative_config, _generative_task),
    ("retrieval", lambda cfg: True, _retrieval_task),
)


def task_name(cfg) -> str:
    return next(name for name, claims, _ in TASKS if claims(cfg))


def task_class(cfg):
    """The Task class that trains `cfg` (its classmethods load and evaluate saved runs)."""
    return next(load() for _, claims, load in TASKS if claims(cfg))


def resolve_task(cfg):
    """A fresh task for a config (data not loaded yet: Task.load)."""
    return task_class(cfg)(cfg)


def resolve_run(run_dir):
    """The Task class of a saved run (read from RUN/config.yaml)."""
    from mindgr.train.rundir import run_config
    return task_class(run_config(Path(run_dir)))
