"""The frequency layout without msrun: the plan (HotCold), the byte model's cut, the two-stage exchange
against the one-stage flat one, the traffic model against the counters, and checkpoints resharded between
layouts. The collectives run in one process: every rank is a thread and `comm` is replaced by an
in-memory all_to_all_v / all_gather with the same contract (rows in source-rank order)."""
import threading

import numpy as np
import pytest

from mindgr.config import load_config
from mindgr.parallel.sparse.hotcold import HotCold
from mindgr.parallel.sparse.layout import plan_table
from mindgr.parallel.sparse.topology import Topology
from mindgr.parallel.sparse.traffic import Traffic, hot_cut, model_step
from mindgr.train import table_checkpoint as ck


class ThreadComm:
    """all_to_all_v / all_gather / rank between threads; a group is the tuple of its world ranks."""

    def __init__(self, world: int):
        self.world = world
        self.local = threading.local()
        self.lock = threading.Lock()
        self.boxes, self.barriers = {}, {}

    def _members(self, group):
        return tuple(range(self.world)) if group is None else group

    def _post(self, group, item):
        members = self._members(group)
        calls = self.local.calls
        n = calls[members] = calls.get(members, 0) + 1
        with self.lock:
            box = self.boxes.setdefault((members, n), {})
            barrier = self.barriers.setdefault(members, threading.Barrier(len(members)))
        box[members.index(self.local.rank)] = item
        barrier.wait()
        got = [box[i] for i in range(len(members))]
        barrier.wait()
        return members.index(self.local.rank), got

    def rank(self, group=None):
        return self._members(group).index(self.local.rank)

    def all_to_all_v(self, x, counts, group=None):
        me, got = self._post(group, (np.asarray(x), np.asarray(counts)))
        parts, recv = [], []
        for xs, cs in got:
            start = int(cs[:me].sum())
            parts.append(xs[start: start + int(cs[me])])
            recv.append(int(cs[me]))
        return np.concatenate(parts, 0), np.array(recv, np.int64)

    def all_gather(self, x, group=None, sizes=None):
        _, got = self._post(group, np.asarray(x))
        return np.concatenate(got, 0)

    def run(self, fn):
        """fn(rank) on every rank at once; their results in rank order."""
        out, errors = [None] * self.world, []

        def main(r):
            self.local.rank, self.local.calls = r, {}
            try:
                out[r] = fn(r)
            except BaseException as e:          # noqa: BLE001 - re-raised below
                errors.append(e)
                for b in self.barriers.values():
                    b.abort()

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        return out


V, D = 61, 3


