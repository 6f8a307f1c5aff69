"""prepare/read_any: dispatch by kind, summary block, store on disk."""
import sys

import numpy as np
import pytest

from mindgr.datasets import DataError, prepare, read_any, read_store  # noqa: E402
from mindgr.datasets.prepare import main  # noqa: E402


def test_prepare_synthetic_writes_store_and_summary(tmp_path, capsys):
    s = prepare("synthetic", None, tmp_path / "syn", num_users=50, num_items=80, median_len=10, seed=3)
    out = capsys.readouterr().out
    for word in ("users", "items", "interactions", "has timestamps", "p50", "p90", "p99", "max", "mean"):
        assert word in out
    r = read_store(tmp_path / "syn")
    assert r.num_users == 50 and all(np.array_equal(a, b) for a, b in zip(r.item_seqs, s.item_seqs))


def test_read_any_dispatch_and_errors(tmp_path):
    (tmp_path / "u.data").write_text("1\t2\t3\t4\n")
    assert read_any("movielens-100k", tmp_path).num_interactions == 1
    with pytest.raises(ValueError, match="known kinds: movielens-1m, movielens-100k, kuairand, sequences, csv, "
                                         "synthetic"):
        read_any("netflix", tmp_path)
    with pytest.raises(ValueError, match="unknown option 'num_userz' .*num_users"):
        read_any("synthetic", None, num_userz=3)
    with pytest.raises(ValueError, match="option positive_value = 'yes': expected int"):
        read_any("kuairand", tmp_path, positive_value="yes")
    with pytest.raises(ValueError, match="needs a source file"):
        read_any("movielens-100k", None)


def test_cli_reports_data_errors_on_one_line(tmp_path, capsys):
    assert main(["movielens-1m", str(tmp_path / "missing.dat"), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {DataError(tmp_path / 'missing.dat', None, 'file not found')}"


def test_users_own_formats_through_the_cli_and_the_config(tmp_path):
    """`data prepare csv|sequences` with --option, and data.kind=csv|sequences in a training config."""
    import subprocess
    import sys
    from conftest import REPO
    from mindgr.config import load_config
    from mindgr.train.data import load_store
    log = tmp_path / "log.tsv"
    log.write_text("uid\tiid\tms\n1\t10\t2000\n1\t11\t1000\n2\t10\t5\n")
    p = subprocess.run([sys.executable, "-m", "mindgr", "data", "prepare", "csv", "--src", str(log), "--out",
                        str(tmp_path / "store"), "--option", "user_column=uid", "--option", "item_column=iid",
                        "--option", "time_column=ms", "--option", "time_unit=ms", "--option", "separator=tab"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = read_store(tmp_path / "store")
    assert s.time_unit == "ms" and s.item_raw_ids[s.item_seqs[0]].tolist() == [11, 10]
    cfg = load_config(None, ["data.kind=csv", f"data.path={log}", "data.csv.user_column=uid",
                             "data.csv.item_column=iid", "data.csv.time_column=ms", "data.csv.time_unit=ms",
                             "data.csv.separator=tab"])
    assert load_store(cfg.data).item_raw_ids[load_store(cfg.data).item_seqs[0]].tolist() == [11, 10]
    seqs = tmp_path / "seqs.dat"
    seqs.write_text("1 5 6\n2 6 5 7\n")
    cfg = load_config(None, ["data.kind=sequences", f"data.path={seqs}", "model.time_bias=false"])
    assert load_store(cfg.data).num_interactions == 5
