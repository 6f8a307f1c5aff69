"""The sharded item table under msrun, each check its own job (a failed collective desynchronises ranks).

- the self-check on 2 ranks (2 nodes x 1) and 4 ranks (2 nodes x 2): sharded lookup and gradients equal
  the unsharded table's (hierarchical, flat and frequency: its two-stage exchange on the real collectives),
  the traffic model reproduces the counters, staleness bound, reshard round-trip;
- tau = 0 with every-row Adam on 4 ranks (2 x 2) trains exactly like the replicated table: the same
  losses as one process (which data parallel reproduces: test_parallel_dp.py) for 12 steps;
- tau = 2 on 2 ranks: updates applied exactly 2 steps late, replicas of the table identical;
- the frequency layout on 4 ranks (2 x 2) trains the losses of the replicated table, and its checkpoint
  resumes as flat, which continues them;
- shared-pool negatives (loss.negatives=shared_pool) on 2 ranks, hierarchical and frequency layouts at
  tau = 0: the single-process shared-pool losses;
- the modelled inter-node link on 2 ranks at tau = 1: the losses of the run without it, and every step
  reports the link time of its exchange's bytes (no timing is asserted).
"""
import json
import sys

import pytest

from conftest import REPO, TINY
from mindgr.config import load_config
from msrun_fixtures import run_ranks

pytestmark = pytest.mark.slow   # msrun jobs

TIMEOUT = 300


def _rows(path):
    return [json.loads(l) for l in path.read_text().splitlines()]


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in _rows(run_dir / "metrics.jsonl") if "loss" in r}


def _train(nproc, args, cwd=REPO):
    from mindgr.parallel.launch import run_job
    cmd = [sys.executable, "-m", "mindgr", "train", "--nproc", str(nproc), *args, "parallel.threads=1",
           "parallel.calibrate=false", "parallel.cost_a=1",
           "parallel.node_timeout=30", "parallel.timeout=120"]   # 30 s: a loaded 2-core host delays heartbeats
    code, out, err, timed_out = run_job(cmd, TIMEOUT, cwd=cwd)
    assert not timed_out and code == 0, out[-3000:] + err[-3000:]


@pytest.mark.parametrize("nproc", [2, 4])
def test_sharded_table_selftest(tmp_path, nproc):
    code, out, err = run_ranks(nproc, tmp_path / "logs", str(REPO / "tests" / "harness" / "sparse_selftest.py"),
                                 str(tmp_path / "ck"))
    assert code == 0, out[-3000:] + err[-3000:]
    for r in range(nproc):
        lines = [l for l in (tmp_path / "logs" / f"worker_{r}.log").read_text().splitlines()
                 if l.startswith("SPARSETEST ")]
        assert lines, f"rank {r} printed no result"
        res = json.loads(lines[-1][len("SPARSETEST "):])
        assert res["world"] == nproc and res["nodes"] == 2 and res["local_ranks"] == nproc // 2
        assert len(res["checks"]) == 14 and all(res["checks"].values()), res


def _base(tiny_overrides, steps):
    return [o for o in tiny_overrides if not o.startswith("run.out_dir")] + [
        "run.log_every=1", "eval.every_epochs=0", "train.epochs=50", f"train.max_steps={steps}",
        "model.dropout=0.2", f"run.ckpt_every={steps // 2}"]


POOL = ["loss.negatives=shared_pool", "loss.pool_size=24"]


def _one_process(out, base):
    from mindgr.train.trainer import Trainer
    Trainer(load_config(None, base + [f"run.out_dir={out}"]), quiet=True).fit()
    return out / "tiny"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """The replicated table in one process, 12 steps: the losses tau 0 and the frequency layout must train."""
    return _one_process(tmp_path_factory.mktemp("one"), _base(TINY, 12))


@pytest.fixture(scope="module")
def replicated_pool(tmp_path_factory):
    """The same with one shared pool of 24 ids per step, 8 steps."""
    return _one_process(tmp_path_factory.mktemp("one-pool"), _base(TINY, 8) + POOL)


