"""The reward model (loss.objective rating) without a run: its metrics against numpy references, the
baselines, and the one-line config errors (the runs: tests/system/train/test_reward.py)."""
import numpy as np
import pytest

from mindgr.config import ConfigError, load_config
from mindgr.train.reward_metrics import MeanBaselines, auc, rating_metrics
from reward_fixtures import reward_overrides

pytestmark = pytest.mark.graph_mode("auto")


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
