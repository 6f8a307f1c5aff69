"""Ctrl-C on `mindgr train --nproc 2`: the signal reaches every rank, all stop after the same step, rank 0
saves a checkpoint there, and `--resume` continues from it. One msrun job (~13 s to start) and one resume.
"""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from mindgr.parallel.launch import run_job

pytestmark = pytest.mark.slow
TIMEOUT = 240


def _steps(run_dir):
    f = run_dir / "metrics.jsonl"
    if not f.is_file():
        return []
    return [json.loads(l)["step"] for l in f.read_text().splitlines() if l.strip() and '"loss"' in l]


def test_sigint_on_two_ranks_saves_one_checkpoint_that_resumes(tmp_path, tiny_overrides):
    # No periodic or per-epoch checkpoint (ckpt_every beyond the run): the only one is the stop's.
    base = [o for o in tiny_overrides if not o.startswith("run.out_dir")] + [
        f"run.out_dir={tmp_path}", "run.log_every=1", "eval.every_epochs=0", "train.epochs=5000",
        "train.max_steps=100000", "run.ckpt_every=1000000", "parallel.threads=1", "parallel.node_timeout=10",
        "parallel.timeout=60"]
    run_dir = tmp_path / "tiny"
    proc = subprocess.Popen([sys.executable, "-m", "mindgr", "train", "--nproc", "2", *base], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(_steps(run_dir)) < 6:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)                 # what Ctrl-C in the terminal sends the launcher
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "asked 2 of 2 ranks to stop" in err and "all ranks stopped" in err, err[-3000:]
    saved = re.search(r"stopped by SIG[A-Z]+: saved (ckpt-step(\d+))", out)
    assert saved, out[-3000:]
    step = int(saved.group(2))
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt-step*.json"))
    assert ckpts == [f"{saved.group(1)}.json"], ckpts
    # both ranks wrote their shard state for that same step: they stopped at the same boundary
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "ranks").glob("*.json"))
    assert shards == [f"{saved.group(1)}.rank0.json", f"{saved.group(1)}.rank1.json"], shards
    assert max(_steps(run_dir)) == step

    code, out, err, timed_out = run_job([sys.executable, "-m", "mindgr", "train", "--resume", *base,
                                         f"train.max_steps={step + 2}"], TIMEOUT, cwd=REPO)
    assert not timed_out and code == 0, err[-3000:]
    assert f"resumed from {saved.group(1)}: step {step}" in out
    assert _steps(run_dir)[-2:] == [step + 1, step + 2]
