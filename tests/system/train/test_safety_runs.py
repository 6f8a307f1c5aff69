"""Safe runs (issue 14): divergence stops, one writer per run dir, data fingerprints, checkpoints replaced
as a unit, a finished run left alone, honest metrics.jsonl, movable run dirs, eval's one-line errors."""
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from mindgr.cli import main as cli
from mindgr.config import ConfigError, load_config
from mindgr.train.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.slow  # complete small training runs per case (~2 min in all)


def _rows(run_dir, name="metrics.jsonl"):
    return [json.loads(l) for l in (run_dir / name).read_text().splitlines()]


def _one_line_error(capsys):
    err = capsys.readouterr().err                 # (MindSpore's own warnings go to the same stream in-process)
    ours = [l for l in err.splitlines() if l.startswith("mindgr:")]
    assert len(ours) == 1 and ours[0].startswith("mindgr: error:"), err[-2000:]
    return ours[0]


def _train(overrides, resume=False):
    from mindgr.train.trainer import Trainer
    return Trainer(load_config(None, overrides), resume=resume, quiet=True).fit()


def test_divergence_stops_the_run_and_resume_with_a_lower_lr_continues(tmp_path, tiny_overrides, capsys):
    base = tiny_overrides + ["run.ckpt_every=3"]
    _train(base + ["train.max_steps=3"])                      # a good checkpoint at step 3, validated at the end
    run = tmp_path / "tiny"
    assert json.loads((run / "checkpoints" / "best.json").read_text())["step"] == 3
    assert cli(["train", *base, "train.lr=1e30", "--resume"]) == 1
    err = _one_line_error(capsys)
    assert "diverged at step 6" in err and "ckpt-step00000003" in err and "--resume train.lr=" in err, err
    ckpts = CheckpointManager(run, 2)
    assert ckpts.latest().name == "ckpt-step00000003"   # nothing non-finite saved
    assert json.loads(ckpts.best().with_suffix(".json").read_text())["step"] == 3
    # the advice works: train.lr may change on resume
    result = _train(base + ["train.lr=1e-3"], resume=True)
    assert result["step"] == 12 and ckpts.best() is not None
    assert np.isfinite(result["test"]["hr@10"]) and result["test"]["hr@10"] < 1.0