def test_tau0_equals_replicated_table(tmp_path, tiny_overrides, replicated):
    base = _base(tiny_overrides, 12)
    _train(4, base + [f"run.out_dir={tmp_path / 'sharded'}", "parallel.sparse=hierarchical", "parallel.nodes=2",
                      "parallel.staleness=0", "parallel.sparse_update=dense"])
    a, b = _losses(replicated), _losses(tmp_path / "sharded" / "tiny")
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])
    windows = [r for r in _rows(tmp_path / "sharded" / "tiny" / "metrics.jsonl") if "loss" in r]
    assert all(r["sparse_intra_bytes"] > 0 and r["sparse_inter_bytes"] > 0 for r in windows[1:])
    assert all(r["staleness_max"] == 0 for r in windows)
    # sharded evaluation (users encoded from gathered rows) ranks like the replicated model
    from mindgr.train.trainer import evaluate_run
    one, sharded = (json.loads((d / "eval.json").read_text()) for d in (replicated, tmp_path / "sharded" / "tiny"))
    for split in ("valid", "test"):
        assert abs(one[split]["mrr"] - sharded[split]["mrr"]) <= 1e-3, (split, one[split], sharded[split])
    # `mindgr eval` of a sharded run assembles the table from the shard files: the same metrics
    again = evaluate_run(tmp_path / "sharded" / "tiny", "test", "latest")
    assert abs(again["mrr"] - sharded["test"]["mrr"]) <= 1e-3 and again["count"] == sharded["test"]["count"]


def test_staleness_two_is_exact_and_replicas_agree(tmp_path, tiny_overrides):
    run = tmp_path / "stale" / "tiny"
    _train(2, _base(tiny_overrides, 10) + [f"run.out_dir={tmp_path / 'stale'}", "parallel.sparse=hierarchical",
                                           "parallel.nodes=2", "parallel.staleness=2"])
    windows = [r for r in _rows(run / "metrics.jsonl") if "loss" in r]
    assert [r["staleness_max"] for r in windows] == [0, 0] + [2] * 8   # first applied at step 3 (= 1 + 2)
    for step in (5, 10):
        states = [json.loads((run / "checkpoints" / "ranks" / f"ckpt-step{step:08d}.rank{r}.json").read_text())
                  for r in range(2)]
        assert states[0]["table"]["node"] != states[1]["table"]["node"]
        assert states[0]["table"]["rows_crc32"] == states[1]["table"]["rows_crc32"]
    assert sorted(p.name for p in (run / "checkpoints").glob("*.table-*")) == [   # a finished run has a best
        "best.table-0of1.npz", "ckpt-step00000005.table-0of1.npz", "ckpt-step00000010.table-0of1.npz"]


def test_frequency_layout_trains_like_flat_and_resumes_as_flat(tmp_path, tiny_overrides, replicated):
    """Frequency layout (20 of 61 rows hot, the rest flat through the two-stage exchange) on 2 x 2 at
    staleness 0: the losses of the replicated table (one process; flat sharding gives them too: its
    traffic and lookups are checked by the self-check, its training by the resumed half below); its
    checkpoint (explicit row ids) resumed as flat continues them."""
    common = ["parallel.nodes=2", "parallel.staleness=0", "parallel.sparse_update=dense"]
    freq = _base(tiny_overrides, 4) + [f"run.out_dir={tmp_path / 'freq'}", "parallel.sparse=frequency",
                                       "parallel.hot_rows=20", *common]
    _train(4, freq)
    run = tmp_path / "freq" / "tiny"
    meta = [json.loads(p.read_text()) for p in (run / "checkpoints").glob("ckpt-step*.json")]
    assert meta, "no checkpoint"
    assert len(list((run / "checkpoints").glob("ckpt-step00000004.table-*of4.npz"))) == 4
    windows = [r for r in _rows(run / "metrics.jsonl") if "loss" in r]
    assert all(r["sparse_inter_bytes"] > 0 and r["staleness_max"] == 0 for r in windows[1:])
    _train(4, ["--resume", *[o for o in freq if not o.startswith(("train.max_steps", "parallel.sparse="))],
               "train.max_steps=8", "parallel.sparse=flat"])
    a, b = {k: v for k, v in _losses(replicated).items() if k <= 8}, _losses(run)    # its first 8 steps
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])


