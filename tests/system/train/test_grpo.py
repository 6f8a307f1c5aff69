"""GRPO-SR (loss.objective grpo_sr): the loss against numpy (clipping on both sides, group normalisation, zero
advantage for equal rewards, the KL and NLL terms, gradients), the relevance gate, rollouts (valid unique
items, their log-probs against the exhaustive teacher-forced reference), a bit-identical resume, and a run
end to end: GR run -> RL run (a fixed reward function, or the reward model when the build has one) ->
eval -> recommend from the aligned run."""
import json

import numpy as np
import pytest

from gr_fixtures import random_codes
from mindgr.config import ConfigError, load_config
from mindgr.runtime import select_device

pytestmark = pytest.mark.graph_mode("auto")

select_device()

SYNTH = ["data.kind=synthetic", "data.max_len=12", "data.synthetic.num_users=120", "data.synthetic.num_items=60",
         "data.synthetic.median_len=10", "data.synthetic.max_len=20", "data.synthetic.num_clusters=4"]
LEVELS = [6, 6, 3]


def gr_overrides(out, name, codes, *extra):
    return [f"run.out_dir={out}", f"run.name={name}", "run.log_every=1", *SYNTH, "model.arch=gr",
            "model.dim=16", "model.num_blocks=1", "model.num_heads=2", "model.dropout=0.1",
            "loss.objective=ntp", "train.batch_size=16", "train.epochs=1", "train.lr=0.005",
            "eval.every_epochs=1", "eval.ks=[1,5,10]", "eval.beam=10", "eval.max_users=40",
            "eval.batch_size=64", "ids.from_run=", f"ids.codes={codes}", "ops.backend=cpu", *extra]


def rl_overrides(out, name, codes, *extra):
    return gr_overrides(out, name, codes, "loss.objective=grpo_sr", f"align.init_from={out / 'gr'}",
                        "align.group_size=8", "align.inner_updates=2", "train.batch_size=8", "train.max_steps=6",
                        "run.ckpt_every=3", "eval.every_epochs=0", *extra)