def test_a_second_writer_is_refused_and_a_killed_writer_leaves_no_live_lock(tmp_path, tiny_overrides, capsys):
    overrides = [o for o in tiny_overrides if not o.startswith("train.epochs")] + [
        "train.epochs=500", "eval.every_epochs=0", "run.log_every=1"]
    first = subprocess.Popen([sys.executable, "-m", "mindgr", "train", *overrides], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:
            if line.startswith("step      2"):
                break
        assert first.poll() is None
        assert cli(["train", *overrides, "train.max_steps=1"]) == 1
        err = _one_line_error(capsys)
        assert f"in use by another training (pid {first.pid})" in err, err
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    from mindgr.train.runlock import RunLock
    lock = RunLock(tmp_path / "tiny").acquire()          # the kernel dropped the killed process's lock
    assert lock.held
    lock.release()


@pytest.fixture(scope="module")
def store_run(tmp_path_factory):
    """A short run on a prepared store (a source with files to fingerprint)."""
    from mindgr.datasets import prepare
    root = tmp_path_factory.mktemp("store_run")
    prepare("synthetic", None, str(root / "store"), num_users=120, num_items=60, median_len=10, max_len=20)
    overrides = [f"run.out_dir={root}", "run.name=r", "data.kind=store", f"data.path={root / 'store'}",
                 "data.max_len=20", "model.dim=16", "model.num_blocks=1", "model.num_heads=2",
                 "loss.num_negatives=8", "train.batch_size=16", "train.max_steps=2", "eval.every_epochs=0",
                 "ops.backend=reference"]
    _train(overrides)
    return root, overrides


def _copy_run(store_run, tmp_path):
    root, overrides = store_run
    shutil.copytree(root, tmp_path / "c")
    cfg = tmp_path / "c" / "r" / "config.yaml"               # the copy trains on the copied store
    cfg.write_text(cfg.read_text().replace(str(root), str(tmp_path / "c")))
    overrides = [o.replace(str(root), str(tmp_path / "c")) for o in overrides]
    return tmp_path / "c", overrides


def test_changed_data_is_refused_by_eval_and_resume(store_run, tmp_path, capsys):
    from mindgr.train.trainer import evaluate_run
    root, overrides = _copy_run(store_run, tmp_path)
    run = root / "r"
    assert evaluate_run(run, which="latest")["count"] == 120
    stats = root / "store" / "stats.json"
    stats.write_text(stats.read_text() + " ")               # the source rewritten under the run
    with pytest.raises(CheckpointError, match="stats.json") as e:
        evaluate_run(run, which="latest")
    assert "--allow-data-change" in str(e.value)
    assert cli(["eval", "--run", str(run), "--checkpoint", "latest", "--allow-data-change", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 120 and "changed data" in out["data_note"]
    assert cli(["train", *overrides, "train.max_steps=4", "--resume"]) == 1
    assert "data of" in _one_line_error(capsys)


def test_kill_mid_save_keeps_the_previous_best_loadable(tmp_path, monkeypatch):
    import mindgr.train.checkpoint as ck
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save_best({"w": np.full(8, 1.0, np.float32)}, {"step": 1})

    def dies(*a, **k):
        raise KeyboardInterrupt("killed")
    for where in ("_write_sidecar", "file_sha256"):      # after the new weights, before the sidecar
        with monkeypatch.context() as m:
            m.setattr(ck, where, dies)
            with pytest.raises(KeyboardInterrupt):
                mgr.save_best({"w": np.full(8, 2.0, np.float32)}, {"step": 2})
        tensors, meta = load_checkpoint(mgr.best())
        assert meta["step"] == 1 and tensors["w"][0] == 1.0
    mgr.save_best({"w": np.full(8, 3.0, np.float32)}, {"step": 3})
    tensors, meta = load_checkpoint(mgr.best())
    assert meta["step"] == 3 and tensors["w"][0] == 3.0
    weights = sorted(p.name for p in (tmp_path / "checkpoints").glob("best*.safetensors"))
    assert weights == [meta["weights"]]                        # the replaced weights were removed


def _snapshot(run_dir):
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_resume_of_a_finished_run_changes_nothing(tmp_path, tiny_overrides, capsys):
    base = tiny_overrides + ["train.max_steps=3", "eval.every_epochs=0"]
    _train(base)
    run = tmp_path / "tiny"
    before = _snapshot(run)
    assert cli(["train", *base, "--resume"]) == 0
    assert "the run is complete (step 3" in capsys.readouterr().out
    assert _snapshot(run) == before


def test_metrics_records_carry_time_and_attempt_and_resume_cuts_them_back(tmp_path, tiny_overrides):
    base = tiny_overrides + ["eval.every_epochs=0", "run.log_every=1", "run.ckpt_every=2"]
    _train(base + ["train.max_steps=3"])
    run = tmp_path / "tiny"
    first = _rows(run)
    assert all(isinstance(r["time"], float) and r["attempt"] for r in first)
    # a crash after step 3 was logged but before its checkpoint: only ckpt-step2 remains
    (run / "checkpoints" / "ckpt-step00000003.json").unlink()
    _train(base + ["train.max_steps=4"], resume=True)
    rows = _rows(run)
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [1, 2, 3, 4]                              # step 3 once: the first attempt's was cut
    attempts = [r["attempt"] for r in rows if "loss" in r]
    assert attempts[0] == attempts[1] != attempts[2] == attempts[3]


def test_a_fresh_run_never_appends_to_old_logs(tmp_path, tiny_overrides):
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 99, "loss": 1.0}) + "\n")
    _train(tiny_overrides + ["train.max_steps=2", "eval.every_epochs=0"])
    assert 99 not in [r.get("step") for r in _rows(run)]
    assert _rows(run, "metrics.prev.jsonl")[0]["step"] == 99


