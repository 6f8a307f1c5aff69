"""GRPO-SR (loss.objective grpo_sr) on a trained GR decoder: rollouts (valid unique items, their log-probs
against the exhaustive teacher-forced reference), the loss cell against numpy on its own log-probs, a
bit-identical resume, and a run end to end: GR run -> RL run (a fixed reward function, or the reward model
when the build has one) -> eval -> recommend from the aligned run; then `mindgr compare --by-value --judge`
of the GR run against the aligned one, its figures recomputed from the ranks files, the data and the judge's
own scorer, and its one-line errors (the loss, the group advantages and the relevance gate against numpy:
tests/unit/train/test_grpo_units.py; the compare pieces: tests/unit/train/test_align_eval_units.py)."""
import json

import numpy as np
import pytest

from gr_fixtures import SYNTH, np_policy_loss, random_codes_file
from gr_fixtures import gr_overrides as shared_gr_overrides
from mindgr.config import ConfigError, load_config

pytestmark = pytest.mark.graph_mode("auto")


VALUES = [*SYNTH, "data.synthetic.values=true"]     # the same items, with a 1-5 rating per interaction


def gr_overrides(out, name, codes, *extra):
    """The GR run the RL runs align: the shared tiny GR run, one epoch, on the data with values."""
    return shared_gr_overrides(out, name, codes, "train.epochs=1", *VALUES[len(SYNTH):], *extra)


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
    from mindgr.train.generative import GenerativeTrainer
    out = tmp_path_factory.mktemp("grpo")
    store, codes, path = random_codes_file(out, VALUES)
    GenerativeTrainer(load_config(None, gr_overrides(out, "gr", path)), quiet=True).fit()
    return {"out": out, "codes": path, "table": codes, "store": store}


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
    task = _task(setup, "align.exclude_consumed=false")
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


def test_rollouts_excluding_consumed_items_are_the_best_new_items(setup):
    """align.exclude_consumed: every candidate is new to its user, and the group is the G most likely of
    the items outside the history (the exhaustive reference with the history masked)."""
    from mindgr.models.generative import item_log_probs
    task = _task(setup, "align.exclude_consumed=true")
    model, g = task.model, task.shape.group
    inputs, _ = task.inputs(0, 0, [0, 5, 9])
    items = model.rollout.run(inputs.histories, inputs.nll_rows).items
    assert (items > 0).all()
    full = item_log_probs(model.decoder, inputs.histories, setup["table"], model.rollout.p_cap)
    for u, h in enumerate(inputs.histories):
        assert not np.isin(items[u], h).any() and len(set(items[u].tolist())) == g
        masked = full[u].copy()
        masked[0], masked[np.asarray(h)] = -np.inf, -np.inf
        assert items[u, 0] == masked.argmax()


def test_nll_min_value_keeps_the_nll_targets_the_user_valued_at_least_that(setup):
    """align.nll_min_value=4: the NLL rows of a batch are the GR task's, with every target token of an item
    the user valued under 4 weighing 0 (the values read from the split, the items from the rows' targets)."""
    task = _task(setup, "align.nll_min_value=4")
    split, gd, lt = task.data.split, task.train, len(task.codes.level_sizes)
    offsets = np.asarray(task.model.decoder.level_offsets)
    indices = [0, 5, 9]
    inputs, _ = task.inputs(0, 0, indices)
    plain = [r for i in indices for r in gd.rows(i)]
    assert len(inputs.nll_rows) == len(plain)
    dropped = kept = 0
    for k, i in enumerate(indices):                  # the smoke GR run is point-wise without merger: one row each
        row, base = inputs.nll_rows[k], plain[k]
        window = gd.windows[i]
        values = np.asarray(split.train_values[gd.example_ids[i]])[-len(window):]
        item = (np.arange(row["weight"].shape[0]) + 1) // lt
        live = base["weight"] > 0
        gids = (np.asarray(task.codes.codes)[window] + offsets[:-1]).reshape(-1)[1:]
        np.testing.assert_array_equal(row["target"][live], gids[live])
        np.testing.assert_array_equal(row["weight"], base["weight"] * (values[item] >= 4))
        dropped += int((live & (values[item] < 4)).sum())
        kept += int((row["weight"] > 0).sum())
    assert dropped > 0 and kept > 0
    with pytest.raises(ConfigError, match="align.nll_min_value = 99.0 keeps no observed item") as e:
        _task(setup, "align.nll_min_value=99")
    assert "\n" not in str(e.value)


