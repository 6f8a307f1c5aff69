"""Shared-pool negatives with the sharded table (loss.negatives=shared_pool, parallel.sparse): every rank
draws the single process's pool of the step, the pool loss on gathered rows is the single-process pool
loss, and the byte model's touch probabilities count the pool once per job. The msrun equivalence of the
losses is in tests/system/parallel/test_parallel_sparse_msrun.py."""
from types import SimpleNamespace

import numpy as np
import pytest

from mindgr.config import load_config
from mindgr.parallel.sparse.traffic import hot_cut, touch_probabilities


def _task(tiny_overrides, *extra):
    from mindgr.train.task import RetrievalTask
    cfg = load_config(None, tiny_overrides + ["loss.negatives=shared_pool", "loss.pool_size=24", *extra])
    task = RetrievalTask(cfg)
    task.load()
    task.sampler = task.make_sampler(SimpleNamespace(dropout_sites=1, dropout_width=4))
    return task


@pytest.mark.parametrize("draws", ["global", "sequence"])
def test_every_rank_draws_the_single_process_pool(tiny_overrides, draws):
    from mindgr.parallel.balance import CostModel
    from mindgr.parallel.plan import RankPlanner, rank_capacities
    from mindgr.train.executor import StepShape
    task = _task(tiny_overrides, f"parallel.draws={draws}")
    tr, n = task.data.train, task.data.num_items
    pools = []
    for epoch in (0, 1):
        for b, indices in list(task.data.plan.iter_batches(epoch))[:3]:
            single = task.inputs(epoch, b, indices)[0].negatives          # the one-process step's (ids, logQ)
            assert len(single) == 2 and single[0].shape == (24,) and single[1].shape == (24,)
            assert single[0].min() >= 1 and single[0].max() <= n
            pools.append(single[0])
            for world in (2, 3):
                tokens, rows = rank_capacities(tr.token_capacity, tr.row_capacity, world,
                                               task.cfg.parallel.capacity_slack)
                shape = StepShape(tr.token_capacity, tr.row_capacity, tokens, rows, 0)
                for rank in range(world):
                    share = RankPlanner(tr, world, rank, tokens, rows, CostModel(a=1.0, b=0.0)).share(epoch, b, indices)
                    mine = task.rank_inputs(epoch, b, indices, share, shape)[0].negatives
                    assert np.array_equal(mine[0], single[0]) and np.array_equal(mine[1], single[1])
    # a new pool every step (6 pools of 24 draws from 60 items: equal by chance with probability ~0)
    assert len({p.tobytes() for p in pools}) == len(pools)


def test_pool_rows_loss_is_the_shared_negatives_loss():
    """RowsPoolLoss on the step's gathered rows (ids remapped to slots) = SharedNegativesLoss on the whole
    table: the loss, and the table gradient's nonzero rows = the gradient of the rows."""
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindgr.models import build_encoder
    from mindgr.models.losses import SharedNegativesLoss
    from mindgr.parallel.sparse.executor import remap
    from mindgr.parallel.sparse.step import RowsPoolLoss
    from mindgr.train.trainer import setup_mindspore
    cfg = load_config(None, ["ops.backend=reference", "model.dim=8", "model.num_blocks=1", "model.num_heads=2",
                             "model.dropout=0.0", "data.max_len=12"])
    setup_mindspore(cfg)
    V, T, K = 40, 12, 16
    rng = np.random.default_rng(5)
    enc = build_encoder(cfg.model, V, cfg.data.max_len, 3)
    ids = np.zeros(T, np.int32)
    ids[:9] = rng.integers(1, V + 1, 9)
    targets = np.zeros(T, np.int32)
    targets[:9] = np.concatenate([ids[1:9], [rng.integers(1, V + 1)]])
    targets[4] = 0                                                             # a position without a target
    positions = np.zeros(T, np.int32)
    positions[:5], positions[5:9] = np.arange(5), np.arange(4)
    offsets = np.array([0, 5, 9, 9], np.int32)
    times = np.zeros(T, np.int64)
    request = np.zeros(3, np.int64)
    pool = rng.integers(1, V + 1, K).astype(np.int32)
    pool[3], pool[7] = targets[2], 0                                           # an accidental hit, an unused slot
    logq = rng.normal(size=K).astype(np.float32)
    drop = np.ones((enc.dropout_sites, T, enc.dropout_width), np.float32)

    full = SharedNegativesLoss(enc, 0.05)
    table_param = [enc.item_emb]
    loss_a, (g_table,) = ms.value_and_grad(full, None, table_param)(
        Tensor(ids), Tensor(positions), Tensor(offsets), Tensor(times), Tensor(request), Tensor(targets),
        Tensor(pool), Tensor(logq), Tensor(drop))
    table = enc.item_emb.asnumpy()
    uniq = np.unique(np.concatenate([[0], ids, targets, pool]).astype(np.int64))
    u_cap = len(uniq) + 3                                                      # padded like the executor
    rows = np.zeros((u_cap, table.shape[1]), np.float32)
    rows[: len(uniq)] = table[uniq]

    class Grad(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fn = ms.value_and_grad(RowsPoolLoss(enc, 0.05, False), 0)

        def construct(self, *x):
            return self.fn(*x)

    loss_b, g_rows = Grad()(Tensor(rows), Tensor(remap(uniq, ids)), Tensor(positions), Tensor(offsets),
                            Tensor(times), Tensor(request), Tensor(remap(uniq, targets)), Tensor(remap(uniq, pool)),
                            Tensor(logq), Tensor(drop), Tensor(np.float32(1.0)))
    assert abs(float(loss_a.asnumpy()) - float(loss_b.asnumpy())) <= 1e-6 * abs(float(loss_a.asnumpy()))
    g_full, g_rows = g_table.asnumpy(), g_rows.asnumpy()
    np.testing.assert_allclose(g_rows[: len(uniq)], g_full[uniq], rtol=1e-5, atol=1e-7)
    assert not g_rows[len(uniq):].any()
    others = np.setdiff1d(np.arange(V + 1), uniq)
    assert not g_full[others].any() and np.abs(g_full[uniq[1:]]).sum() > 0


def test_a_shared_pool_is_touched_once_per_job():
    """The pool's ids are the same on every rank: they do not add touches with the ranks, per-token
    negatives do; rows touched mostly through the pool cost the same replicated or fetched (hot)."""
    V = 5000
    freq = np.concatenate([[0.0], np.full(V, 1.0 / V)])
    one = touch_probabilities(freq, 0, 0, 1, pool=400)
    assert np.allclose(one[1:], 1 - (1 - 1 / V) ** 400)
    assert np.allclose(touch_probabilities(freq, 0, 0, 64, pool=400), one)
    assert touch_probabilities(freq, 1, 400, 64)[1] > 0.99 > 0.1 > one[1]
    # 8 x 8, tiny data touches next to a 4096-id pool: every row is touched by all nodes together -> hot
    cut = hot_cut(freq, rank_tokens=1, num_negatives=0, nodes=8, local_ranks=8, dim=64, tolerance=0.05, pool=4096)
    assert len(cut["hot"]) == V + 1
    none = hot_cut(freq, rank_tokens=1, num_negatives=512, nodes=8, local_ranks=8, dim=64, tolerance=0.05)
    assert len(none["hot"]) < V // 10           # the same ids drawn per token: each node its own -> cold