def test_a_copied_run_dir_resumes_and_evaluates(store_run, tmp_path):
    from mindgr.train.trainer import evaluate_run
    root, overrides = store_run
    shutil.copytree(root / "r", tmp_path / "moved")
    moved = [o for o in overrides if not o.startswith(("run.out_dir", "run.name"))] + [
        f"run.out_dir={tmp_path}", "run.name=moved", "train.max_steps=3"]
    assert _train(moved, resume=True)["step"] == 3
    assert evaluate_run(tmp_path / "moved", which="latest")["step"] == 3


def test_eval_one_line_errors(store_run, tmp_path, monkeypatch):
    import mindgr.train.trainer as trainer
    root, _ = _copy_run(store_run, tmp_path)
    run = root / "r"
    for path in (run / "checkpoints").glob("best*"):           # as if stopped before its final evaluation
        path.unlink()
    with pytest.raises(CheckpointError, match="no best checkpoint.*--checkpoint latest"):
        trainer.evaluate_run(run, which="best")
    # a read-only run dir: the ranks go to the cache, and the result says where
    import mindgr.train.saved_run as saved_run    # where evaluations pick their ranks directory
    real = saved_run._can_write
    monkeypatch.setattr(saved_run, "_can_write", lambda d: OSError(30, "Read-only file system")
                        if str(d).startswith(str(run)) else real(d))
    monkeypatch.setenv("MINDGR_CACHE", str(tmp_path / "cache"))
    out = trainer.evaluate_run(run, which="latest")
    assert out["ranks_file"].startswith(str(tmp_path / "cache")) and "Read-only" in out["ranks_note"]
    assert not (run / "ranks").exists()
    monkeypatch.undo()
    # a sidecar with the wrong fields
    side = run / "checkpoints" / "ckpt-step00000002.json"
    good = side.read_text()
    side.write_text(json.dumps({"step": 2}))
    with pytest.raises(CheckpointError, match="sidecar lacks weights, sha256, bytes"):
        trainer.evaluate_run(run, which="latest")
    side.write_text(good)
    # a damaged or invalid config.yaml
    cfg = run / "config.yaml"
    cfg.write_text("run: [\n")
    with pytest.raises(CheckpointError, match="config.yaml: not valid YAML"):
        trainer.evaluate_run(run, which="latest")
    cfg.write_text("model: {dim: -1}\n")
    with pytest.raises(ConfigError, match="config.yaml.*model.dim"):
        trainer.evaluate_run(run, which="latest")


def test_a_failed_data_load_leaves_no_run_dir_and_too_many_negatives_is_an_error(tmp_path, tiny_overrides):
    from mindgr.datasets import DataError
    from mindgr.train.trainer import Trainer
    bad = tmp_path / "bad.txt"
    bad.write_text("not a rating line\n")
    with pytest.raises((DataError, ValueError)):
        Trainer(load_config(None, tiny_overrides + ["data.kind=movielens-1m", f"data.path={bad}"]), quiet=True)
    assert not (tmp_path / "tiny").exists()
    with pytest.raises(ConfigError, match="loss.num_negatives = 500 is larger than the catalogue"):
        Trainer(load_config(None, tiny_overrides + ["loss.num_negatives=500"]), quiet=True)
    assert not (tmp_path / "tiny").exists()


def test_step_lines_show_progress_and_the_peak_and_a_summary_ends_the_run(tmp_path, tiny_overrides, capsys):
    from mindgr.train.trainer import Trainer
    Trainer(load_config(None, tiny_overrides + ["train.max_steps=4", "run.log_every=2"])).fit()
    out = capsys.readouterr().out
    steps = [l for l in out.splitlines() if l.startswith("step ")]
    assert steps and all("/4 " in l and " eta " in l and "GFLOP/s" in l for l in steps), steps
    assert "summary:" in out and "vs popularity" in out and "tokens/s" in out and "eval.json" in out
