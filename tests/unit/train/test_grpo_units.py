"""GRPO-SR (loss.objective grpo_sr) without a run: the policy loss against numpy (clipping on both sides, group
normalisation, zero advantage for equal rewards, the KL term, gradients) and the relevance gate (rollouts,
the loss cell on a trained decoder and the runs: tests/system/train/test_grpo.py)."""
import numpy as np
import pytest

from gr_fixtures import np_policy_loss

pytestmark = pytest.mark.graph_mode("auto")


# ---- the loss against numpy -------------------------------------------------------------------------------
def test_policy_objective_and_its_gradient_match_numpy():
    import mindspore as ms
    from mindspore import Tensor
    from mindgr.models.grpo import PolicyObjective
    from mindgr.train.reward_gate import group_advantages
    rng = np.random.default_rng(0)
    groups, g, eps, beta = 3, 4, 0.2, 0.1
    old = rng.normal(-3, 1, groups * g)
    # ratios on both sides of the clip range and inside it
    shift = np.array([0.5, -0.5, 0.05, -0.05, 0.3, -0.4, 0.0, 0.1, 0.6, -0.6, 0.02, -0.3])
    logp = old + shift
    ref = old + rng.normal(0, 0.2, groups * g)
    rewards = rng.random((groups, g))
    rewards[2] = 0.7                                      # a group of equal rewards
    adv = group_advantages(rewards).reshape(-1).astype(np.float64)
    assert (adv[8:] == 0).all()
    w = np.full(groups * g, 1.0 / (groups * g))
    want, want_grad = np_policy_loss(logp, old, ref, adv, w, eps, beta)
    r = np.exp(shift)
    assert ((r * adv > 0) & (r > 1 + eps)).any() and ((r * adv < 0) & (r < 1 - eps)).any()   # both clips bind
    net = PolicyObjective(eps, beta)
    args = [Tensor(x.astype(np.float32)) for x in (logp, old, ref, adv, w)]
    got = float(net(*args).asnumpy())
    grad = ms.grad(net, grad_position=0)(*args).asnumpy()
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    # a group of equal rewards contributes no policy gradient: only the KL term moves its candidates
    _, no_kl = np_policy_loss(logp, old, ref, adv, w, eps, 0.0)
    assert (no_kl[8:] == 0).all() and (no_kl[:8] != 0).any()
    # finite differences of the numpy loss agree with its analytic gradient (away from the clip edges)
    h = 1e-6
    fd = np.array([(np_policy_loss(logp + h * e, old, ref, adv, w, eps, beta)[0]
                    - np_policy_loss(logp - h * e, old, ref, adv, w, eps, beta)[0]) / (2 * h)
                   for e in np.eye(len(logp))])
    np.testing.assert_allclose(fd, want_grad, rtol=1e-5, atol=1e-8)


def test_group_advantages_are_normalised_within_each_group():
    from mindgr.train.reward_gate import group_advantages
    r = np.array([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0], [0.1, 0.1, 0.1, 0.3]], np.float32)
    a = group_advantages(r)
    np.testing.assert_allclose(a[0], (r[0] - r[0].mean()) / (r[0].std() + 1e-6), rtol=1e-6)
    assert (a[1] == 0).all()                                   # equal rewards: exactly zero
    assert a[2].mean() == pytest.approx(0, abs=1e-6) and a[2, 3] > 0 > a[2, 0]


def test_gate_never_rewards_consumed_items_and_none_is_the_plain_reward():
    from mindgr.train.reward_gate import gate_mask, hybrid_reward
    codes = np.array([[0, 0], [1, 0], [1, 1], [2, 0], [3, 0], [2, 1]], np.int32)    # item -> (first code, second)
    histories = [np.array([1, 3]), np.array([4])]
    items = np.array([[1, 2, 5, 4], [4, 3, 1, 0]])
    rm = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    none = hybrid_reward(rm, gate_mask("none", histories, items))
    # consumed items (1 of user 0, 4 of user 1) and the padding item 0 get nothing; the rest the plain RM
    np.testing.assert_array_equal(none, [[0, 2, 3, 4], [0, 6, 7, 0]])
    first = hybrid_reward(rm, gate_mask("first_code", histories, items, codes, recent=10))
    # user 0's recent first codes {1, 2}: item 2 (1), 5 (2) pass, 4 (3) does not; user 1's {3}: none pass
    np.testing.assert_array_equal(first, [[0, 2, 3, 0], [0, 0, 0, 0]])
    only_last = gate_mask("first_code", histories, items, codes, recent=1)     # user 0's last item is 3 (code 2)
    np.testing.assert_array_equal(only_last[0], [False, False, True, False])
    with pytest.raises(ValueError, match="retrieval_topm"):
        gate_mask("retrieval_topm", histories, items)
    allowed = np.array([[True, True, False, True], [True, True, True, True]])
    np.testing.assert_array_equal(gate_mask("retrieval_topm", histories, items, allowed=allowed),
                                  [[False, True, False, True], [False, True, True, False]])


# ---- the NLL term restricted to valued targets (align.nll_min_value) --------------------------------------
@pytest.mark.parametrize("objective,merger", [("ntp", "item"), ("ntp", "none"), ("page_ntp", "item")])
def test_nll_rows_weighted_by_target_zero_exactly_the_targets_below_the_floor(objective, merger):
    """user_rows(target_weights=value >= floor): every target token of an item valued below the floor weighs
    0, every other keeps its weight, for the row layouts GRPO-SR packs: one row per target item (merger,
    page-wise) and the flat point-wise row."""
    from mindgr.models.ntp import user_rows
    rng = np.random.default_rng(0)
    lt, n = 3, 7
    codes = np.concatenate([np.zeros((1, lt), np.int64), rng.integers(0, 4, (20, lt))])
    offsets = np.arange(lt + 1) * 4
    items = rng.integers(1, 21, n)
    pages = np.array([0, 0, 1, 2, 2, 2, 3]) if objective == "page_ntp" else None
    values = np.array([5, 1, 4, 2, 5, 3, 4], np.float32)
    rows = user_rows(items, codes, offsets, objective, merger, pages)
    kept = user_rows(items, codes, offsets, objective, merger, pages, target_weights=values >= 4)
    assert len(kept) == len(rows)
    # which item each target token predicts: the target's codes are a known slice of the item's codes
    item_of_row = (np.arange(len(rows)) + n - len(rows)) if merger != "none" else None
    for k, (before, after) in enumerate(zip(rows, kept)):
        np.testing.assert_array_equal(after["slots"], before["slots"])
        np.testing.assert_array_equal(after["target"], before["target"])
        live = before["weight"] > 0
        if merger == "none":
            item = (np.arange(before["weight"].shape[0]) + 1) // lt
            # the flat row's targets are the items' codes in order: token t predicts code (t + 1) % Lt of item
            gids = (codes[items] + offsets[:-1]).reshape(-1)[1:]
            np.testing.assert_array_equal(before["target"][live], gids[live])
            want = before["weight"] * (values[item] >= 4)
        else:
            item = item_of_row[k]
            np.testing.assert_array_equal(before["target"][live], codes[items[item]] + offsets[:-1])
            want = before["weight"] * (values[item] >= 4)
        np.testing.assert_array_equal(after["weight"], want)
    assert 0 < sum(float(r["weight"].sum()) for r in kept) < sum(float(r["weight"].sum()) for r in rows)