def fixed_reward(histories, items):
    """A reward the policy can learn: items whose id is a multiple of 7 are liked."""
    return ((np.asarray(items) % 7 == 0) + 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random code table of the synthetic catalogue and one trained GR run (the policy's start)."""
    from mindgr.ids.codes import save_codes
    from mindgr.train.data import load_store
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("grpo")
    store = load_store(load_config(None, SYNTH).data)
    codes = random_codes(np.random.default_rng(3), store.num_items, LEVELS)
    path = save_codes(out / "codes.parquet", codes, LEVELS, store.item_raw_ids, {"note": "random"})
    GenerativeTrainer(load_config(None, gr_overrides(out, "gr", path)), quiet=True).fit()
    return {"out": out, "codes": path, "table": codes, "store": store}


# ---- the loss against numpy -------------------------------------------------------------------------------
def np_policy_loss(logp, old, ref, adv, w, eps, beta):
    """-sum w min(r A, clip(r) A) + beta sum w k3 and its analytic gradient w.r.t. logp."""
    r = np.exp(logp - old)
    c = np.clip(r, 1 - eps, 1 + eps)
    unclipped = r * adv <= c * adv
    surrogate = np.where(unclipped, r * adv, c * adv)
    log_r = ref - logp
    k3 = np.exp(log_r) - log_r - 1
    loss = -(w * surrogate).sum() + beta * (w * k3).sum()
    inside = (r >= 1 - eps) & (r <= 1 + eps)
    d_surr = np.where(unclipped | inside, r * adv, 0.0)          # the clipped branch has no gradient
    grad = -w * d_surr + beta * w * (1 - np.exp(log_r))
    return loss, grad


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


# ---- rollouts and the loss cell on a trained decoder ------------------------------------------------------
def _task(setup, *extra, reward=fixed_reward):
    from mindgr.train.alignment import AlignmentTask
    from mindgr.train.loop import NullLog
    cfg = load_config(None, rl_overrides(setup["out"], "unit", setup["codes"], *extra))
    task = AlignmentTask(cfg, reward)
    task.check_config("local")
    task.load(None, False)
    task.build_model(NullLog())
    return task


def test_rollouts_are_valid_unique_items_with_teacher_forced_log_probs(setup):
    from mindspore import Tensor
    from mindgr.models.generative import item_log_probs
    from mindgr.models.ntp import NTPLoss
    from mindgr.train.rollout import batch_tensors
    task = _task(setup)
    model, g = task.model, task.shape.group
    inputs, info = task.inputs(0, 0, [0, 5, 9])
    roll = model.rollout.run(inputs.histories, inputs.nll_rows)
    items = roll.items
    assert items.shape == (3, g) and (items > 0).all() and (items <= setup["store"].num_items).all()
    assert all(len(set(row.tolist())) == g for row in items)                 # unique within each group
    # the old log-probs are the exhaustive teacher-forced reference's for those items; the reference policy
    # is the same network at the start
    full = item_log_probs(model.decoder, inputs.histories, setup["table"], model.rollout.p_cap)
    want = np.take_along_axis(full, items, 1).reshape(-1)
    np.testing.assert_allclose(roll.old_logp[: items.size], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(roll.old_logp, roll.ref_logp)
    # beam search found the best of these (its first item is the most likely one in the catalogue for each)
    assert (items[:, 0] == full[:, 1:].argmax(1) + 1).all()
    assert np.isclose(roll.cand_w.sum(), 1.0) and (roll.cand_w[items.size:] == 0).all()
    # the NLL term is the GR task's NTP loss over the NLL rows alone
    tensors = batch_tensors(roll.arrays)
    adv = np.zeros_like(roll.old_logp)
    loss, surrogate, kl, nll, clip = (float(x.asnumpy()) for x in model.loss_net(
        *tensors, *(Tensor(x) for x in (roll.old_logp, roll.ref_logp, adv, roll.cand_w))))
    from mindgr.models.ntp import pack_rows
    alone = pack_rows(inputs.nll_rows, task.shape.token_capacity, task.shape.row_capacity, model.decoder.group,
                      model.decoder.pad_id)[0]
    ntp = float(NTPLoss(model.decoder)(*(Tensor(alone[k]) for k in ("slots", "merged", "offsets", "target", "group",
                                                                    "weight"))).asnumpy())
    assert nll == pytest.approx(ntp, rel=1e-5)
    assert kl == pytest.approx(0, abs=1e-6) and clip == 0 and surrogate == pytest.approx(0, abs=1e-7)
    assert loss == pytest.approx(task.cfg.align.nll_weight * nll, rel=1e-5)


def test_loss_cell_equals_numpy_on_its_own_log_probs(setup):
    """GRPOLoss = the numpy formula over the candidates' log-probs (from the forward cell) + lambda * NTP."""
    from mindspore import Tensor
    from mindgr.train.reward_gate import gate_mask, group_advantages, hybrid_reward
    from mindgr.train.rollout import batch_tensors
    task = _task(setup, "align.beta=0.3", "align.nll_weight=0.5")
    model, a = task.model, task.cfg.align
    inputs, _ = task.inputs(0, 0, [1, 2, 3, 4])
    roll = model.rollout.run(inputs.histories, inputs.nll_rows)
    r, rm, keep = task.rewards(inputs.histories, roll.items[:4])
    np.testing.assert_array_equal(keep, gate_mask("first_code", inputs.histories, roll.items[:4],
                                                  setup["table"], a.gate_recent))
    np.testing.assert_array_equal(r, hybrid_reward(fixed_reward(None, roll.items[:4]), keep))
    adv = np.zeros_like(roll.old_logp)
    adv[: r.size] = group_advantages(r).reshape(-1)
    rng = np.random.default_rng(1)
    old = (roll.old_logp + rng.normal(0, 0.3, roll.old_logp.shape)).astype(np.float32)   # a moved policy
    ref = (roll.ref_logp + rng.normal(0, 0.3, roll.ref_logp.shape)).astype(np.float32)
    tensors = batch_tensors(roll.arrays)
    loss, _, kl, nll, clip = (float(x.asnumpy()) for x in model.loss_net(
        *tensors, *(Tensor(x) for x in (old, ref, adv, roll.cand_w))))
    logp = roll.old_logp.astype(np.float64)
    want, _ = np_policy_loss(logp, old, ref, adv, roll.cand_w, a.clip_eps, a.beta)
    assert loss == pytest.approx(want + a.nll_weight * nll, rel=1e-4, abs=1e-5)
    w = roll.cand_w
    assert kl == pytest.approx((w * (np.exp(ref - logp) - (ref - logp) - 1)).sum(), rel=1e-4)
    assert clip == pytest.approx((w * (np.abs(np.exp(logp - old) - 1) > a.clip_eps)).sum() / w.sum(), abs=1e-6)


# ---- runs ------------------------------------------------------------------------------------------------
def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "eval" not in r}


@pytest.fixture(scope="module")
def aligned(setup):
    from mindgr.train.alignment import AlignmentTrainer
    cfg = load_config(None, rl_overrides(setup["out"], "rl", setup["codes"]))
    result = AlignmentTrainer(cfg, quiet=True, reward=fixed_reward).fit()
    return {"run": setup["out"] / "rl", "result": result}


def test_an_aligned_run_logs_its_figures_and_gains_reward(setup, aligned):
    run, result = aligned["run"], aligned["result"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r and "eval" not in r]
    assert len(steps) == 6
    for key in ("reward", "rm_score", "gated_fraction", "kl", "nll", "clip_fraction", "rollout_items_per_s"):
        assert all(np.isfinite(r[key]) for r in steps), key
    assert steps[0]["kl"] < steps[-1]["kl"] and max(r["clip_fraction"] for r in steps) > 0
    assert np.mean([r["reward"] for r in steps[-2:]]) > steps[0]["reward"]     # the policy learns the reward
    assert result["checkpoint"]["name"] == "best" and result["test"]["count"] == 120
    fp = json.loads((run / "data.json").read_text())
    assert fp["align"]["checkpoint"] == "best" and "codes" in fp


def test_resume_of_an_rl_run_is_bit_identical(setup, aligned):
    from mindgr.train.alignment import AlignmentTrainer
    from mindgr.train.checkpoint import CheckpointManager, load_checkpoint
    out, codes = setup["out"], setup["codes"]
    AlignmentTrainer(load_config(None, rl_overrides(out, "cut", codes, "train.max_steps=3")), quiet=True,
                     reward=fixed_reward).fit()
    AlignmentTrainer(load_config(None, rl_overrides(out, "cut", codes)), resume=True, quiet=True,
                     reward=fixed_reward).fit()
    assert _losses(aligned["run"]) == _losses(out / "cut") and len(_losses(out / "cut")) == 6
    a, _ = load_checkpoint(CheckpointManager(aligned["run"], 2).latest())
    b, _ = load_checkpoint(CheckpointManager(out / "cut", 2).latest())
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_aligned_run_evaluates_and_recommends(setup, aligned, capsys):
    from mindgr.cli import main
    from mindgr.train.tasks import resolve_run
    run = aligned["run"]
    assert resolve_run(run).name == "alignment" and resolve_run(run).serving == "generative"
    assert main(["eval", "--run", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hr@10"] == pytest.approx(aligned["result"]["test"]["hr@10"])
    raw = setup["store"].item_raw_ids
    assert main(["recommend", "--run", str(run), "--user-history", " ".join(str(raw[i]) for i in (3, 8, 21)),
                 "--k", "5"]) == 0
    text = capsys.readouterr().out
    assert text.strip()


def test_config_errors_are_one_line(setup):
    from mindgr.train.alignment import AlignmentTask
    out, codes = setup["out"], setup["codes"]

    def refused(*extra, reward=fixed_reward):
        cfg = load_config(None, rl_overrides(out, "bad", codes, *extra))
        with pytest.raises(ConfigError) as e:
            AlignmentTask(cfg, reward).check_config("local")
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "align.init_from" in refused("align.init_from=")
    assert "not a run directory" in refused(f"align.init_from={out}")
    assert "model.dim" in refused("model.dim=8")
    assert "data.max_len" in refused("data.max_len=10")
    assert "align.reward_run" in refused(reward=None)
    assert "one process" in str(pytest.raises(ConfigError, AlignmentTask(
        load_config(None, rl_overrides(out, "bad", codes)), fixed_reward).check_config, "data_parallel").value)
    with pytest.raises(ConfigError, match="align.clip_eps"):
        load_config(None, rl_overrides(out, "bad", codes, "align.clip_eps=0"))
    with pytest.raises(ConfigError, match="align.gate"):
        load_config(None, rl_overrides(out, "bad", codes, "align.gate=maybe"))


def test_rl_run_with_a_reward_model_run(setup, capsys):
    """The chain with a real reward run: a reward model on the same catalogue (synthetic values), then
    `mindgr train` of the aligned run through the CLI (the reward run's scorer), then `mindgr eval`."""
    from mindgr.cli import main
    out, codes = setup["out"], setup["codes"]
    assert main(["train", f"run.out_dir={out}", "run.name=reward", *SYNTH, "data.synthetic.values=true",
                 "model.dim=16", "model.num_blocks=1", "model.num_heads=2", "model.time_bias=false",
                 "loss.objective=rating", "train.batch_size=16", "train.epochs=1", "ops.backend=cpu"]) == 0
    assert (out / "reward" / "checkpoints" / "best.json").is_file()
    args = rl_overrides(out, "rl-rm", codes, f"align.reward_run={out / 'reward'}", "train.max_steps=2",
                        "run.ckpt_every=0")
    assert main(["train", *args]) == 0
    rows = [json.loads(line) for line in (out / "rl-rm" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert len(steps) == 2 and all(np.isfinite(r["rm_score"]) and r["rm_score"] > 0 for r in steps)
    capsys.readouterr()
    assert main(["eval", "--run", str(out / "rl-rm"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 120
