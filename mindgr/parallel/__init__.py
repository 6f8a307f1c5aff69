"""Multi-process training on MindSpore's own engine: msrun launches the ranks, mccl (CPU) / HCCL (Ascend)
carry the collectives.

    context   who am I (rank, world), communication init, core binding (device, threads: mindgr.runtime)
    comm      all_reduce / all_gather / broadcast / all_to_all_v / reduce_scatter over a named group
              (native on Ascend, exact AllGather/AllReduce emulation on CPU)
    balance   cost model c(L) = c0 + a*L + b*L^2 and the cost-balanced split of a global batch
    calibrate timed probe that fits a, b, c0 on the compiled step
    plan      global batch -> this rank's packed batch (+ host draws mapped token by token)
    dp        data-parallel step: local grads of a globally normalised loss, summed by all-reduce
    executor  DataParallelExecutor: the executor of the one training loop (mindgr.train.loop) on every
              rank, for any task: its share of the batch, rank-aware outputs, checkpoints and evaluation
    resolve   resolve(cfg): the task and the executor that train a config in this process
    watchdog  a rank that stops making progress exits (no hang)
    launch    msrun wrapper used by `mindgr train --nproc N`
    sparse/   the item table sharded over node groups, semi-asynchronous cross-node exchange (docs/sparse.md)
The ModelArts entry (data_url / train_url) is scripts/train_modelarts.py. See docs/distributed.md.
"""