def test_loss_cell_equals_numpy_on_its_own_log_probs(setup):
    """GRPOLoss = the numpy formula over the candidates' log-probs (from the forward cell) + lambda * NTP."""
    from mindspore import Tensor
    from mindgr.train.reward_gate import gate_mask, group_advantages, hybrid_reward
    from mindgr.train.rollout import batch_tensors
    task = _task(setup, "align.beta=0.3", "align.nll_weight=0.5", "align.policy_weight=0.7")
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
    policy_and_kl, _ = np_policy_loss(logp, old, ref, adv, roll.cand_w, a.clip_eps, a.beta)
    w = roll.cand_w
    want_kl = (w * (np.exp(ref - logp) - (ref - logp) - 1)).sum()
    want = a.policy_weight * (policy_and_kl - a.beta * want_kl) + a.beta * want_kl     # rho scales the policy term
    assert loss == pytest.approx(want + a.nll_weight * nll, rel=1e-4, abs=1e-5)
    assert kl == pytest.approx(want_kl, rel=1e-4)
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


@pytest.fixture(scope="module")
def reward_run(setup):
    """A reward model on the same catalogue (the synthetic values, each history item's value in the input):
    the RL chain's reward run and the compare's judge."""
    from mindgr.cli import main
    out = setup["out"]
    assert main(["train", f"run.out_dir={out}", "run.name=reward", *VALUES, "model.dim=16", "model.num_blocks=1",
                 "model.num_heads=2", "model.time_bias=false", "model.value_input=true", "loss.objective=rating",
                 "train.batch_size=16", "train.epochs=1", "ops.backend=cpu"]) == 0
    assert (out / "reward" / "checkpoints" / "best.json").is_file()
    return out / "reward"


