"""`mindgr compare --by-value --judge` on real runs: a tiny chain on synthetic data with values (a reward
run as the judge, two GR runs), its figures recomputed from the ranks files, the data and the judge's own
scorer, and its one-line errors (the pieces against references: tests/unit/train/test_align_eval_units.py)."""
import json

import numpy as np
import pytest

from gr_fixtures import SYNTH, random_codes_file
from gr_fixtures import gr_overrides

pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]
VALUES = [*SYNTH, "data.synthetic.values=true"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A judge reward run and two GR runs (seeds 0 and 1, one epoch) on the same data with values."""
    from mindgr.cli import main
    out = tmp_path_factory.mktemp("align-eval")
    store, codes, path = random_codes_file(out, VALUES)
    assert main(["train", f"run.out_dir={out}", "run.name=judge", *VALUES, "model.dim=16", "model.num_blocks=1",
                 "model.num_heads=2", "model.time_bias=false", "model.value_input=true", "loss.objective=rating",
                 "train.batch_size=16", "train.epochs=1", "ops.backend=cpu"]) == 0
    for seed in (0, 1):
        args = gr_overrides(out, f"gr{seed}", path, "train.epochs=1", f"run.seed={seed}", *VALUES[len(SYNTH):])
        assert main(["train", *args]) == 0
    return {"out": out, "store": store}


def test_compare_reports_value_groups_judge_and_coverage(chain, capsys):
    from mindgr.cli import main
    from mindgr.train.compare import load_ranks
    from mindgr.train.data import RunData
    from mindgr.train.judge import top_lists
    from mindgr.train.reward import load_reward_scorer
    from mindgr.train.rundir import run_config
    out = chain["out"]
    a, b, judge = out / "gr0", out / "gr1", out / "judge"
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
        cov = len(np.unique(top[top > 0])) / chain["store"].num_items
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

def test_compare_errors_are_one_line(chain, capsys):
    from mindgr.cli import main
    out = chain["out"]
    capsys.readouterr()
    assert main(["compare", str(out / "gr0"), str(out / "gr1"), "--judge", str(out / "gr0")]) == 1
    err = capsys.readouterr().err.strip()
    assert "not a reward model run" in err and "\n" not in err
    assert main(["compare", str(out / "gr0"), str(out / "judge"), "--by-value"]) == 1
    err = capsys.readouterr().err.strip()
    assert "ranks no items per user" in err and "\n" not in err
