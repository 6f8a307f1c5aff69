"""The `mindgr` command as a user runs it: one-line errors, printed configs, data prepare, train, eval."""
import json
from pathlib import Path

import pytest

from cli_fixtures import one_line_error, run
from conftest import REPO


def test_print_config_resolves_overrides():
    p = run("train", "--config", "configs/smoke.yaml", "--print-config", "model.dim=48", "--set", "train.lr=0.002")
    assert p.returncode == 0, p.stderr
    assert "dim: 48" in p.stdout and "lr: 0.002" in p.stdout and "kind: synthetic" in p.stdout


def test_print_config_resolves_a_base_chain(tmp_path):
    """--print-config shows the refined file merged over its base (here from another working directory)."""
    import yaml
    p = run("train", "--config", str(REPO / "configs/ml-1m/hstu-large.yaml"), "--print-config", "train.epochs=3",
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    shown = yaml.safe_load(p.stdout)
    assert "base" not in shown
    assert (shown["model"]["num_blocks"], shown["model"]["num_heads"]) == (8, 2)         # the refining file
    assert shown["data"]["path"] == "../shared/data/ml-1m/sequences.txt"                 # from its base
    assert shown["train"]["epochs"] == 3                                                  # the override
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    one_line_error(run("train", "--config", "a.yaml", "--print-config", cwd=tmp_path), 2, "cycle", "a.yaml")


def test_config_errors_are_one_line():
    one_line_error(run("train", "--config", "configs/smoke.yaml", "model.dim=big"), 2, "model.dim", "'big'", "int")
    one_line_error(run("train", "--config", "configs/missing.yaml"), 2, "configs/missing.yaml")
    one_line_error(run("train", "model.blocks=2"), 2, "unknown key 'model.blocks'")


@pytest.mark.slow  # every malformed-data case through the CLI (~20 s)
def test_data_errors_are_one_line(tmp_path):
    one_line_error(run("data", "prepare", "movielens-100k", "--src", str(tmp_path / "none"), "--out",
                       str(tmp_path / "o")), 1, "none")
    bad = tmp_path / "u.data"
    bad.write_text("1\t2\t5\t100\n1\tx\t5\t101\n")
    one_line_error(run("data", "prepare", "movielens-100k", "--src", str(bad), "--out", str(tmp_path / "o")),
                   1, "u.data:2")
    one_line_error(run("train", "data.kind=movielens-100k", f"data.path={bad}", "model.time_bias=false"),
                   1, "u.data:2")


@pytest.mark.slow   # trains, evaluates, compares and reports a run: ~2.5 min on a busy host
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
    # 4 steps end before the first epoch's validation: the final evaluation validated the last weights and
    # kept them as the best, so the next commands need no --checkpoint
    assert result["checkpoint"]["name"] == "best" and result["checkpoint"]["final"]
    p = run("eval", "--run", str(tmp_path / "tiny"), "--split", "test")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "checkpoint best (step 4), 120 users" in p.stdout and f"hr@10     {result['test']['hr@10']:.4f}" in p.stdout
    p = run("eval", "--run", str(tmp_path / "tiny"), "--split", "test", "--json")
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
    p = run("compare", f"{tiny},{tiny}", tiny, "--samples", "200",
            "--out", str(tmp_path / "cmp.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["users"] == 120 and cmp["runs"] == [2, 1] and cmp["metrics"]["ndcg@10"]["ci95"] == [0.0, 0.0]
    assert len(cmp["a"]) == 2 and cmp["b"]["run"] == tiny
    assert "not distinguishable" in p.stdout and "per run" in p.stdout
    # the report of a real run: its plots, and its final test metrics in the table
    p = run("report", tiny, "--out", str(tmp_path / "report"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"| {result['test']['hr@10']:.4f} |" in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "report-loss.png").stat().st_size > 5000


def _read_only_dir(tmp_path):
    """A directory this process cannot write: chmod 0555, or (root ignores modes) a kernel-owned one."""
    from mindgr.paths import unwritable_reason
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if unwritable_reason(d) is None:                 # root: the mode does not stop writes
        d = Path("/sys/mindgr-test")
        if unwritable_reason(d) is None:
            pytest.skip("no directory this user cannot write (root, and /sys is writable)")
    return d


def _bad_case(name, tmp_path):
    """(argv, exit code, words of the one error line) of each bad input."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    if name == "prepare without --src":
        return ["data", "prepare", "movielens-1m", "--out", str(tmp_path / "o")], 2, ["--src is required"]
    if name == "unknown --option":
        return (["data", "prepare", "synthetic", "--out", str(tmp_path / "o"), "--option", "users=5"], 2,
                ["unknown option 'users'", "num_users"])
    if name == "non-integer --option":
        return (["data", "prepare", "synthetic", "--out", str(tmp_path / "o"), "--option", "num_users=many"], 2,
                ["num_users", "'many'", "expected int"])
    if name == "--option without =":
        return ["data", "prepare", "synthetic", "--out", str(tmp_path / "o"), "--option", "num_users"], 2, ["KEY=VALUE"]
    if name == "--out is a file":
        return ["data", "prepare", "synthetic", "--out", str(afile)], 1, [str(afile), "not a directory"]
    if name == "run dir is a file":
        return ["train", f"run.out_dir={tmp_path}", "run.name=afile"], 1, [str(afile), "not a directory"]
    if name == "out_dir is a file":
        return ["train", f"run.out_dir={afile}"], 1, [str(afile), "is not a directory"]
    if name == "read-only out_dir":
        ro = _read_only_dir(tmp_path)
        return ["train", f"run.out_dir={ro}"], 1, ["cannot write"]
    if name == "read-only store --out":
        ro = _read_only_dir(tmp_path)
        return ["data", "prepare", "synthetic", "--out", str(ro / "store")], 1, ["cannot write"]
    if name == "non-UTF-8 config":
        bad = tmp_path / "latin1.yaml"
        bad.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
        return ["train", "--config", str(bad)], 2, [str(bad) + ":2", "not UTF-8"]
    if name == "config is a directory":
        return ["train", "--config", str(tmp_path)], 2, [str(tmp_path), "is a directory"]
    if name == "duplicate YAML key":
        dup = tmp_path / "dup.yaml"
        dup.write_text("model:\n  dim: 16\n  num_blocks: 1\n  dim: 32\n")
        return ["train", "--config", str(dup)], 2, [f"{dup}:4", "duplicate key 'dim'", "line 2"]
    if name.startswith("train.lr="):
        return ["train", name], 2, ["train.lr", "finite"]
    if name.startswith("run.name="):
        return ["train", f"run.out_dir={tmp_path}", name], 2, ["run.name"]
    raise KeyError(name)


BAD_CASES = ["prepare without --src", "unknown --option", "non-integer --option", "--option without =",
             "--out is a file", "run dir is a file", "out_dir is a file", "read-only out_dir", "read-only store --out",
             "non-UTF-8 config", "config is a directory", "duplicate YAML key", "train.lr=.nan", "train.lr=nan",
             "train.lr=.inf", "train.lr=-1e999", "run.name=", "run.name=/tmp/elsewhere", "run.name=../escaped",
             "run.name=a/../../b"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_not_a_traceback(tmp_path, case):
    argv, code, words = _bad_case(case, tmp_path)
    p = run(*argv)
    one_line_error(p, code, *words)
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/elsewhere").exists()


def test_version_and_help_texts():
    from mindgr import __version__
    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"mindgr {__version__}"
    p = run("train", "--help")
    assert p.returncode == 0 and "SECTION.KEY=VALUE" in p.stdout and "--print-config" in p.stdout
    p = run("bench", "--help")
    from mindgr.bench.registry import BENCHMARKS
    assert p.returncode == 0
    section = p.stdout.split("benchmarks:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [l.split()[0] for l in section] == list(BENCHMARKS)
    assert all(len(l.split()) > 4 for l in section), section      # a description on every line
