"""mccl AllReduce cost: one flat buffer vs one AllReduce per tensor, and the CPU a waiting rank burns.

    python -m mindgr.parallel.launch --nproc 2 --threads 1 --log-dir /tmp/ar -- \
        benchmarks/probes/allreduce_flat_vs_per_tensor.py          # results in /tmp/ar/worker_*.log

The tensor sizes are the scaling benchmark model's gradients (240k floats in 28 tensors).
"""
import time

import numpy as np

from mindgr.parallel.context import init_distributed

ctx = init_distributed(1)

from mindspore import Tensor, mutable, nn, ops  # noqa: E402  (after init_distributed)
from mindspore.communication import GlobalComm  # noqa: E402


class One(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ar = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, x):
        return self.ar(x)


class PerTensor(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ar = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)

    def construct(self, xs):
        out = ()
        for x in xs:
            out = out + (self.ar(x),)
        return out


SIZES = [128000, 65536] + [4096] * 8 + [64] * 16 + [8192] * 2
one, per_tensor = One(), PerTensor()
flat = Tensor(np.ones(240000, np.float32))
parts = mutable(tuple(Tensor(np.ones(n, np.float32)) for n in SIZES))
for _ in range(3):                                      # compile and warm up both graphs
    one(flat).asnumpy()
    [t.asnumpy() for t in per_tensor(parts)]

if ctx.rank == 1:                                       # rank 0 waits 2 s in the collective
    time.sleep(2.0)
c0, t0 = time.process_time(), time.perf_counter()
one(flat).asnumpy()
print(f"rank {ctx.rank}: wait wall {time.perf_counter() - t0:.3f} s, CPU {time.process_time() - c0:.3f} s", flush=True)

for name, run in (("flat, 1 AllReduce", lambda: one(flat).asnumpy()),
                  (f"per tensor, {len(SIZES)} AllReduces", lambda: [t.asnumpy() for t in per_tensor(parts)])):
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(20):
        run()
    print(f"rank {ctx.rank}: {name}: wall {(time.perf_counter() - t0) / 20 * 1e3:.2f} ms, "
          f"CPU {(time.process_time() - c0) / 20 * 1e3:.2f} ms per step", flush=True)
