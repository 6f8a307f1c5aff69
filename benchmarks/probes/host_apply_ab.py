"""One process, one thread: what the host-sum step's update costs, on the `mindgr bench distributed` model.

Alternated on the same gradients: (a) FlatApply, the flat summed vector cut into gradients inside the
update graph; (b) the optimizer alone on a tuple of gradient tensors made on the host from views of the
flat vector (TupleApply); and, for scale, the single-process train step minus the data-parallel
forward + backward (the update's cost inside one graph).

    python benchmarks/probes/host_apply_ab.py        # prints the median ms of each
"""
import time

import numpy as np
from mindspore import Tensor, mutable, nn

from mindgr.bench.scaling_blocks import single_process_trainer
from mindgr.parallel.dp import FlatApply, LocalGrads, flat_bounds

trainer = single_process_trainer("host-apply-probe")
opt = trainer.model.optimizer
params = list(opt.parameters)
bounds = flat_bounds([p.shape for p in params])
n = bounds[-1][1] + 1
rng = np.random.default_rng(0)
flat = (rng.standard_normal(n) * 1e-6).astype(np.float32)


class TupleApply(nn.Cell):
    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer

    def construct(self, grads):
        self.optimizer(grads)
        return grads[0].sum()


flat_apply, tuple_apply = FlatApply(opt), TupleApply(opt)
batches = [trainer.executor.prepare(0, *item)[0].tensors()
           for item in list(trainer.data.plan.iter_batches(0, 0))[:4]]
local = LocalGrads(trainer.model.loss_net, params)
scale = Tensor(np.float32(1.0))
run = {"flat apply": lambda: flat_apply(Tensor(flat)).asnumpy(),
       "tuple apply": lambda: tuple_apply(mutable(tuple(Tensor(flat[lo:hi].reshape(p.shape))
                                                         for p, (lo, hi) in zip(params, bounds)))).asnumpy(),
       "train step": lambda: [trainer.model.train_step(*b).asnumpy() for b in batches],
       "forward+backward": lambda: [local(*b, scale)[0].asnumpy() for b in batches]}
for f in run.values():
    f()
times = {k: [] for k in run}
for rep in range(20):
    for name in (list(run) if rep % 2 == 0 else list(run)[::-1]):
        t0 = time.perf_counter()
        run[name]()
        times[name].append(time.perf_counter() - t0)
med = {k: 1e3 * np.median(v) for k, v in times.items()}
print(f"{len(params)} parameters, {n - 1} floats")
print(f"flat apply: median {med['flat apply']:.2f} ms; tuple apply: {med['tuple apply']:.2f} ms")
print(f"train step - forward+backward, per step: {(med['train step'] - med['forward+backward']) / len(batches):.2f} ms")
