"""Launcher pieces and the `parallel` config section (no msrun started here)."""
import sys
from pathlib import Path

import pytest

from mindgr.config import ConfigError, load_config
from mindgr.parallel import launch
from mindgr.train.trainer import check_resume_config


def test_ranks_run_the_same_command_without_nproc():
    argv = ["train", "--nproc", "4", "--config", "c.yaml", "--nproc=2", "model.dim=8", "--resume"]
    assert launch.strip_nproc(argv) == ["train", "--config", "c.yaml", "model.dim=8", "--resume"]
    cmd = launch.msrun_command(4, ["python", "-m", "mindgr", "train"], Path("/x/logs"), 12345, 60)
    assert cmd[0] == str(Path(sys.executable).with_name("msrun")) or cmd[:2] == [sys.executable, "-c"]
    joined = " ".join(cmd)
    for part in ("--worker_num 4", "--local_worker_num 4", "--master_port 12345", "--log_dir /x/logs",
                 "--join True", "--cluster_time_out 60", "python -m mindgr train"):
        assert part in joined, part
    env = launch.child_env(Path("/x/logs"), threads=1, node_timeout=9)
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)   # msrun starts `python` from PATH
    assert env["MS_NODE_TIMEOUT"] == "9" and env["OMP_NUM_THREADS"] == "1" and env["MINDGR_CPU_THREADS"] == "1"
    assert 1024 <= launch.free_port() <= 65535


def test_failure_summary_names_each_rank(tmp_path):
    (tmp_path / "worker_0.log").write_text("step 1\n[ERROR] ME noise\n")
    (tmp_path / "worker_1.log").write_text("Traceback (most recent call last):\n  File x\nRuntimeError: boom\n")
    (tmp_path / "worker_2.log").write_text("mindgr: error: rank 2: no progress for 31 s while training step 6\n")
    lines = launch.failure_summary(tmp_path, 4)
    assert lines[0].startswith("rank 0: no error message") and lines[0].endswith("last log line: [ERROR] ME noise")
    assert lines[1] == "rank 1: RuntimeError: boom"
    assert lines[2] == "rank 2: mindgr: error: rank 2: no progress for 31 s while training step 6"
    assert lines[3].startswith("rank 3: no log")
    # the rank msrun saw die comes first, with how it died and its last log line
    (tmp_path / "worker_3.log").write_text("step 7 loss 4.1\n[WARNING] ME noise\n")
    for r, pid in enumerate((101, 102, 103, 104)):
        (tmp_path / f"rank{r}.pid").write_text(str(pid))
    (tmp_path / "msrun.log").write_text("[ERROR] Worker process 104 exit with exception. Error code: -9.\n")
    lines = launch.failure_summary(tmp_path, 4)
    assert lines[0] == "rank 3 died (killed by SIGKILL): no error message; last log line: step 7 loss 4.1"
    assert [l.split(":")[0].split(" died")[0] for l in lines] == ["rank 3", "rank 0", "rank 1", "rank 2"]


def test_parallel_config_and_resume_with_another_rank_count():
    cfg = load_config(None, ["parallel.nproc=4", "parallel.balance=tokens", "parallel.cost_b=1e-9"])
    assert cfg.parallel.nproc == 4 and cfg.parallel.balance == "tokens" and cfg.parallel.cost_b == 1e-9
    with pytest.raises(ConfigError, match="parallel.balance"):
        load_config(None, ["parallel.balance=fastest"])
    with pytest.raises(ConfigError, match="parallel.calibrate = false needs a cost model"):
        load_config(None, ["parallel.nproc=2", "parallel.calibrate=false"])
    saved = load_config(None, ["parallel.nproc=2"]).to_dict()
    check_resume_config(saved, load_config(None, ["parallel.nproc=1", "parallel.capacity_slack=0.05"]).to_dict())
    del saved["parallel"]                                   # a run from before the section existed
    check_resume_config(saved, load_config(None, ["parallel.nproc=3"]).to_dict())
    with pytest.raises(ConfigError, match="model.dim"):
        check_resume_config(saved, load_config(None, ["model.dim=8"]).to_dict())


