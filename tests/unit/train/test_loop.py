"""The one training loop with an executor of its own (no model, no compile): the loop's narrow interface
(mindgr.train.executor); run_steps; the step's inputs as one named structure."""
import json

import numpy as np

import pytest

from loop_fixtures import toy_cfg, toy_executor

pytestmark = pytest.mark.graph_mode("reference")


def test_an_executor_with_its_own_data_trains_evaluates_checkpoints_and_resumes(tmp_path, monkeypatch):
    from mindgr.train.loop import TrainLoop
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)
    cfg = toy_cfg(tmp_path)
    loop = TrainLoop(cfg, toy_executor(cfg), quiet=True)
    result = loop.fit()
    assert loop.step == 6 and loop.epoch == 2
    assert result["checkpoint"]["name"] == "best" and result["checkpoint"]["step"] == 6
    assert loop.executor.restored == "best"                     # the final evaluation is of `best`
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in windows] == [2, 4, 6]
    assert windows[0]["loss"] == (1.0 + 1 / 2) / 2             # the window's mean loss
    assert [r["step"] for r in rows if r.get("eval") == "valid"][:2] == [3, 6]
    # resumed with more epochs: continues at epoch 2, batch 0, from the last checkpoint
    cfg = toy_cfg(tmp_path, "train.epochs=3")
    resumed = TrainLoop(cfg, toy_executor(cfg), resume=True, quiet=True)
    assert resumed.executor.restored == "ckpt-step00000006" and (resumed.step, resumed.epoch) == (6, 2)
    assert float(resumed.executor.w.asnumpy()[0]) == 6.0
    resumed.fit()
    assert resumed.executor.prepared[:3] == [(2, 0), (2, 1), (2, 2)] and resumed.step == 9


def test_patience_stops_after_that_many_validations_without_a_new_best(tmp_path, monkeypatch):
    from mindgr.train.loop import TrainLoop
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)
    scores = {3: 0.2, 6: 0.5, 9: 0.4, 12: 0.5, 15: 0.9, 18: 0.1}     # step -> valid NDCG@10 (a tie is no better)

    def run(*extra, resume=False):
        cfg = toy_cfg(tmp_path, "train.epochs=6", *extra)
        executor = toy_executor(cfg)
        executor.evaluate = lambda split, step: {"count": 1, "ndcg@10": scores[step], "mrr": 0.0}
        loop = TrainLoop(cfg, executor, resume=resume, quiet=True)
        return loop, loop.fit()
    loop, result = run("eval.patience=2")
    assert (loop.epoch, loop.step) == (4, 12)                  # best at epoch 2; epochs 3 and 4 no better
    assert result["checkpoint"]["name"] == "best" and result["checkpoint"]["epoch"] == 2
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["best"]["epoch"]) for r in rows if r.get("early_stop")] == [(4, 2)]
    # the test record names the checkpoint it evaluated (best, epoch 2), not the loop's last position
    assert [(r["checkpoint"]["epoch"], r["checkpoint"]["step"], r["step"]) for r in rows
            if r.get("eval") == "test"] == [(2, 6, 12)]
    loop, _ = run("eval.patience=2", resume=True)              # a run that stopped early is complete
    assert loop.step == 12
    loop, result = run("eval.patience=3", resume=True)         # more patience trains on: a new best at epoch 5
    assert loop.step == 18 and result["checkpoint"]["epoch"] == 5


def test_a_finished_run_without_validation_resumed_and_trained_on_is_tested_on_its_new_weights(tmp_path, monkeypatch):
    from mindgr.train.loop import TrainLoop
    monkeypatch.setattr(TrainLoop, "measure_peak", lambda self: 1.0)
    cfg = toy_cfg(tmp_path, "eval.every_epochs=0")
    first = TrainLoop(cfg, toy_executor(cfg), quiet=True).fit()
    assert first["checkpoint"]["step"] == 6 and first["checkpoint"]["final"]     # final weights kept as best
    cfg = toy_cfg(tmp_path, "eval.every_epochs=0", "train.epochs=3")
    resumed = TrainLoop(cfg, toy_executor(cfg), resume=True, quiet=True)
    result = resumed.fit()
    assert resumed.step == 9 and result["checkpoint"]["step"] == 9      # not the best file of step 6
    assert float(resumed.executor.w.asnumpy()[0]) == 9.0                # tested on the weights of step 9


def test_run_steps_trains_n_more_steps_across_epochs(tmp_path):
    from mindgr.train.loop import TrainLoop
    cfg = toy_cfg(tmp_path, "train.epochs=100", "eval.every_epochs=0", "run.ckpt_every=1000")
    loop = TrainLoop(cfg, toy_executor(cfg), quiet=True)
    block = loop.run_steps(4)
    assert block["steps"] == 4 and loop.step == 4 and (loop.epoch, loop.next_batch) == (1, 1)
    assert block["tokens"] == 16 and block["flops"] == 160.0 and len(block["step_times"]) == 4
    assert loop.run_steps(2)["steps"] == 2 and loop.step == 6
    loop.lock.release()


def test_step_inputs_are_one_named_structure():
    from mindgr.datasets import build_batch
    from mindgr.train.step import ENCODER_FIELDS, StepInputs, encoder_inputs
    batch = build_batch([0, 1], [np.array([1, 2, 3]), np.array([4, 5])], None,
                        [np.array([2, 3, 0]), np.array([5, 0])], 8, 4)
    neg, drop = np.ones((8, 3), np.int32), np.ones((1, 8, 2), np.float32)
    x = StepInputs.from_batch(batch, neg, drop)
    assert x.as_tuple()[: len(ENCODER_FIELDS)] == encoder_inputs(batch) == x.encoder()
    assert len(x.as_tuple()) == len(ENCODER_FIELDS) + 3 and x.as_tuple()[-1] is drop
    pooled = StepInputs.from_batch(batch, (neg[0], np.zeros(3, np.float32)), drop, scale=0.5)
    assert len(pooled.as_tuple()) == len(ENCODER_FIELDS) + 5
    assert pooled.as_tuple()[-1] == np.float32(0.5) and pooled.as_tuple()[-1].dtype == np.float32
