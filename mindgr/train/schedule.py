"""The learning rate of each step: train.lr, optionally warmed up and decayed.

    warm-up (step s = 1..W, W = train.warmup_steps):  lr_s = train.lr * s / W
    constant:                                          lr_s = train.lr
    cosine, after the warm-up:                         lr_s = train.lr * (f + (1 - f) * (1 + cos(pi * x)) / 2),
                                                       x = (s - W) / (S - W) clipped to [0, 1], f = train.lr_floor

where S is the run's horizon: train.epochs times the batches of an epoch, or train.max_steps if that is
smaller. Steps count from 1 (the first optimizer step). The rate is a function of the step alone, so a
resumed run continues the same curve; raising train.epochs on resume stretches it from there on.
The trainer sets it before every step (Executor.set_learning_rate) when the schedule is not a plain
constant; a constant run never touches the optimizer's rate.
"""
from __future__ import annotations

import math


def is_constant(train_cfg) -> bool:
    return train_cfg.lr_schedule == "constant" and train_cfg.warmup_steps == 0


def horizon(train_cfg, batches_per_epoch: int) -> int:
    """S: the step the schedule ends at."""
    total = train_cfg.epochs * max(int(batches_per_epoch), 1)
    return min(total, train_cfg.max_steps) if train_cfg.max_steps else total


def learning_rate(train_cfg, step: int, total_steps: int) -> float:
    """lr of optimizer step `step` (1-based) of a run of `total_steps` steps."""
    t = train_cfg
    warm = t.warmup_steps
    if warm and step <= warm:
        return t.lr * step / warm
    if t.lr_schedule == "constant":
        return t.lr
    if t.lr_schedule == "cosine":
        x = min(max((step - warm) / max(total_steps - warm, 1), 0.0), 1.0)
        return t.lr * (t.lr_floor + (1.0 - t.lr_floor) * 0.5 * (1.0 + math.cos(math.pi * x)))
    raise ValueError(f"train.lr_schedule = {t.lr_schedule!r}: expected constant or cosine")