@pytest.mark.parametrize("layout", ["hierarchical", "frequency"])
def test_shared_pool_equals_one_process(tmp_path, tiny_overrides, replicated_pool, layout):
    """One pool of 24 ids per step, the same on both ranks (2 x 1, tau 0, every-row Adam): the losses of
    the single-process shared_pool run within 1e-5 for 8 steps (frequency: 20 hot rows, the rest fetched
    through the two-stage exchange)."""
    base = _base(tiny_overrides, 8) + POOL
    _train(2, base + [f"run.out_dir={tmp_path / 'sharded'}", f"parallel.sparse={layout}", "parallel.nodes=2",
                      "parallel.staleness=0", "parallel.sparse_update=dense", "parallel.hot_rows=20"])
    a, b = _losses(replicated_pool), _losses(tmp_path / "sharded" / "tiny")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5 * abs(a[step]), (step, a[step], b[step])
    windows = [r for r in _rows(tmp_path / "sharded" / "tiny" / "metrics.jsonl") if "loss" in r]
    assert all(r["sparse_inter_bytes"] > 0 and r["staleness_max"] == 0 for r in windows[1:])


def test_modelled_link_trains_the_same_and_reports_its_delay(tmp_path, tiny_overrides):
    common = _base(tiny_overrides, 8) + ["parallel.sparse=hierarchical", "parallel.nodes=2", "parallel.staleness=1",
                                         "run.ckpt_every=8"]    # no flush (checkpoint) between steps 1 and 8
    latency_ms, gbps = 1.0, 0.001
    _train(2, common + [f"run.out_dir={tmp_path / 'off'}"])
    _train(2, common + [f"run.out_dir={tmp_path / 'on'}", f"parallel.link_latency_ms={latency_ms}",
                        f"parallel.link_gbps={gbps}"])
    off, on = _losses(tmp_path / "off" / "tiny"), _losses(tmp_path / "on" / "tiny")
    assert sorted(on) == sorted(off) == list(range(1, 9))         # the link only delays the updates:
    assert all(abs(on[k] - off[k]) <= 1e-6 * abs(off[k]) for k in on), (on, off)   # the same losses
    windows = [r for r in _rows(tmp_path / "on" / "tiny" / "metrics.jsonl") if "loss" in r]
    assert windows[0]["sparse_link_delay_s"] == 0.0               # step 1: nothing exchanged yet (tau = 1)
    for r in windows[1:]:
        # each rank sent 2 cross-node messages (reduce, gather) and its share of the step's inter bytes
        # (summed over the 2 ranks); the slowest rank's delay is logged, its link is not shared (1 x 1 node)
        least = 2 * latency_ms / 1e3 + r["sparse_inter_bytes"] / 2 / (gbps * 1e9)
        most = 2 * latency_ms / 1e3 + r["sparse_inter_bytes"] / (gbps * 1e9)
        assert r["sparse_inter_bytes"] > 0 and least * (1 - 1e-9) <= r["sparse_link_delay_s"] <= most * (1 + 1e-9), r
        assert 0.0 <= r["sparse_link_wait_s"] <= r["sparse_link_delay_s"] * (1 + 1e-9), r
    assert not any("sparse_link_delay_s" in r for r in _rows(tmp_path / "off" / "tiny" / "metrics.jsonl"))
    meta = json.loads((tmp_path / "on" / "tiny" / "checkpoints" / "ckpt-step00000008.json").read_text())
    assert meta["parallel"]["table"]["link"] == {"latency_ms": latency_ms, "gbps": gbps, "local_ranks": 1}