def test_rl_run_with_a_reward_model_run(setup, reward_run, capsys):
    """The chain with a real reward run: `mindgr train` of the aligned run through the CLI (the reward run's
    scorer), then `mindgr eval`."""
    from mindgr.cli import main
    out, codes = setup["out"], setup["codes"]
    args = rl_overrides(out, "rl-rm", codes, f"align.reward_run={reward_run}", "train.max_steps=2",
                        "run.ckpt_every=0")
    assert main(["train", *args]) == 0
    rows = [json.loads(line) for line in (out / "rl-rm" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert len(steps) == 2 and all(np.isfinite(r["rm_score"]) and r["rm_score"] > 0 for r in steps)
    capsys.readouterr()
    assert main(["eval", "--run", str(out / "rl-rm"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 120


# ---- mindgr compare --by-value --judge: the GR run against the aligned one -----------------------------
def test_compare_reports_value_groups_judge_and_coverage(setup, aligned, reward_run, capsys):
    from mindgr.cli import main
    from mindgr.train.compare import load_ranks
    from mindgr.train.data import RunData
    from mindgr.train.judge import top_lists
    from mindgr.train.reward import load_reward_scorer
    from mindgr.train.rundir import run_config
    out = setup["out"]
    a, b, judge = out / "gr", aligned["run"], reward_run
    assert main(["compare", str(a), str(b), "--by-value", "liked=4:", "disliked=:2", "--judge", str(judge),
                 "--samples", "300", "--out", str(out / "cmp.json")]) == 0
    text = capsys.readouterr().out
    assert "alignment measures (Holm over these 5)" in text and "judge reward@10" in text
    res = json.loads((out / "cmp.json").read_text())["alignment"]
    evalset = RunData(run_config(a)).split.test
    files = {run: run / "ranks" / "test-best.npz" for run in (a, b)}
    ranks = {run: load_ranks(f)[0] for run, f in files.items()}
    seen = (ranks[a] >= 0) & (ranks[b] >= 0)
    values = evalset.target_values
    assert res["hr@10 liked"]["users"] == int((seen & (values >= 4)).sum())
    assert res["hr@10 disliked"]["b"] == pytest.approx((ranks[b][seen & (values <= 2)] < 10).mean())
    # the kept lists give the ranks file's hits, and the judge's figure is its own scorer's on those lists
    rows = np.flatnonzero(seen)
    hist = [evalset.histories[r] for r in rows]
    scorer = load_reward_scorer(judge, setup=False)
    means = {}
    for run in (a, b):
        with np.load(files[run]) as f:
            top = top_lists(f["lists"][rows], evalset.targets[rows], hist, 10)
        assert ((top == evalset.targets[rows][:, None]).any(1) == (ranks[run][rows] < 10)).all()
        cov = len(np.unique(top[top > 0])) / setup["store"].num_items
        assert res["coverage@10"]["a" if run == a else "b"] == pytest.approx(cov)
        users, slots = np.nonzero(top > 0)           # every (user, listed item) pair scored on its own
        pair = scorer.score([hist[u] for u in users], top[users, slots][:, None],
                            history_values=[evalset.history_values[rows[u]] for u in users])[:, 0]
        total, count = np.zeros(len(rows)), np.zeros(len(rows))
        np.add.at(total, users, pair)
        np.add.at(count, users, 1)
        means[run] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    both = np.isfinite(means[a]) & np.isfinite(means[b])
    assert res["judge reward@10"]["users"] == int(both.sum()) > 0
    assert res["judge reward@10"]["a"] == pytest.approx(means[a][both].mean(), rel=1e-5)
    assert res["judge reward@10"]["b"] == pytest.approx(means[b][both].mean(), rel=1e-5)


def test_compare_splits_the_targets_log_probability_by_value(setup, aligned, capsys):
    """--by-value-metric target_logp: each group's figure is the mean over its users of the run's log p(target
    | history) (mindgr.train.gr_eval.target_log_probs, checked against the exhaustive reference in
    tests/unit/generate/test_gr_beam.py) of its best checkpoint."""
    from mindgr.cli import main
    from mindgr.train.compare import load_ranks
    from mindgr.train.data import RunData
    from mindgr.train.generative import load_generative_run
    from mindgr.train.gr_eval import target_log_probs
    out = setup["out"]
    a, b = out / "gr", aligned["run"]
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--by-value", "liked=4:", "disliked=:2", "--by-value-metric",
                 "target_logp", "--samples", "300", "--out", str(out / "cmp-logp.json")]) == 0
    res = json.loads((out / "cmp-logp.json").read_text())["alignment"]
    evalset = RunData(load_generative_run(a).cfg).split.test
    seen = np.all([load_ranks(run / "ranks" / "test-best.npz")[0] >= 0 for run in (a, b)], 0)
    rows = np.flatnonzero(seen)                      # the users both runs evaluated
    liked = evalset.target_values[rows] >= 4
    for run, side in ((a, "a"), (b, "b")):
        loaded = load_generative_run(run)
        logp = target_log_probs(loaded.decoder, loaded.codes, evalset, rows, loaded.max_history, 16)
        assert np.all(logp < 0)
        assert res["target_logp liked"][side] == pytest.approx(logp[liked].mean(), rel=1e-5)
    assert res["target_logp liked"]["users"] == int(liked.sum())
    assert "target_logp liked - disliked change" in res


def test_compare_errors_are_one_line(setup, aligned, reward_run, capsys):
    from mindgr.cli import main
    gr = setup["out"] / "gr"
    capsys.readouterr()
    assert main(["compare", str(gr), str(aligned["run"]), "--judge", str(gr)]) == 1
    err = capsys.readouterr().err.strip()
    assert "not a reward model run" in err and "\n" not in err
    assert main(["compare", str(gr), str(reward_run), "--by-value"]) == 1
    err = capsys.readouterr().err.strip()
    assert "ranks no items per user" in err and "\n" not in err
