"""Load balancing, cost-model fit and the global-batch -> rank mapping (numpy only, no msrun)."""
import numpy as np
import pytest

from mindgr.datasets import build_batch, plan_batches
from mindgr.parallel.balance import (CostModel, PartitionError, deal_random, imbalance, partition, rank_loads)
from mindgr.parallel.calibrate import features, fit, probe_designs
from mindgr.parallel.plan import RankPlanner, local_rows, rank_capacities


def kuairand_lengths(n, max_len=1024, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(np.exp(np.log(0.25 * max_len) + 0.8 * rng.standard_normal(n))), 5, max_len).astype(int)


def global_batches(lengths, world, per_rank_tokens, per_rank_rows, count=5):
    plan = plan_batches(lengths, world * per_rank_tokens, world * per_rank_rows, rng=np.random.default_rng(1))
    return plan[:count]


@pytest.mark.parametrize("method", ["balanced", "tokens", "random"])
def test_partition_covers_the_batch_within_capacities(method):
    lengths = kuairand_lengths(4000)
    model = CostModel(a=1.0, b=1 / 500)
    for world in (2, 8):
        tg, bg = 8192 * world, 96 * world
        t, b = rank_capacities(tg, bg, world, 0.01)
        for batch in global_batches(lengths, world, 8192, 96):
            lb = lengths[batch]
            parts = partition(lb, world, t, b, model, method, np.random.default_rng(3))
            assert len(parts) == world
            assert sorted(np.concatenate(parts).tolist()) == list(range(len(lb)))
            _, tokens, rows = rank_loads(lb, parts, model)
            assert tokens.max() <= t and rows.max() <= b
            again = partition(lb, world, t, b, model, method, np.random.default_rng(3))
            assert all(np.array_equal(x, y) for x, y in zip(parts, again))      # every rank agrees


def test_balanced_split_is_near_perfect_and_beats_random():
    lengths = kuairand_lengths(20000)
    model = CostModel(a=2e-6, b=3e-9, c0=1e-5)
    for world in (8, 16):
        t, b = rank_capacities(8192 * world, 96 * world, world, 0.01)
        bal, rnd, fill = [], [], []
        for batch in global_batches(lengths, world, 8192, 96, count=4):
            lb = lengths[batch]
            bal.append(imbalance(rank_loads(lb, partition(lb, world, t, b, model), model)[0]))
            rnd.append(imbalance(rank_loads(lb, deal_random(len(lb), world, np.random.default_rng(0)), model)[0]))
            fill.append(lb.sum() / (world * t))
        assert np.mean(bal) < 0.01, bal
        assert np.mean(rnd) > 10 * np.mean(bal) + 0.1, (rnd, bal)
        assert np.mean(fill) >= 0.97


def test_unsplittable_batch_is_a_clear_error():
    with pytest.raises(PartitionError, match="do not fit 2 ranks of 100 tokens"):
        partition(np.array([60, 60, 60]), 2, 100, 10, CostModel(1.0, 0.0))
    assert [p.tolist() for p in partition(np.array([], int), 3, 100, 10, CostModel(1.0, 0.0))] == [[], [], []]
    assert imbalance([0.0, 0.0]) == 0.0 and imbalance([1.0, 3.0]) == pytest.approx(0.5)


def test_cost_fit_recovers_the_coefficients_and_stays_non_negative():
    designs = probe_designs(4096, 64, 1024)
    for lengths in designs.values():
        assert sum(lengths) <= 4096 and len(lengths) <= 64
    true = CostModel(a=3e-6, b=2e-9, c0=4e-5)
    rows = np.array([features(v) for v in designs.values()])
    secs = np.array([0.05 + true(v).sum() for v in designs.values()])
    model, fixed, rel = fit(rows, secs)
    assert model.a == pytest.approx(true.a, rel=1e-6) and model.b == pytest.approx(true.b, rel=1e-6)
    assert model.c0 == pytest.approx(true.c0, rel=1e-6) and fixed == pytest.approx(0.05, rel=1e-6)
    assert rel < 1e-9
    # Timings that decrease with work (noise) must not give negative costs.
    model, fixed, _ = fit(rows, 0.1 - 1e-6 * rows[:, 2])
    assert min(model.a, model.b, model.c0, fixed) >= 0


class _Examples:
    def __init__(self, lengths, seed=0):
        rng = np.random.default_rng(seed)
        self.inputs = [rng.integers(1, 50, n).astype(np.int32) for n in lengths]
        self.targets = [rng.integers(1, 50, n).astype(np.int32) for n in lengths]
        self.times = [np.arange(n, dtype=np.int64) for n in lengths]

    @property
    def lengths(self):
        return np.array([len(x) for x in self.inputs])


def test_rank_shares_rebuild_the_global_batch_token_by_token():
    ex = _Examples(np.random.default_rng(5).integers(1, 40, 300))
    world, tg, bg = 3, 600, 48
    t, b = rank_capacities(tg, bg, world, 0.02)
    planners = [RankPlanner(ex, world, r, t, b, CostModel(1.0, 0.01), "cost", seed=0) for r in range(world)]
    for k, indices in enumerate(plan_batches(ex.lengths, tg, bg, rng=np.random.default_rng(0))[:4]):
        glob = build_batch(indices, ex.inputs, ex.times, ex.targets, tg, bg)
        draws = np.random.default_rng(k).integers(1, 99, (tg, 5))           # a host draw, global layout
        shares = [p.share(0, k, indices) for p in planners]
        assert sum(s.scale for s in shares) == pytest.approx(1.0)
        seen = []
        for s in shares:
            local = build_batch(s.indices, ex.inputs, ex.times, ex.targets, t, b)
            n = local.num_tokens
            assert np.array_equal(local.ids[:n], glob.ids[s.token_src])
            assert np.array_equal(local.targets[:n], glob.targets[s.token_src])
            assert np.array_equal(local.positions[:n], glob.positions[s.token_src])
            mine = local_rows(draws, s.token_src, t, fill=1)
            assert mine.shape == (t, 5) and np.array_equal(mine[:n], draws[s.token_src]) and (mine[n:] == 1).all()
            seen.extend(s.token_src.tolist())
        assert sorted(seen) == list(range(glob.num_tokens))


def test_sequence_draws_follow_the_token_not_the_rank():
    from mindgr.parallel.plan import SequenceDraws
    d = SequenceDraws(seed=3, num_items=50, num_negatives=4, dropout=0.2, sites=2, width=6)
    lengths = {3: 5, 7: 2, 9: 4}
    neg_a, drop_a = d.draw(1, [3, 7, 9], [5, 2, 4], 16)      # one rank holding all three
    neg_b, drop_b = d.draw(1, [9, 3], [4, 5], 12)            # another split, another order
    start_a, start_b = {3: 0, 7: 5, 9: 7}, {9: 0, 3: 4}
    for i, sb in start_b.items():
        sa, n = start_a[i], lengths[i]
        assert np.array_equal(neg_a[sa: sa + n], neg_b[sb: sb + n])
        assert np.array_equal(drop_a[:, sa: sa + n], drop_b[:, sb: sb + n])
    assert set(np.unique(drop_a[:, :11])) <= {0.0, np.float32(1.25)} and (drop_a[:, 11:] == 1).all()
    assert (neg_a >= 1).all() and (neg_a <= 50).all()
    assert not np.array_equal(d.draw(2, [3], [5], 5)[0], neg_a[:5])    # a new epoch, new draws
