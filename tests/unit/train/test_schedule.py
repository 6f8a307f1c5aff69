"""train.lr_schedule: the rate of each step (mindgr.train.schedule), the loop setting it step by step and
across a resume (a real compiled step reading it: tests/system/train/test_schedule_step.py)."""
import json
import math

import pytest

from loop_fixtures import toy_cfg, toy_executor
from mindgr.config import ConfigError, load_config
from mindgr.train import schedule

pytestmark = pytest.mark.graph_mode("reference")


def _train(*extra):
    return load_config(None, ["train.lr=0.01", *extra]).train


def test_constant_warmup_and_cosine_rates():
    const = _train()
    assert schedule.is_constant(const) and schedule.learning_rate(const, 7, 10) == 0.01
    warm = _train("train.warmup_steps=4")
    assert not schedule.is_constant(warm)
    assert [schedule.learning_rate(warm, s, 10) for s in (1, 2, 4, 5, 10)] == pytest.approx(
        [0.0025, 0.005, 0.01, 0.01, 0.01])
    cos = _train("train.lr_schedule=cosine", "train.warmup_steps=2", "train.lr_floor=0.1")
    # after the warm-up: x = (s - 2) / (12 - 2); lr = 0.01 * (0.1 + 0.9 * (1 + cos(pi x)) / 2)
    assert schedule.learning_rate(cos, 1, 12) == pytest.approx(0.005)          # warm-up: 1 / 2 of lr
    for s, x in ((2, 0.0), (7, 0.5), (12, 1.0), (30, 1.0)):
        expect = 0.01 * (0.1 + 0.9 * (1 + math.cos(math.pi * x)) / 2)
        assert schedule.learning_rate(cos, s, 12) == pytest.approx(expect, rel=1e-12)
    assert schedule.learning_rate(cos, 7, 12) == pytest.approx(0.0055)       # halfway: the mean of lr and floor
    rates = [schedule.learning_rate(cos, s, 12) for s in range(3, 13)]
    assert all(a > b for a, b in zip(rates, rates[1:]))                    # strictly decreasing to the floor


def test_horizon_is_the_epochs_or_max_steps_whichever_ends_first():
    assert schedule.horizon(_train("train.epochs=5"), 30) == 150
    assert schedule.horizon(_train("train.epochs=5", "train.max_steps=40"), 30) == 40
    assert schedule.horizon(_train("train.epochs=5", "train.max_steps=400"), 30) == 150


def test_bad_schedule_settings_are_one_line_errors():
    for bad in ("train.lr_schedule=linear", "train.lr_floor=1.5", "train.warmup_steps=-1"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [bad])
        assert "\n" not in str(e.value) and bad.split("=")[0] in str(e.value)


def test_the_loop_sets_each_steps_rate_and_continues_the_curve_on_resume(tmp_path, monkeypatch):
    from mindgr.train.loop import TrainLoop
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)

    def run(epochs, resume=False):
        cfg = toy_cfg(tmp_path, f"train.epochs={epochs}", "train.lr_schedule=cosine", "train.warmup_steps=2",
                       "train.lr_floor=0.2")
        executor = toy_executor(cfg)
        seen = []
        executor.set_learning_rate = seen.append
        loop = TrainLoop(cfg, executor, resume=resume, quiet=True)
        loop.fit()
        return cfg, seen
    cfg, seen = run(2)                                    # 3 batches an epoch: steps 1..6 of a 6-step run
    assert seen == [schedule.learning_rate(cfg.train, s, 6) for s in range(1, 7)]
    assert seen[-1] == pytest.approx(0.2 * cfg.train.lr)
    cfg, seen = run(3, resume=True)                       # steps 7..9 of the longer (9-step) curve
    assert seen == [schedule.learning_rate(cfg.train, s, 9) for s in range(7, 10)]
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss" in r]
    assert logged[-1]["lr"] == pytest.approx(seen[-1])    # the window logs the rate of its last step


def test_constant_runs_never_touch_the_rate(tmp_path, monkeypatch):
    from mindgr.train.loop import TrainLoop
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)
    cfg = toy_cfg(tmp_path)
    executor = toy_executor(cfg)
    executor.set_learning_rate = lambda lr: pytest.fail("a constant run set the rate")
    TrainLoop(cfg, executor, quiet=True).fit()
