"""Pieces of the sharded item table that need no second process: initial rows, the row optimizer against
MindSpore's AdamWeightDecay, the traffic model on a hand-counted example, shard checkpoints with
reshard, config errors. The collective parts run under msrun in test_parallel_sparse_msrun.py."""
import numpy as np
import pytest

from mindgr.config import ConfigError, load_config
from mindgr.models.layers import trunc_normal
from mindgr.train import table_checkpoint as ck
from mindgr.parallel.sparse.init import ShardDraw, owned_rows
from mindgr.parallel.sparse.row_adam import RowAdam
from mindgr.parallel.sparse.topology import resolve
from mindgr.parallel.sparse.traffic import model_step
from mindgr.train.checkpoint import CheckpointError


@pytest.mark.parametrize("shards,shard", [(1, 0), (3, 1), (4, 3)])
def test_shard_draw_is_the_replicated_draw(shards, shard, monkeypatch):
    import mindgr.parallel.sparse.init as init
    monkeypatch.setattr(init, "_CHUNK", 64)                 # many chunks on a small table
    full = trunc_normal(np.random.default_rng(7), (53, 5), 0.5)
    after_full = np.random.default_rng(7)
    trunc_normal(after_full, (53, 5), 0.5)
    rng = np.random.default_rng(7)
    draw = ShardDraw(owned_rows(53, shards, shard))
    assert draw(rng, (53, 5), 0.5).shape == (1, 5)
    assert np.array_equal(draw.rows, full[shard::shards])
    assert rng.standard_normal() == after_full.standard_normal()   # later parameters draw the same


def test_row_adam_every_row_matches_mindspore():
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn
    from mindgr.train.trainer import setup_mindspore
    setup_mindspore(load_config(None, ["ops.backend=reference"]))   # device before any kernel runs
    rng = np.random.default_rng(0)
    table = rng.standard_normal((9, 4)).astype(np.float32)
    p = Parameter(Tensor(table.copy()), name="item_emb")
    opt = nn.AdamWeightDecay([p], learning_rate=0.01, beta1=0.9, beta2=0.98, eps=1e-8, weight_decay=0.1)
    mine = RowAdam(table.copy(), 0.01, 0.9, 0.98, 1e-8, 0.1, lazy=False)
    for step in range(4):
        slots = np.sort(rng.choice(9, 4, replace=False))
        g = rng.standard_normal((4, 4)).astype(np.float32)
        dense = np.zeros((9, 4), np.float32)
        dense[slots] = g
        opt((Tensor(dense),))
        mine.apply(slots, g)
        np.testing.assert_allclose(mine.rows, p.asnumpy(), rtol=1e-6, atol=1e-7)
    assert ms.__version__


def test_lazy_row_adam_moves_only_touched_rows():
    rows = np.ones((6, 2), np.float32)
    opt = RowAdam(rows, 0.1, 0.9, 0.98, 1e-8, 0.0, lazy=True)
    opt.apply(np.array([1, 4]), np.ones((2, 2), np.float32))
    opt.apply(np.array([4]), np.ones((1, 2), np.float32))
    assert np.array_equal(rows[[0, 2, 3, 5]], np.ones((4, 2)))
    assert rows[1, 0] < 1 and rows[4, 0] < rows[1, 0]          # row 1 moved once, row 4 twice


def test_traffic_model_hand_counted():
    # 2 nodes x 1 rank, rows of 1 float (4 bytes), ids 4 bytes. Rank 0 holds ids {0, 1}, rank 1 {1, 2}.
    out = model_step([np.array([0, 1]), np.array([1, 2])], nodes=2, local_ranks=1, dim=1, num_rows=10)
    # hierarchical: nothing inside a node; across, reducer of slot s is node s % 2. Phase 1: node 0 sends
    # slot 1 (8 B), node 1 sends slot 2 (8 B). Phase 2: node 0 sends its sums of {0, 2} (16 B), node 1 of {1}.
    assert out["hierarchical"]["intra"].tolist() == [0, 0]
    assert out["hierarchical"]["inter"].tolist() == [24, 16]
    # flat: rank 0 asks rank 1 for id 1 (id + gradient, 8 B) and answers id 2 (row, 4 B); symmetric.
    assert out["flat"]["inter"].tolist() == [12, 12]
    assert out["dp"]["inter"].tolist() == [40.0, 40.0]             # 2 (n-1)/n x 10 rows x 4 B


def test_traffic_model_one_node_has_no_inter_traffic():
    rng = np.random.default_rng(1)
    ids = [np.unique(rng.integers(0, 50, 20)) for _ in range(4)]
    out = model_step(ids, nodes=1, local_ranks=4, dim=3, num_rows=50)
    assert out["hierarchical"]["inter"].sum() == out["flat"]["inter"].sum() == 0
    assert out["hierarchical"]["intra"].sum() == out["flat"]["intra"].sum() > 0


def test_checkpoint_reshards_exactly(tmp_path):
    rng = np.random.default_rng(3)
    rows, m, v = (rng.standard_normal((23, 3)).astype(np.float32) for _ in range(3))
    for s in range(3):
        own = owned_rows(23, 3, s)
        ck.save_shard(tmp_path, "ckpt", s, 3, 23, rows[own], m[own], v[own])
    for shards in (1, 2, 3, 5):
        for s in range(shards):
            got = ck.load_shard(tmp_path, "ckpt", 23, shards, s)
            own = owned_rows(23, shards, s)
            for a, b in zip(got, (rows, m, v)):
                assert np.array_equal(a, b[own])
    (tmp_path / "ckpt.table-1of3.npz").unlink()
    with pytest.raises(CheckpointError, match="no complete set"):
        ck.load_shard(tmp_path, "ckpt", 23, 2, 0)
    with pytest.raises(CheckpointError, match="rows"):
        ck.save_shard(tmp_path, "x", 0, 1, 23, rows, m, v)
        ck.load_shard(tmp_path, "x", 24, 1, 0)


def test_config_errors():
    with pytest.raises(ConfigError, match="nodes x parallel.local_ranks = 2 x 3 != parallel.nproc = 4"):
        load_config(None, ["parallel.sparse=hierarchical", "parallel.nproc=4", "parallel.nodes=2",
                           "parallel.local_ranks=3"])
    for strategy in ("in_batch", "mixed"):
        with pytest.raises(ConfigError, match="per_token or shared_pool"):
            load_config(None, ["parallel.sparse=flat", f"loss.negatives={strategy}"])
    with pytest.raises(ConfigError, match="loss.sampling = uniform"):
        load_config(None, ["parallel.sparse=frequency", "loss.negatives=shared_pool", "loss.sampling=popularity"])
    load_config(None, ["parallel.sparse=hierarchical", "loss.negatives=shared_pool", "loss.fp16_negatives=true",
                       "loss.pool_estimate=per_token"])
    with pytest.raises(ConfigError, match="parallel.sparse"):
        load_config(None, ["parallel.sparse=sharded"])
    with pytest.raises(ConfigError, match="match the 4 ranks"):
        resolve(3, 0, 4, 0)
    t = resolve(2, 0, 4, 3)
    assert (t.node, t.local, t.intra_ranks, t.inter_ranks) == (1, 1, [2, 3], [1, 3])
    assert resolve(0, 0, 4, 0, hosts=[5, 5, 5, 5]).local_ranks == 4
