"""One process, one thread: the data-parallel forward+backward graph (LocalGrads, gradients as outputs)
against the single-process train step (forward+backward+update in one graph), on the same batches of
the `mindgr bench distributed` model, alternating, so that a slower DP graph would show.

    python benchmarks/probes/dp_grads_vs_train_step.py        # prints the median ms of each
"""
import time

import numpy as np
from mindspore import Tensor

from mindgr.bench.scaling_blocks import single_process_trainer
from mindgr.parallel.dp import LocalGrads

trainer = single_process_trainer("dp-grads-probe")
batches = [trainer.executor.prepare(0, *item)[0].tensors()
           for item in list(trainer.data.plan.iter_batches(0, 0))[:6]]
local = LocalGrads(trainer.model.loss_net, trainer.model.optimizer.parameters)
scale = Tensor(np.float32(1.0))
run = {"train step": lambda b: trainer.model.train_step(*b).asnumpy(),
       "dp forward+backward": lambda b: local(*b, scale)[0].asnumpy()}
for f in run.values():                       # compile both
    f(batches[0])
times = {k: [] for k in run}
for rep in range(6):
    for name in (list(run) if rep % 2 == 0 else list(run)[::-1]):
        for b in batches:
            t0 = time.perf_counter()
            run[name](b)
            times[name].append(time.perf_counter() - t0)
for name, ts in times.items():
    print(f"{name}: median {1e3 * np.median(ts):.1f} ms over {len(ts)} steps")
