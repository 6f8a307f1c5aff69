"""The `mindgr` command as a user runs it: one-line errors, printed configs, data prepare, train, eval."""
import json
import subprocess
import sys

from conftest import REPO


def run(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "mindgr", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def one_line_error(proc, code, *words):
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = [l for l in proc.stderr.splitlines() if l.startswith("mindgr: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_print_config_resolves_overrides():
    p = run("train", "--config", "configs/smoke.yaml", "--print-config", "model.dim=48", "--set", "train.lr=0.002")
    assert p.returncode == 0, p.stderr
    assert "dim: 48" in p.stdout and "lr: 0.002" in p.stdout and "kind: synthetic" in p.stdout


def test_config_errors_are_one_line():
    one_line_error(run("train", "--config", "configs/smoke.yaml", "model.dim=big"), 2, "model.dim", "'big'", "int")
    one_line_error(run("train", "--config", "configs/missing.yaml"), 2, "configs/missing.yaml")
    one_line_error(run("train", "model.blocks=2"), 2, "unknown key 'model.blocks'")


def test_data_errors_are_one_line(tmp_path):
    one_line_error(run("data", "prepare", "movielens-100k", "--src", str(tmp_path / "none"), "--out",
                       str(tmp_path / "o")), 1, "none")
    bad = tmp_path / "u.data"
    bad.write_text("1\t2\t5\t100\n1\tx\t5\t101\n")
    one_line_error(run("data", "prepare", "movielens-100k", "--src", str(bad), "--out", str(tmp_path / "o")),
                   1, "u.data:2")
    one_line_error(run("train", "data.kind=movielens-100k", f"data.path={bad}", "model.time_bias=false"),
                   1, "u.data:2")


def test_prepare_synthetic_then_train_on_the_store_and_eval(tmp_path, tiny_overrides):
    store = tmp_path / "store"
    p = run("data", "prepare", "synthetic", "--out", str(store), "--option", "num_users=120",
            "--option", "num_items=60", "--option", "median_len=10", "--option", "max_len=20")
    assert p.returncode == 0, p.stderr
    assert "interactions" in p.stdout and (store / "sequences.parquet").is_file()
    overrides = [o for o in tiny_overrides if not o.startswith("data.")] + [
        "data.kind=store", f"data.path={store}", "data.max_len=20", "train.max_steps=4"]
    p = run("train", *overrides)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((tmp_path / "tiny" / "eval.json").read_text())
    assert result["test"]["count"] == 120
    # 4 steps end before the first epoch's validation: there is no best, and eval never silently takes another
    p = run("eval", "--run", str(tmp_path / "tiny"), "--split", "test")
    assert p.returncode == 1 and "no best checkpoint" in p.stderr and "--checkpoint latest" in p.stderr
    p = run("eval", "--run", str(tmp_path / "tiny"), "--split", "test", "--checkpoint", "latest")
    assert p.returncode == 0, p.stderr[-3000:]
    again = json.loads(p.stdout)
    assert again["hr@10"] == result["test"]["hr@10"] and again["count"] == 120
    # the per-user ranks behind those metrics are saved, and a run compared with itself differs by nothing
    import numpy as np
    from mindgr.train.compare import per_user_metrics
    with np.load(again["ranks_file"]) as f:
        ranks, ties = f["ranks"], f["ties"]
    assert (ranks >= 0).all() and per_user_metrics(ranks, [10], ties)["hr@10"].mean() == again["hr@10"]
    # (side A given as two runs, the way several seeds of one setting are compared)
    tiny = str(tmp_path / "tiny")
    p = run("compare", f"{tiny},{tiny}", tiny, "--checkpoint", "latest", "--samples", "200",
            "--out", str(tmp_path / "cmp.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["users"] == 120 and cmp["runs"] == [2, 1] and cmp["metrics"]["ndcg@10"]["ci95"] == [0.0, 0.0]
    assert len(cmp["a"]) == 2 and cmp["b"]["run"] == tiny
    assert "not distinguishable" in p.stdout and "per run" in p.stdout
