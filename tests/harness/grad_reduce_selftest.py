"""Check MindSpore's data-parallel reducer (mindgr.parallel.dp.MindSporeReduceApply) and the flat sum
(ReduceApply) and the shared-memory host sum (FlatApply after HostSum, between two graphs and inside the
one-graph step) against numpy, under msrun in MindSpore's DATA_PARALLEL mode.

    python -m mindgr.parallel.launch --nproc 2 -- tests/harness/grad_reduce_selftest.py 0

Every rank draws its gradients and loss share from a generator seeded by (seed, rank), so each rank knows
what every rank holds. One step of plain SGD (learning rate 1, from zero weights) turns each reducer's
summed gradients into the new weights: -sum over ranks. (The one-graph host step differentiates a linear
loss, sum_k <w_k, c_k> + b with the rank's draws as c_k and its loss share as b, to get those gradients.) Checked for the flat sum and for MindSpore's
reducer with 0 (unfused), 1, 2 and 3 fusion buckets, on tensors of uneven sizes. With 2 ranks a sum is one
float32 addition, so the results must be bit-identical to numpy. Prints `SELFTEST {json}`; exits 1 on
any difference.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository

SHAPES = [(37, 8), (5,), (1,), (64, 3), (11, 2), (300,), (2, 2)]


def draws(seed: int, r: int):
    rng = np.random.default_rng([seed, r])
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES], np.float32(rng.uniform(0.1, 1.0))


def main(argv=None) -> int:
    seed = int((argv or sys.argv[1:] or ["0"])[0])
    from mindgr.parallel.context import init_distributed, use_data_parallel_mode
    ctx = init_distributed(1)
    use_data_parallel_mode(ctx.world)
    import mindspore as ms
    from mindspore import Parameter, Tensor, mutable, nn
    from mindgr.parallel.dp import DataParallelStep, MindSporeReduceApply, ReduceApply
    from mindgr.parallel.executor import _join_host_sum

    every = [draws(seed, r) for r in range(ctx.world)]
    want_grads = [sum(g[k] for g, _ in every) for k in range(len(SHAPES))]   # rank order, float32
    want_loss = float(sum(loss for _, loss in every))
    grads, loss = every[ctx.rank]
    out = {"rank": ctx.rank, "world": ctx.world, "checks": {}}
    n = sum(int(np.prod(s)) for s in SHAPES) + 2          # the host sum's vector: gradients, loss, a vote
    class Linear(nn.Cell):
        def __init__(self, params):
            super().__init__()
            self.ws = ms.ParameterTuple(params)

        def construct(self, *cs):
            total = cs[-1]
            for k in range(len(self.ws)):
                total = total + (self.ws[k] * cs[k]).sum()
            return total

    for name, buckets in (("flat", None), ("ms_unfused", 0), ("ms_1", 1), ("ms_2", 2), ("ms_3", 3), ("host", None),
                          ("host_fused", None)):
        params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"{name}_w{k}") for k, s in enumerate(SHAPES)]
        opt = nn.SGD(params, learning_rate=1.0)
        votes = None
        if name == "host":
            step = DataParallelStep(nn.Identity(), opt, "host", host_sum=_join_host_sum(ctx, n, 60.0))
            step.ballot.vote = float(ctx.rank + 1)            # the ranks' votes ride in the same sum
            got_loss = step.apply(Tensor(np.array(loss, np.float32)), tuple(Tensor(g) for g in grads))
            votes = step.ballot.total == ctx.world * (ctx.world + 1) / 2
        elif name == "host_fused":
            step = DataParallelStep(Linear(params), opt, "host", fused=True, host_sum=_join_host_sum(ctx, n, 60.0))
            step.ballot.vote = float(ctx.rank + 1)
            got_loss = step.step(*[Tensor(g) for g in grads], Tensor(np.float32(loss)), Tensor(np.float32(1.0)))
            votes = step.ballot.total == ctx.world * (ctx.world + 1) / 2
        else:
            cell = ReduceApply(opt) if buckets is None else MindSporeReduceApply(opt, buckets)
            got_loss = float(cell(Tensor(np.array([loss], np.float32)),
                                  mutable(tuple(Tensor(g) for g in grads))).asnumpy()[0])
        exact = ctx.world == 2
        same = [np.array_equal(-p.asnumpy(), w) if exact else np.allclose(-p.asnumpy(), w, rtol=1e-6, atol=0)
                for p, w in zip(params, want_grads)]
        out["checks"][name] = {"grads": all(same), "loss": abs(got_loss - want_loss) <= 1e-6 * abs(want_loss),
                               "buckets": None if buckets is None else len(cell.splits) + 1 if buckets else 0,
                               "votes": votes}
    ok = all(c["grads"] and c["loss"] and c["votes"] is not False for c in out["checks"].values())
    out["ok"] = ok
    print("SELFTEST " + json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