class _FakeMox:
    """Records what moxing would have copied (moxing exists only on ModelArts)."""

    def __init__(self):
        self.calls = []
        self.file = self

    def is_directory(self, url):
        return not url.endswith(".csv")

    def copy_parallel(self, src, dst):
        self.calls.append(("copy_parallel", src, dst))

    def copy(self, src, dst):
        self.calls.append(("copy", src, dst))


def test_modelarts_entry_stages_data_and_outputs(tmp_path, monkeypatch):
    import importlib.util

    import mindgr.cli
    from conftest import REPO
    spec = importlib.util.spec_from_file_location("train_modelarts", REPO / "scripts" / "train_modelarts.py")
    modelarts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modelarts)
    seen = {}

    def fake_train(argv):
        seen["argv"] = argv
        out = next(a.split("=", 1)[1] for a in argv if a.startswith("run.out_dir="))
        (tmp_path / "cache" / "output" / "run").mkdir(parents=True)
        (tmp_path / "cache" / "output" / "run" / "eval.json").write_text("{}")
        assert out == str(tmp_path / "cache" / "output")
        return 0
    monkeypatch.setattr(mindgr.cli, "main", fake_train)
    data = tmp_path / "store"
    data.mkdir()
    code = modelarts.main([f"--data_url={data}", f"--train_url={tmp_path / 'out'}", "--nproc", "2",
                           "--cache_dir", str(tmp_path / "cache"), "data.kind=store", "train.epochs=1"])
    assert code == 0
    assert seen["argv"][:3] == ["train", "--nproc", "2"] and "data.kind=store" in seen["argv"]
    assert f"data.path={data}" in seen["argv"]                      # a local data_url is read in place
    assert (tmp_path / "out" / "run" / "eval.json").is_file()       # outputs copied to train_url

    mox = _FakeMox()
    assert modelarts.stage_in("obs://b/kuairand", str(tmp_path / "d"), mox) == str(tmp_path / "d")
    assert modelarts.stage_in("obs://b/log_1.csv", str(tmp_path / "d"), mox) == str(tmp_path / "d" / "log_1.csv")
    modelarts.stage_out(str(tmp_path / "cache" / "output"), "obs://b/out", mox)
    assert [c[0] for c in mox.calls] == ["copy_parallel", "copy", "copy_parallel"]
    assert mox.calls[-1][2] == "obs://b/out"
    with pytest.raises(RuntimeError, match="needs moxing"):
        modelarts.stage_in("obs://b/x", str(tmp_path / "d"), None)


def test_scripts_print_usage_without_arguments():
    import subprocess
    from conftest import REPO
    for script in ("run_standalone_train.sh", "run_distribute_train.sh"):
        p = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "usage:" in p.stderr


def test_core_share_splits_the_cores_into_equal_blocks():
    from mindgr.parallel.context import core_share
    assert [core_share({0, 1}, r, 2) for r in (0, 1)] == [[0], [1]]
    assert [core_share([4, 5, 6, 7, 8, 9], r, 2) for r in (0, 1)] == [[4, 5, 6], [7, 8, 9]]
    # Uneven: every core goes to exactly one rank, the blocks differ by at most one core.
    shares = [core_share(range(7), r, 3) for r in range(3)]
    assert sorted(c for s in shares for c in s) == list(range(7)) and {len(s) for s in shares} <= {2, 3}
    assert core_share([0], 0, 2) == [] and core_share([0, 1], 2, 2) == []   # too few cores; no such rank
    assert load_config(None, ["parallel.bind_cores=on"]).parallel.bind_cores is True   # YAML 1.1 boolean
    with pytest.raises(ConfigError):
        load_config(None, ["parallel.bind_cores=always"])
