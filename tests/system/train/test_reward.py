"""The reward model (loss.objective rating): its metrics against numpy references, the baselines, a run end
to end through the loop (eval.json, `mindgr eval`, a bit-identical resume), the scorer agreeing with the
training graph, and the one-line config errors."""
import json

import numpy as np
import pytest

from mindgr.config import ConfigError, load_config
from mindgr.runtime import select_device
from mindgr.train.reward_metrics import MeanBaselines, auc, rating_metrics

pytestmark = pytest.mark.graph_mode("auto")

select_device()

SYNTH = ["data.kind=synthetic", "data.max_len=16", "data.synthetic.num_users=150", "data.synthetic.num_items=60",
         "data.synthetic.median_len=12", "data.synthetic.max_len=24", "data.synthetic.num_clusters=4",
         "data.synthetic.values=true"]


def reward_overrides(out, name, *extra):
    return [f"run.out_dir={out}", f"run.name={name}", "run.log_every=1", *SYNTH, "model.dim=16",
            "model.num_blocks=1", "model.num_heads=2", "model.dropout=0.1", "model.time_bias=false",
            "loss.objective=rating", "train.batch_size=32", "train.epochs=3", "train.lr=0.005",
            "eval.every_epochs=1", "ops.backend=cpu", *extra]


# ---- metrics -------------------------------------------------------------------------------------------
def _auc_pairs(pos, neg):
    """Every (liked, disliked) pair: 1 if the liked one scores higher, 1/2 on a tie."""
    pos, neg = np.asarray(pos, float)[:, None], np.asarray(neg, float)[None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


def test_auc_matches_pairwise_reference_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        pos = rng.integers(0, 5, rng.integers(1, 30)).astype(float)   # few distinct values: many ties
        neg = rng.integers(0, 5, rng.integers(1, 30)).astype(float)
        assert auc(pos, neg) == pytest.approx(_auc_pairs(pos, neg), abs=1e-12)
    assert auc([1.0, 1.0], [1.0]) == 0.5                  # all tied: exactly chance
    assert auc([2.0], [1.0]) == 1.0 and auc([1.0], [2.0]) == 0.0
    assert auc([], [1.0]) is None and auc([1.0], []) is None


def test_rating_metrics_reference_and_undefined_cases():
    rng = np.random.default_rng(1)
    true = rng.integers(1, 6, 200).astype(np.float32)
    pred = true + rng.normal(0, 0.7, 200)
    m = rating_metrics(pred, true)
    assert m["rmse"] == pytest.approx(float(np.sqrt(np.mean((pred - true) ** 2))))
    assert m["mae"] == pytest.approx(float(np.mean(np.abs(pred - true))))
    assert m["auc"] == pytest.approx(_auc_pairs(pred[true >= 4], pred[true <= 2]))
    assert (m["liked"], m["disliked"], m["count"]) == (int((true >= 4).sum()), int((true <= 2).sum()), 200)
    constant = rating_metrics(np.full(200, 3.0), true)
    assert constant["auc"] == 0.5                          # a constant predictor cannot look good
    only_liked = rating_metrics([4.0, 5.0], [4.0, 5.0])
    assert only_liked["auc"] is None and only_liked["disliked"] == 0 and only_liked["rmse"] == 0.0
    nan = rating_metrics([np.nan, 3.0], [4.0, 1.0])
    assert nan["rmse"] is None and nan["auc"] is None and nan["nonfinite"] == 1
    empty = rating_metrics([], [])
    assert empty["rmse"] is None and empty["count"] == 0


def test_mean_baselines_use_training_values_only():
    users = np.array([0, 0, 1, 2, 2, 2])
    items = np.array([1, 2, 1, 3, 3, 1])
    values = np.array([5.0, 3.0, 1.0, 4.0, 2.0, 3.0])
    b = MeanBaselines(users, items, values, num_items=4, num_users=4)
    assert b.global_mean == pytest.approx(values.mean())
    p = b.predictions(np.array([0, 2, 3]), np.array([1, 3, 4]))
    assert np.allclose(p["global-mean"], values.mean())
    assert np.allclose(p["item-mean"], [3.0, 3.0, values.mean()])      # item 4: no training value
    assert np.allclose(p["user-mean"], [4.0, 3.0, values.mean()])      # user 3: none either


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


# ---- config errors -------------------------------------------------------------------------------------
def test_config_errors_are_one_line(tmp_path):
    from mindgr.train.reward import RewardTask, reward_trainer
    no_values = [o for o in reward_overrides(tmp_path, "nv") if o != "data.synthetic.values=true"]
    with pytest.raises(ConfigError, match="needs a value per interaction"):
        reward_trainer(load_config(None, no_values), quiet=True).fit()
    for extra, match in ((["data.holdout=1"], "data.holdout = 2"), (["model.arch=gr"], "item encoder|model.arch"),
                         (["model.request_time=true"], "request_time")):
        cfg = load_config(None, reward_overrides(tmp_path, "bad", *extra))
        with pytest.raises(ConfigError, match=match):
            RewardTask(cfg).check_config("local")
    with pytest.raises(ConfigError, match="one process"):
        RewardTask(load_config(None, reward_overrides(tmp_path, "dp"))).check_config("data_parallel")
