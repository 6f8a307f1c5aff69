"""Check the sharded table against an unsharded numpy table, under msrun (2 or 4 ranks).

    python -m mindgr.parallel.launch --nproc 4 -- tests/harness/sparse_selftest.py DIR

Layout: nodes = 2 node groups of world/2 local ranks (hierarchical) and every rank a shard (flat).
Every rank draws its ids and gradients from generators seeded by (seed, rank), so each rank knows what
all ranks hold and computes the exact expected result. Prints `SPARSETEST {json}` and exits 1 on any
difference. DIR receives the shard checkpoint of the reshard check.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository

V, D, SEED = 41, 6, 3


def _rank_data(r: int):
    rng = np.random.default_rng([SEED, r])
    ids = np.unique(np.concatenate([[0], rng.choice(V, 12, replace=False)])).astype(np.int64)
    grads = rng.standard_normal((len(ids), D)).astype(np.float32)
    return ids, grads


def _table():
    return np.random.default_rng([SEED, 99]).standard_normal((V, D)).astype(np.float32)


def _expected_sum(world: int, shard_ids: np.ndarray) -> np.ndarray:
    total = np.zeros((V, D), np.float64)
    for r in range(world):
        ids, g = _rank_data(r)
        total[ids] += g
    return total[shard_ids]


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    out_dir = Path(argv[0])
    from mindgr.parallel import context
    ctx = context.init_distributed()
    from mindgr.parallel import comm
    from mindgr.train import table_checkpoint as ck
    from mindgr.parallel.sparse.exchange import BoundedStaleness, StalenessError, exchange_replicas
    from mindgr.parallel.sparse.init import owned_rows
    from mindgr.parallel.sparse.row_adam import RowAdam
    from mindgr.parallel.sparse.table import ShardedTable
    from mindgr.parallel.sparse.topology import Groups, resolve
    from mindgr.parallel.sparse.traffic import Traffic

    world, rank = ctx.world, ctx.rank
    topo = resolve(2, 0, world, rank)
    groups = Groups(topo)
    traffic = Traffic(topo.node_of(np.arange(world)), rank)
    full = _table()
    ids, grads = _rank_data(rank)
    res = {}

    L = topo.local_ranks
    hier = ShardedTable(full[owned_rows(V, L, topo.local)].copy(), V, L, topo.local, groups.intra,
                        topo.intra_ranks, traffic)
    flat = ShardedTable(full[owned_rows(V, world, rank)].copy(), V, world, rank, None, list(range(world)), traffic)
    res["lookup_hierarchical"] = np.array_equal(hier.lookup(ids), full[ids])
    res["lookup_flat"] = np.array_equal(flat.lookup(ids), full[ids])

    # gradients: node route-back then the cross-node exchange == the sum of every rank's gradients
    slots, sums = hier.push(grads)
    slots, sums = exchange_replicas(slots, sums, groups.inter, topo.inter_ranks, traffic)
    mine = owned_rows(V, L, topo.local)
    touched = np.unique(np.concatenate([_rank_data(r)[0] for r in range(world)]))
    want_slots = np.flatnonzero(np.isin(mine, touched))
    res["grads_hierarchical"] = bool(np.array_equal(slots, want_slots) and
                                     np.allclose(sums, _expected_sum(world, mine[want_slots]), rtol=1e-5, atol=1e-6))
    flat.lookup(ids)
    fslots, fsums = flat.push(grads)
    fmine = owned_rows(V, world, rank)
    fwant = np.flatnonzero(np.isin(fmine, touched))
    res["grads_flat"] = bool(np.array_equal(fslots, fwant) and
                             np.allclose(fsums, _expected_sum(world, fmine[fwant]), rtol=1e-5, atol=1e-6))

    # the traffic model reproduces the counters of one hierarchical and one flat step
    from mindgr.parallel.sparse.traffic import model_step
    for name, table in (("hierarchical", hier), ("flat", flat)):
        counter = Traffic(topo.node_of(np.arange(world)), rank)
        table.traffic = counter
        table.lookup(ids)
        s_, g_ = table.push(grads)
        if name == "hierarchical":
            exchange_replicas(s_, g_, groups.inter, topo.inter_ranks, counter)
        sent = comm.all_gather(np.array([counter.step_intra, counter.step_inter], np.int64)[None])
        node = topo.node_of(np.arange(world))
        measured = np.array([sent[node == n].sum(0) for n in range(topo.nodes)])
        model = model_step([_rank_data(r)[0] for r in range(world)], topo.nodes, L, D, V)[name]
        res[f"traffic_model_{name}"] = bool(np.array_equal(measured[:, 0], model["intra"]) and
                                            np.array_equal(measured[:, 1], model["inter"]))
        table.traffic = traffic

    # frequency layout (a third of the rows hot): lookup, two-stage route-back + hot exchange == the sum of
    # every rank's gradients (each cold row at its one owner, each hot row at one replica per node), and
    # the traffic model == the counters of the real exchange
    from mindgr.parallel.sparse.exchange import exchange_hot
    from mindgr.parallel.sparse.hotcold import HotCold
    from mindgr.parallel.sparse.table import HotColdTable
    plan = HotCold(np.random.default_rng([SEED, 7]).permutation(V)[: V // 3], V, topo.nodes, L)
    counter = Traffic(topo.node_of(np.arange(world)), rank)
    freq = HotColdTable(full[plan.rank_ids(rank)].copy(), plan, rank, groups.intra, topo.intra_ranks, groups.inter,
                        topo.inter_ranks, counter)
    res["lookup_frequency"] = np.array_equal(freq.lookup(ids), full[ids])
    s_, g_ = freq.push(grads)
    s_, g_ = exchange_hot(s_, g_, freq.hot_slots, groups.inter, topo.inter_ranks, counter)
    held = freq.ids[s_]
    res["grads_frequency"] = bool(np.array_equal(np.sort(held), np.intersect1d(freq.ids, touched)) and
                                  np.allclose(g_, _expected_sum(world, held), rtol=1e-5, atol=1e-6))
    sent = comm.all_gather(np.array([counter.step_intra, counter.step_inter], np.int64)[None])
    node = topo.node_of(np.arange(world))
    measured = np.array([sent[node == n].sum(0) for n in range(topo.nodes)])
    model = model_step([_rank_data(r)[0] for r in range(world)], topo.nodes, L, D, V, hot=plan.hot)["frequency"]
    res["traffic_model_frequency"] = bool(np.array_equal(measured[:, 0], model["intra"]) and
                                          np.array_equal(measured[:, 1], model["inter"]))
    res["assemble_frequency"] = np.array_equal(freq.assemble(topo.node), full)

    # replicas apply the same update and stay bit-identical
    opt = RowAdam(hier.rows, 0.01, 0.9, 0.98, 1e-8, 0.01, lazy=True)
    opt.apply(slots, sums)
    padded = np.zeros((1, -(-V // L), D), np.float32)              # shards differ by a row: pad to gather
    padded[0, : len(hier.rows)] = hier.rows
    every = comm.all_gather(padded)                                # [rank, slots, D]
    res["replicas_identical"] = all(np.array_equal(every[r], every[q]) for r in range(world)
                                    for q in range(world) if r % L == q % L)

    # bounded staleness: tau = 2, exchange in the background while the main thread "computes"
    applied = []
    stale = BoundedStaleness(2, lambda s, g: exchange_replicas(s, g, groups.inter, topo.inter_ranks, traffic),
                             lambda s, g: applied.append(float(g.sum())))
    ok = True
    for step in range(1, 7):
        hier.lookup(ids)                                           # main-thread collectives, as a step does
        stale.start_background()
        stale.join()
        comm.barrier()
        s, g = hier.push(grads * step)
        stale.submit(step, s, g)
        before = len(applied)
        stale.apply_due(step)
        ok &= (len(applied) - before) == (1 if step >= 3 else 0)
    stale.flush(6)
    res["staleness_applied_at_t_plus_tau"] = bool(ok and len(applied) == 6 and stale.max_staleness == 2)
    late = BoundedStaleness(1, lambda s, g: (s, g), lambda s, g: None)
    late.submit(1, np.zeros(0, np.int64), np.zeros((0, D), np.float32))
    late.join()
    late.start_background()
    late.join()
    try:
        late.apply_due(3)                                          # step 2 never applied it: lag 2 > 1
        res["staleness_violation_raises"] = False
    except StalenessError:
        res["staleness_violation_raises"] = True

    # checkpoint: node 0 writes the hierarchical layout (L shards); load into flat (world), 1 and 3 shards
    m1 = np.random.default_rng([SEED, 5]).standard_normal((V, D)).astype(np.float32)
    m2 = np.abs(m1) * 0.5
    if topo.node == 0:
        own = owned_rows(V, L, topo.local)
        ck.save_shard(out_dir, "ckpt", topo.local, L, V, full[own], m1[own], m2[own])
    comm.barrier()
    exact = True
    for shards, shard in ((world, rank), (1, 0), (3, rank % 3)):
        rows, a, b = ck.load_shard(out_dir, "ckpt", V, shards, shard)
        own = owned_rows(V, shards, shard)
        exact &= np.array_equal(rows, full[own]) and np.array_equal(a, m1[own]) and np.array_equal(b, m2[own])
    res["checkpoint_reshard_exact"] = bool(exact)
    comm.barrier()

    out = {"rank": rank, "world": world, "nodes": topo.nodes, "local_ranks": L, "checks": res,
           "ok": all(res.values())}
    print("SPARSETEST " + json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
