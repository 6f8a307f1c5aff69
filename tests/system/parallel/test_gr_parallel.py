"""The generative task on the data-parallel executor: the GR smoke config trained on 2 msrun processes
reproduces 1 process on the same global batches.

Each rank packs its examples' NTP rows (the cost-balanced split of the single-process batch), takes its
rows of the single-process dropout masks (dropout 0.1 in configs/gr-smoke.yaml) and weights its loss by
its share of the global batch's target weights, so the summed gradients are the single-process ones and
the losses agree to float summation order. Every rank decodes the evaluation users; the result equals a
single-process evaluation of the same checkpoint. The run uses the trie head (model.trie_softmax, as the
shipped Beauty config): a rank packs its loss entries at its own capacity. (The per-level softmax head
differs only in its loss entries, which need no packing: one msrun job covers the shared path.)
"""
import json
import os
import sys

import numpy as np
import pytest

from conftest import REPO
from gr_fixtures import random_codes
from mindgr.config import load_config

pytestmark = pytest.mark.slow   # an msrun job

TIMEOUT = 300
CONFIG = str(REPO / "configs" / "gr-smoke.yaml")
SMALL = ["data.synthetic.num_users=300", "run.log_every=1", "eval.every_epochs=0", "train.epochs=50",
         "train.max_steps=12", "run.ckpt_every=6", "eval.max_users=40"]


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_gr_smoke_trains_on_two_processes_like_one(tmp_path):
    from mindgr.ids.codes import save_codes
    from mindgr.parallel.launch import run_job
    from mindgr.train.data import load_store
    from mindgr.train.generative import GenerativeTrainer, evaluate_generative_run
    store = load_store(load_config(CONFIG, SMALL).data)
    levels = [16, 16, 4]
    codes = save_codes(tmp_path / "codes.parquet", random_codes(np.random.default_rng(5), store.num_items, levels),
                       levels, store.item_raw_ids, {"note": "random"})
    base = SMALL + ["ids.from_run=", f"ids.codes={codes}", "model.trie_softmax=true"]
    one = load_config(CONFIG, base + [f"run.out_dir={tmp_path / 'one'}"])
    GenerativeTrainer(one, quiet=True).fit()

    cmd = [sys.executable, "-m", "mindgr", "train", "--config", CONFIG, "--nproc", "2", *base,
           f"run.out_dir={tmp_path / 'two'}", "parallel.threads=1", "parallel.node_timeout=30",
           "parallel.timeout=120"] + (["parallel.bind_cores=true"] if len(os.sched_getaffinity(0)) >= 2 else [])
    code, out, err, timed_out = run_job(cmd, TIMEOUT, cwd=REPO)
    assert not timed_out and code == 0, out[-3000:] + err[-3000:]
    run1, run2 = tmp_path / "one" / "gr-smoke", tmp_path / "two" / "gr-smoke"

    a, b = _losses(run1), _losses(run2)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])
    log = (run2 / "msrun" / "worker_0.log").read_text()
    assert "parallel: 2 ranks" in log, log[-2000:]            # it really ran data parallel
    assert not (run2 / "msrun" / "worker_1.log").read_text().count("Traceback")
    states = [json.loads(p.read_text()) for p in sorted((run2 / "checkpoints" / "ranks").glob("*step00000012*"))]
    assert len(states) == 2 and len({s["param_crc32"] for s in states}) == 1, states

    # Every rank decoded the test users: the result is a single-process decode of the same weights.
    gathered = json.loads((run2 / "eval.json").read_text())["test"]
    single = evaluate_generative_run(run2, "test", "latest")
    for key in ("count", "hr@1", "hr@5", "hr@10", "ndcg@10", "mrr"):
        assert single[key] == gathered[key], (key, single[key], gathered[key])
