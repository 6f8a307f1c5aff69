"""The reward model (loss.objective rating) trained: a run end to end through the loop (eval.json,
`mindgr eval`, a bit-identical resume) and the scorer agreeing with the training graph (its metrics
against numpy, the baselines and the one-line config errors: tests/unit/train/test_reward_units.py)."""
import json

import numpy as np
import pytest

from mindgr.config import load_config
from reward_fixtures import reward_overrides

pytestmark = pytest.mark.graph_mode("auto")


# ---- a run end to end ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    from mindgr.train.reward import reward_trainer
    out = tmp_path_factory.mktemp("reward")
    result = reward_trainer(load_config(None, reward_overrides(out, "rm")), quiet=True).fit()
    return {"out": out, "run": out / "rm", "result": result}


def test_run_writes_metrics_baselines_and_best(reward_run):
    result, run = reward_run["result"], reward_run["run"]
    saved = json.loads((run / "eval.json").read_text())
    assert saved["checkpoint"]["name"] == "best" and saved["checkpoint"]["key"] == "rmse"
    best_valid = min(h["rmse"] for h in saved["history"])          # best = the lowest validation RMSE
    assert saved["checkpoint"]["metric"] == pytest.approx(best_valid)
    for split in ("valid", "test"):
        m = saved[split]
        assert m["count"] == 150 and m["rmse"] > 0 and 0 <= m["auc"] <= 1
        for name in ("global-mean", "item-mean", "user-mean"):
            assert saved[f"{name}_{split}"]["count"] == 150
        assert saved[f"global-mean_{split}"]["auc"] == 0.5
    assert (run / "checkpoints" / "best.json").is_file()


def test_eval_command_matches_the_run(reward_run, capsys):
    from mindgr.cli import main
    run, result = reward_run["run"], reward_run["result"]
    assert main(["eval", "--run", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rmse"] == pytest.approx(result["test"]["rmse"], rel=1e-5)
    assert out["auc"] == pytest.approx(result["test"]["auc"], rel=1e-5)
    assert out["user-mean_baseline"]["rmse"] == pytest.approx(result["user-mean_test"]["rmse"])
    saved = np.load(out["predictions_file"])
    assert len(saved["predictions"]) == 150
    assert main(["eval", "--run", str(run)]) == 0
    text = capsys.readouterr().out
    assert "rmse" in text and "item-mean auc" in text


def _losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "eval" not in r}


def test_resume_is_bit_identical(reward_run):
    from mindgr.train.checkpoint import load_checkpoint
    from mindgr.train.reward import reward_trainer
    out = reward_run["out"]
    reward_trainer(load_config(None, reward_overrides(out, "cut", "train.max_steps=5")), quiet=True).fit()
    reward_trainer(load_config(None, reward_overrides(out, "cut")), resume=True, quiet=True).fit()
    straight, resumed = _losses(reward_run["run"]), _losses(out / "cut")
    assert len(straight) > 5 and straight == resumed
    a, _ = load_checkpoint(out / "rm" / "checkpoints" / "best.safetensors")
    b, _ = load_checkpoint(out / "cut" / "checkpoints" / "best.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def value_input_run(reward_run):
    from mindgr.train.reward import reward_trainer
    out = reward_run["out"]
    reward_trainer(load_config(None, reward_overrides(out, "vi", "model.value_input=true")), quiet=True).fit()
    return out / "vi"


@pytest.mark.parametrize("which", ["ids", "values"])
def test_scorer_equals_the_training_graph(reward_run, value_input_run, which):
    """score(history, item) is the training graph's prediction at the position before that item (with the
    history's values under model.value_input)."""
    from mindspore import Tensor, nn
    from mindgr.train.reward import RewardData, load_reward_scorer
    scorer = load_reward_scorer(reward_run["run"] if which == "ids" else value_input_run)
    assert scorer.uses_values == (which == "values")
    data = RewardData(scorer.cfg)

    class Predict(nn.Cell):
        def __init__(self, loss):
            super().__init__()
            self.loss = loss

        def construct(self, *args):
            return self.loss.predictions(*args)

    indices = np.arange(6)
    batch, in_values, items, values = data.step_arrays(indices)
    arrays = (batch.ids, batch.positions, batch.offsets, batch.timestamps, batch.request_times, in_values, items)
    pred = Predict(scorer.model.loss_net)(*[Tensor(x) for x in arrays]).asnumpy()
    histories, hist_values, cands, expected = [], [], [], []
    for r, k in enumerate(indices):
        lo, hi = int(batch.offsets[r]), int(batch.offsets[r + 1])
        for t in range(lo, hi):
            if items[t] > 0:
                histories.append(batch.ids[lo:t + 1].copy())
                hist_values.append(in_values[lo:t + 1].copy())
                cands.append([items[t], 1])
                expected.append(pred[t])
    got = scorer.score(histories, np.array(cands), history_values=hist_values)
    assert got.shape == (len(histories), 2) and got.dtype == np.float32
    assert np.allclose(got[:, 0], expected, atol=1e-5)
    # chunked scoring (a few rows at a time, padded last chunk) gives the same numbers
    scorer.rows = 7
    assert np.allclose(scorer.score(histories, np.array(cands), history_values=hist_values), got, atol=1e-5)
    if which == "values":                    # the values matter, and are required
        shifted = [v * 0 + 1 for v in hist_values]
        assert not np.allclose(scorer.score(histories, np.array(cands), history_values=shifted), got, atol=1e-4)
        with pytest.raises(ValueError, match="pass history_values"):
            scorer.score(histories[:1], np.array([[1]]))
    with pytest.raises(ValueError, match="item ids must be in"):
        scorer.score(histories[:1], np.array([[0]]), history_values=hist_values[:1])
    with pytest.raises(ValueError, match="history 0"):
        scorer.score([np.zeros(0, np.int64)], np.array([[1]]), history_values=[np.zeros(0)])


def test_value_input_run_evaluates(value_input_run):
    saved = json.loads((value_input_run / "eval.json").read_text())
    assert saved["test"]["count"] == 150 and saved["test"]["rmse"] > 0


def test_scorer_refuses_other_runs_and_commands(reward_run, tmp_path):
    from mindgr.cli import main
    from mindgr.serve.models import serving_kind
    with pytest.raises(ValueError, match="no serving model"):
        serving_kind(reward_run["run"])
    assert main(["compare", str(reward_run["run"]), str(reward_run["run"])]) != 0
