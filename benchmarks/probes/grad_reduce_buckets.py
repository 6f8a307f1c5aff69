"""The gradient sum alone, 2 ranks on mccl: the flat AllReduce (FlatSum) vs MindSpore's
nn.DistributedGradReducer under DATA_PARALLEL with several fusion settings, on the benchmark model's
gradient shapes (12 tensors, 239k floats) plus the loss; checks that every side gives the same sums.

    python -m mindgr.parallel.launch --nproc 2 --threads 1 --log-dir LOGS -- \
        benchmarks/probes/grad_reduce_buckets.py 30          # rounds; rank 0's table in LOGS/worker_0.log

Sides (each round runs them all in a rotating order, 10 calls each):
  flat        FlatSum: concatenate, one AllReduce, cut back (parallel.grad_reduce=own)
  ms_fusion1  the reducer, one fusion id, the loss in a separate AllReduce
  ms_loss_in  the reducer, one fusion id, the loss in the same bucket (what MindSporeReduceApply does)
  ms_fusion0  the reducer, fusion id 0: one unfused AllReduce per tensor
  ms_idx2/4   all_reduce_fusion_config with 2 / 4 buckets
  ms_size1MB  comm_fusion={"allreduce": {"mode": "size", "config": 1}}
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
import numpy as np

from mindgr.parallel.context import init_distributed

ctx = init_distributed(1)

import mindspore as ms  # noqa: E402  (after init_distributed)
from mindspore import Parameter, Tensor, mutable, nn, ops  # noqa: E402
from mindspore.communication import GlobalComm  # noqa: E402

from mindgr.parallel.dp import FlatSum  # noqa: E402

ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=False,
                             device_num=ctx.world)
SHAPES = [(2000, 64), (1024, 64)] + [(64, 256), (2047,), (129,), (64, 64), (64,)] * 2
params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"p{i}") for i, s in enumerate(SHAPES)]


class Flat(nn.Cell):
    def __init__(self):
        super().__init__()
        self.f = FlatSum(SHAPES + [(1,)])

    def construct(self, grads, loss):
        return self.f(grads + (loss,))


class Ms(nn.Cell):
    def __init__(self, **kw):
        super().__init__()
        self.r = nn.DistributedGradReducer(params, mean=False, **kw)
        self.ar = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, grads, loss):
        return self.r(grads) + (self.ar(loss),)


class MsLoss(nn.Cell):
    """the loss in the reducer's bucket: a slot parameter that only lends its attributes"""

    def __init__(self):
        super().__init__()
        self.slot = Parameter(Tensor(np.zeros((1,), np.float32)), name="loss_slot", requires_grad=False)
        self.r = nn.DistributedGradReducer(params + [self.slot], mean=False)

    def construct(self, grads, loss):
        return self.r(grads + (loss,))


variants = {"flat": Flat(), "ms_fusion1": Ms(), "ms_loss_in": MsLoss(), "ms_fusion0": Ms(fusion_type=0)}
for k, idx in (("ms_idx2", [1]), ("ms_idx4", [0, 1, 6])):
    ms.set_auto_parallel_context(all_reduce_fusion_config=idx)
    variants[k] = Ms()
ms.reset_auto_parallel_context()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=False, device_num=ctx.world,
                             comm_fusion={"allreduce": {"mode": "size", "config": 1}})
variants["ms_size1MB"] = Ms()

rng = np.random.default_rng(ctx.rank)
grads = mutable(tuple(Tensor(rng.standard_normal(s).astype(np.float32)) for s in SHAPES))
loss = Tensor(np.array([1.0 + ctx.rank], np.float32))
ref = None
for name, cell in variants.items():
    vals = [o.asnumpy() for o in cell(grads, loss)]
    ref = vals if ref is None else ref
    err = max(float(np.abs(a - b).max()) for a, b in zip(ref, vals))
    print(f"rank {ctx.rank} {name}: compiled, max |diff| vs flat {err:.2e}, loss {vals[-1]}", flush=True)
for _ in range(3):
    for cell in variants.values():
        [o.asnumpy() for o in cell(grads, loss)]
times = {k: [] for k in variants}
cpus = {k: [] for k in variants}
names = list(variants)
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
    for name in names[r % len(names):] + names[: r % len(names)]:
        cell = variants[name]
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(10):
            [o.asnumpy() for o in cell(grads, loss)]
        times[name].append((time.perf_counter() - t0) / 10 * 1e3)
        cpus[name].append((time.process_time() - c0) / 10 * 1e3)
for name in names:
    t, c = np.array(times[name]), np.array(cpus[name])
    rel = t / np.array(times["flat"])
    print(f"rank {ctx.rank} {name:12s} per-round wall ratio to flat: median {np.median(rel):.3f} "
          f"[{np.percentile(rel, 25):.3f}, {np.percentile(rel, 75):.3f}]")
    print(f"rank {ctx.rank} {name:12s} wall median {np.median(t):6.2f} ms [{t.min():.2f}, {t.max():.2f}]  "
          f"CPU median {np.median(c):.2f} ms", flush=True)