def _rank_ids(world, seed=0):
    """Skewed ids: a head every rank touches plus a uniform tail, as a step's de-duplicated ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(world):
        tail = rng.choice(np.arange(8, V), 9, replace=False)
        out.append(np.unique(np.concatenate([[0, 1, 2, 3], rng.choice(8, 2), tail])).astype(np.int64))
    return out


def _run_layout(nodes, local, hot, monkeypatch):
    """Every rank's lookup, push and hot exchange of the frequency layout on a random table; returns the
    looked-up rows, the per-id gradient sums each owner ends with, and the traffic counters per node."""
    from mindgr.parallel import comm
    from mindgr.parallel.sparse.exchange import exchange_hot
    from mindgr.parallel.sparse.table import HotColdTable
    world = nodes * local
    fake = ThreadComm(world)
    for name in ("all_to_all_v", "all_gather", "rank"):
        monkeypatch.setattr(comm, name, getattr(fake, name))
    plan = HotCold(np.asarray(hot, np.int64), V, nodes, local)
    full = np.random.default_rng(5).standard_normal((V, D)).astype(np.float32)
    ids = _rank_ids(world)
    grads = [np.random.default_rng([9, r]).standard_normal((len(ids[r]), D)).astype(np.float32)
             for r in range(world)]
    node_of = np.arange(world) // local

    def rank_step(r):
        topo = Topology(nodes, local, r)
        traffic = Traffic(node_of, r)
        intra, inter = tuple(topo.intra_ranks), tuple(topo.inter_ranks)
        table = HotColdTable(full[plan.rank_ids(r)].copy(), plan, r, intra, intra, inter, inter, traffic)
        rows = table.lookup(ids[r])
        slots, sums = table.push(grads[r])
        slots, sums = exchange_hot(slots, sums, table.hot_slots, inter, list(inter), traffic)
        return rows, table.ids[slots], sums, (traffic.step_intra, traffic.step_inter), table.assemble(topo.node)

    return full, ids, grads, fake.run(rank_step)


@pytest.mark.parametrize("nodes, local, n_hot", [(2, 2, 6), (3, 2, 0), (2, 3, 10), (2, 2, V)])
def test_two_stage_exchange_equals_one_stage(nodes, local, n_hot, monkeypatch):
    world = nodes * local
    hot = np.r_[0:n_hot][::-1]                              # any order: the plan's frequency order
    full, ids, grads, res = _run_layout(nodes, local, hot, monkeypatch)
    want = np.zeros((V, D), np.float64)                     # the one-stage (flat) result: every rank's sum
    for r in range(world):
        want[ids[r]] += grads[r]
    touched = np.unique(np.concatenate(ids))
    plan = HotCold(hot, V, nodes, local)
    held = {}
    for r, (rows, got_ids, sums, _, assembled) in enumerate(res):
        assert np.array_equal(rows, full[ids[r]])            # lookup: the rows themselves
        assert np.array_equal(assembled, full)
        for i, g in zip(got_ids.tolist(), sums):
            held.setdefault(i, []).append((r, g))
    assert sorted(held) == touched.tolist()
    for i, copies in held.items():
        owners = sorted(r for r, _ in copies)
        if plan.is_hot[i]:                                   # one replica per node group, all identical
            assert owners == [n * local + plan.pos[i] % local for n in range(nodes)]
            assert all(np.array_equal(copies[0][1], g) for _, g in copies)
        else:                                                # one owner in the job
            assert owners == [plan.pos[i] % world]
        np.testing.assert_allclose(copies[0][1], want[i], rtol=1e-5, atol=1e-6)
    # the traffic model counts exactly the messages sent
    model = model_step(ids, nodes, local, D, V, hot=hot)["frequency"]
    sent = np.array([c for *_, c, _ in res])
    per_node = np.array([sent[np.arange(world) // local == n].sum(0) for n in range(nodes)])
    assert np.array_equal(per_node[:, 0], model["intra"]) and np.array_equal(per_node[:, 1], model["inter"])


def test_two_stage_sends_fewer_inter_node_bytes_than_flat_when_a_node_shares_ids():
    nodes, local = 4, 4
    ids = _rank_ids(nodes * local, seed=2)
    out = model_step(ids, nodes, local, dim=16, num_rows=V, hot=np.zeros(0, np.int64))
    flat, freq = out["flat"]["inter"].sum(), out["frequency"]["inter"].sum()
    assert 0 < freq < flat                                   # the head is fetched once per node, not per rank
    whole = model_step(ids, nodes, local, dim=16, num_rows=V, hot=np.arange(V))
    # all rows hot with the identity order = the hierarchical layout's owners (slot p // L, owner p % L)
    assert np.array_equal(whole["frequency"]["inter"], whole["hierarchical"]["inter"])
    assert np.array_equal(whole["frequency"]["intra"], whole["hierarchical"]["intra"])


def test_plan_partitions_the_table():
    for nodes, local in [(1, 1), (2, 2), (3, 2), (2, 4)]:
        world = nodes * local
        hot = np.random.default_rng(nodes * 10 + local).permutation(V)[:13]
        plan = HotCold(hot, V, nodes, local)
        for n in range(nodes):                               # every node group holds every hot row once
            held = np.concatenate([plan.hot_ids(r % local) for r in range(n * local, (n + 1) * local)])
            assert sorted(held.tolist()) == sorted(hot.tolist())
        cold = np.concatenate([plan.cold_ids(r) for r in range(world)])   # every cold row once in the job
        assert sorted(cold.tolist()) == sorted(set(range(V)) - set(hot.tolist()))
    with pytest.raises(ValueError, match="distinct"):
        HotCold(np.array([1, 1]), V, 1, 1)


def _freq(num_items, head, rng):
    """A skewed unigram: `head` items take most of the mass, row 0 = padding."""
    f = np.full(num_items + 1, 1e-7)
    f[1: head + 1] = rng.uniform(0.5, 1.0, head)
    f[0] = 0.0
    return f / f.sum()


def test_hot_cut_follows_the_byte_model():
    rng = np.random.default_rng(0)
    f = _freq(5000, 20, rng)
    cut = hot_cut(f, rank_tokens=400, num_negatives=1, nodes=8, local_ranks=8, dim=64, tolerance=0.05)
    hot = set(cut["hot"].tolist())
    assert {0} | set(range(1, 21)) <= hot                   # the head every node touches every step
    assert len(hot) < 200                                    # not the uniform tail: each touched by few nodes
    one_node = hot_cut(f, 400, 1, nodes=1, local_ranks=8, dim=64, tolerance=0.05)
    assert len(one_node["hot"]) == len(f)                    # nothing crosses nodes: hierarchical
    dense = hot_cut(_freq(300, 300, rng), 400, 64, nodes=8, local_ranks=8, dim=64, tolerance=0.05)
    assert len(dense["hot"]) == 301                          # a small catalogue every node touches: all hot


def test_plan_table_frequency_and_config():
    cfg = load_config(None, ["loss.num_negatives=4", "parallel.staleness=1", "model.dim=16"])
    f = _freq(200, 10, np.random.default_rng(1))
    plans = [plan_table(Topology(2, 2, r), cfg, 200, 800, 16, "frequency", freq=f) for r in range(4)]
    for p in plans:
        assert p.kind == "frequency" and p.shards == 4 and p.staleness == 1
        assert np.array_equal(p.hot, plans[0].hot) and p.cut["hot_rows"] == len(p.hot)
        assert len(p.owned_ids()) == p.rows
    assert sum(len(p.owned_ids()) for p in plans) == 201 + len(plans[0].hot)   # hot rows twice: 2 node groups
    fixed = plan_table(Topology(2, 2, 0), load_config(None, ["loss.num_negatives=4", "parallel.hot_rows=7"]),
                       200, 800, 16, "frequency", freq=f)
    assert len(fixed.hot) == 7 and fixed.cut["rule"] == "parallel.hot_rows = 7"
    with pytest.raises(ValueError, match="frequencies"):
        plan_table(Topology(2, 2, 0), cfg, 200, 800, 16, "frequency")


def test_checkpoint_reshards_between_layouts(tmp_path):
    rng = np.random.default_rng(3)
    rows, m, v = (rng.standard_normal((V, 2)).astype(np.float32) for _ in range(3))
    nodes, local = 2, 2
    plan = HotCold(rng.permutation(V)[:9], V, nodes, local)
    for r in range(nodes * local):                            # as the trainer writes: node 0 adds its hot rows
        ids = plan.rank_ids(r) if r < local else plan.cold_ids(r)
        ck.save_shard(tmp_path, "ckpt", r, 4, V, rows[ids], m[ids], v[ids], ids=ids,
                      hot=plan.hot if r == 0 else None)
    for shards in (1, 3, 4):                                  # frequency -> round robin (flat, hierarchical)
        for s in range(shards):
            got = ck.load_shard(tmp_path, "ckpt", V, shards, s)
            own = ck.owned_rows(V, shards, s)
            assert all(np.array_equal(a, b[own]) for a, b in zip(got, (rows, m, v)))
    other = HotCold(rng.permutation(V)[:20], V, 3, 1)         # frequency -> another frequency plan
    for r in range(3):
        got = ck.load_shard(tmp_path, "ckpt", V, 3, r, ids=other.rank_ids(r))
        assert all(np.array_equal(a, b[other.rank_ids(r)]) for a, b in zip(got, (rows, m, v)))
    flat = tmp_path / "flat"                                  # round robin -> frequency
    for s in range(3):
        own = ck.owned_rows(V, 3, s)
        ck.save_shard(flat, "ckpt", s, 3, V, rows[own], m[own], v[own])
    for r in range(4):
        got = ck.load_shard(flat, "ckpt", V, 4, r, ids=plan.rank_ids(r))
        assert all(np.array_equal(a, b[plan.rank_ids(r)]) for a, b in zip(got, (rows, m, v)))
    with np.load(tmp_path / "ckpt.table-0of4.npz") as z:      # the plan travels with the checkpoint
        assert np.array_equal(z["hot"], plan.hot)
    (tmp_path / "ckpt.table-2of4.npz").unlink()
    ck.save_shard(tmp_path, "ckpt", 2, 4, V, rows[:1], m[:1], v[:1], ids=np.array([0]))
    with pytest.raises(ck.CheckpointError, match="miss"):
        ck.load_shard(tmp_path, "ckpt", V, 1, 0)
