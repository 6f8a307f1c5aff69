"""Check every collective of mindgr.parallel.comm against a numpy reference, under msrun.

    python -m mindgr.parallel.launch --nproc 2 -- tests/harness/comm_selftest.py 2

Each rank draws its inputs from a generator seeded by (seed, rank), so every rank can compute what all
ranks hold and therefore the exact expected result. Splits are uneven and include empty ones; a
subgroup (every other rank) is checked too. Prints one `SELFTEST {json}` line per rank and exits 1 if
anything differs.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository


def _inputs(r: int, seed: int, n: int):
    """What rank r holds: uneven row counts (rank 0 sends nothing to the last rank), int and float data."""
    rng = np.random.default_rng([seed, r])
    counts = rng.integers(0, 4, n)
    counts[(r + 1) % n] += 1                              # never all zero
    if r == 0:
        counts[-1] = 0
    rows = int(counts.sum())
    ints = rng.integers(-1000, 1000, (rows, 3)).astype(np.int32)
    floats = rng.standard_normal((rows, 2)).astype(np.float32)
    return counts, ints, floats


def _shared(seed: int, n: int):
    """A buffer every rank holds with its own values but the same shape (reduce_scatter / all_reduce)."""
    split = np.random.default_rng([seed, 99]).integers(0, 4, n)
    split[0] += 1
    vals = [np.random.default_rng([seed, 7, r]).integers(-50, 50, (int(split.sum()), 2)).astype(np.float32)
            for r in range(n)]
    return split, vals


def check_group(group, members: list, seed: int) -> dict:
    """Run every primitive over `group` (members: its world ranks in group-rank order)."""
    from mindgr.parallel import comm
    n, me = comm.size(group), comm.rank(group)
    assert n == len(members), (n, members)
    data = [_inputs(r, seed, n) for r in range(n)]
    counts, ints, floats = data[me]
    res = {}

    split, vals = _shared(seed, n)
    res["all_reduce_sum"] = np.array_equal(comm.all_reduce(vals[me], "sum", group), np.sum(vals, 0))
    res["all_reduce_max"] = np.array_equal(comm.all_reduce(vals[me], "max", group), np.max(vals, 0))
    ivals = [v.astype(np.int32) * 1000003 for v in vals]       # beyond float32's exact integers
    res["all_reduce_sum_int"] = np.array_equal(comm.all_reduce(ivals[me], "sum", group), np.sum(ivals, 0))

    got = comm.all_gather(ints, group)
    res["all_gather_uneven_int"] = np.array_equal(got, np.concatenate([d[1] for d in data], 0))
    got = comm.all_gather(floats, group)
    res["all_gather_uneven_float"] = np.array_equal(got, np.concatenate([d[2] for d in data], 0))

    root = n - 1
    got = comm.broadcast(np.full((2, 3), me, dtype=np.float32), root, group)
    res["broadcast"] = np.array_equal(got, np.full((2, 3), root, dtype=np.float32))

    got, recv = comm.all_to_all_v(ints, counts, group)
    starts = [np.cumsum(d[0]) - d[0] for d in data]
    expect = np.concatenate([d[1][starts[s][me]: starts[s][me] + d[0][me]] for s, d in enumerate(data)], 0)
    res["all_to_all_v_int"] = np.array_equal(got, expect) and np.array_equal(recv, [d[0][me] for d in data])
    got, _ = comm.all_to_all_v(floats, counts, group)
    expect = np.concatenate([d[2][starts[s][me]: starts[s][me] + d[0][me]] for s, d in enumerate(data)], 0)
    res["all_to_all_v_float"] = np.array_equal(got, expect)

    total = np.sum(vals, 0)
    lo = int(split[:me].sum())
    got = comm.reduce_scatter(vals[me], split, "sum", group)
    res["reduce_scatter_uneven"] = np.array_equal(got, total[lo: lo + split[me]])
    even = [np.concatenate([v] * n, 0) for v in vals]    # n x rows: always divisible by n
    per = len(even[me]) // n
    got = comm.reduce_scatter(even[me], None, "sum", group)
    res["reduce_scatter_even"] = np.array_equal(got, np.sum(even, 0)[me * per: (me + 1) * per])
    from mindspore import Tensor
    t = comm.all_reduce(Tensor(vals[me]), "sum", group)
    res["tensor_in_tensor_out"] = isinstance(t, Tensor) and np.array_equal(t.asnumpy(), total)
    comm.barrier(group)
    return {k: bool(v) for k, v in res.items()}


def main(argv=None) -> int:
    import mindspore as ms
    from mindgr.parallel import context
    seed = int((argv or sys.argv[1:] or ["0"])[0])
    ctx = context.init_distributed()
    from mindgr.parallel import comm
    out = {"rank": ctx.rank, "world": ctx.world, "native": comm.native_collectives(),
           "device": ms.get_context("device_target")}
    out["world_group"] = check_group(None, list(range(ctx.world)), seed)
    if ctx.world >= 3:
        members = list(range(1, ctx.world, 2))                # odd ranks: a proper subgroup
        if ctx.rank in members:
            comm.new_group("mindgr_odd", members)
            out["odd_group"] = check_group("mindgr_odd", members, seed + 1)
        comm.barrier()
    ok = all(all(v.values()) for k, v in out.items() if k.endswith("_group"))
    out["ok"] = ok
    print("SELFTEST " + json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
