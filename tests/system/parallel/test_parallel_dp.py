"""2-process data parallel training reproduces 1 process on the same global batches.

The 1-process run trains at the global capacities; the 2-process run splits every global batch over
2 ranks (cost-balanced) and sums the gradients of the globally normalised loss. Host draws (negatives
AND dropout masks, dropout 0.2 here) are taken token by token from the single-process draws, so the
losses must agree to float summation order for all 20 steps. Evaluation is split over the ranks and
gathered: it must equal a single-process evaluation of the same checkpoint exactly.
"""
import json
import os
import sys

import pytest

from conftest import REPO, TINY
from mindgr.config import load_config

pytestmark = pytest.mark.slow   # an msrun job

TIMEOUT = 300


def _rows(run_dir, name="metrics.jsonl"):
    return [json.loads(l) for l in (run_dir / name).read_text().splitlines()]


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in _rows(run_dir) if "loss" in r}


def _base(ckpt_every: int) -> list[str]:
    return [*TINY, "run.log_every=1", "eval.every_epochs=0", "train.epochs=50", "train.max_steps=20",
            "model.dropout=0.2", f"run.ckpt_every={ckpt_every}"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 20 steps trained by one process (once for both tests: checkpoints do not change the losses)."""
    from mindgr.train.trainer import Trainer
    out = tmp_path_factory.mktemp("one")
    Trainer(load_config(None, _base(10) + [f"run.out_dir={out}"]), quiet=True).fit()
    return out / "tiny"


def _one_and_two(tmp_path, one_process, ckpt_every: int, two_extra: list[str]):
    """The same 20 steps trained by one process and by 2 msrun ranks (`two_extra` on the ranks only);
    the losses must agree to 1e-5 relative -> the 2-rank run's dir."""
    from mindgr.parallel.launch import run_job
    cmd = [sys.executable, "-m", "mindgr", "train", "--nproc", "2", *_base(ckpt_every),
           f"run.out_dir={tmp_path / 'two'}", "parallel.threads=1", "parallel.node_timeout=30",
           "parallel.timeout=120", *two_extra]
    code, out, err, timed_out = run_job(cmd, TIMEOUT, cwd=REPO)
    assert not timed_out and code == 0, out[-3000:] + err[-3000:]
    run2 = tmp_path / "two" / "tiny"
    a, b = _losses(one_process), _losses(run2)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])
    return run2


def test_mindspore_data_parallel_mode_trains_like_one(tmp_path, one_process):
    """parallel.grad_reduce=mindspore: MindSpore's DATA_PARALLEL mode and its gradient reducer (one fusion
    bucket) in the one-graph step (parallel.fused_step) give the 1-process losses for 20 steps, and both replicas
    hold the same weights. (The test below covers the shared-memory host sum, parallel.grad_reduce=host, in the
    two-graph step; the flat sum (own) trains beside the sharded table in the sparse tests;
    tests/harness/grad_reduce_selftest.py checks all three sums, the reducer's with more buckets.)"""
    from mindgr.train.trainer import evaluate_run
    run2 = _one_and_two(tmp_path, one_process, 20, ["parallel.grad_reduce=mindspore", "parallel.fused_step=true"])
    log = (run2 / "msrun" / "worker_0.log").read_text()
    assert "MindSpore DATA_PARALLEL, 1 fusion bucket(s), one graph per step" in log
    states = [json.loads(p.read_text()) for p in sorted((run2 / "checkpoints" / "ranks").glob("*.json"))]
    assert len(states) == 2 and len({s["param_crc32"] for s in states}) == 1, states
    # the evaluation graphs compiled under DATA_PARALLEL: split and gathered == one process, same weights
    gathered = json.loads((run2 / "eval.json").read_text())
    single = evaluate_run(run2, "test", "latest")
    assert all(single[k] == v for k, v in gathered["test"].items()), (single, gathered["test"])


def test_two_processes_train_like_one(tmp_path, one_process):
    from mindgr.train.trainer import evaluate_run
    bind = ["parallel.bind_cores=true"] if len(os.sched_getaffinity(0)) >= 2 else []
    run2 = _one_and_two(tmp_path, one_process, 10, ["parallel.grad_reduce=host", *bind])

    # Rank 0 logged the balance of every step; both ranks left their shard state at each checkpoint.
    assert "shared memory on one host, two graphs per step" in (run2 / "msrun" / "worker_0.log").read_text()
    windows = [r for r in _rows(run2) if "loss" in r]
    assert all("imbalance_pred" in r and len(r["rank_step_s"]) == 2 for r in windows)
    per_step = _rows(run2, "balance.jsonl")
    assert [r["step"] for r in per_step] == list(range(1, 21))
    assert all(len(r["step_s"]) == 2 and len(r["pred_cost"]) == 2 for r in per_step)
    shards = sorted(p.name for p in (run2 / "checkpoints" / "ranks").glob("*.json"))
    assert shards == [f"ckpt-step{s:08d}.rank{r}.json" for s in (10, 20) for r in (0, 1)]
    states = [json.loads((run2 / "checkpoints" / "ranks" / n).read_text()) for n in shards[2:]]
    assert len({s["param_crc32"] for s in states}) == 1, "the two replicas hold different weights"
    if len(os.sched_getaffinity(0)) >= 2:             # parallel.bind_cores=true: each rank on its own cores
        assert all(s["cores"] for s in states) and not set(states[0]["cores"]) & set(states[1]["cores"]), states
    assert not (run2 / "msrun" / "worker_1.log").read_text().count("Traceback")

    # Split-and-gathered evaluation == one process evaluating the same weights.
    gathered = json.loads((run2 / "eval.json").read_text())
    for split in ("valid", "test"):
        single = evaluate_run(run2, split, "latest")
        for key, value in gathered[split].items():
            assert single[key] == value, (split, key, single[key], value)
