"""resolve(cfg): the task (mindgr.train.tasks) and the executor that train a config in this process. The one
place that picks an executor; which task a config is, is the task registry's answer.

    one process                              LocalExecutor (mindgr.train.local)
    a rank of an msrun job, parallel.sparse  ShardedTableExecutor (mindgr.parallel.sparse.executor)
    a rank of an msrun job                   DataParallelExecutor (mindgr.parallel.executor)
    parallel.nproc > 1 outside msrun         None: the caller launches the ranks (mindgr.parallel.launch)

A new executor is one entry of EXECUTORS and the condition that selects it in executor_kind.
"""
from __future__ import annotations


def _local():
    from mindgr.train.local import LocalExecutor
    return LocalExecutor


def _data_parallel():
    from mindgr.parallel.executor import DataParallelExecutor
    return DataParallelExecutor


def _sharded_table():
    from mindgr.parallel.sparse.executor import ShardedTableExecutor
    return ShardedTableExecutor


EXECUTORS = {"local": _local, "data_parallel": _data_parallel, "sharded_table": _sharded_table}


def executor_kind(cfg, ranks: bool = False) -> str:
    """Which executor trains this config: one process (parallel.sparse then has nothing to shard over), or on
    the ranks of a job (ranks=True, or parallel.nproc > 1) data parallel, with the table sharded or not."""
    if not ranks and cfg.parallel.nproc <= 1:
        return "local"
    return "sharded_table" if cfg.parallel.sparse != "none" else "data_parallel"


def resolve(cfg):
    """The executor (holding its task) that trains `cfg` in this process, or None when this process should
    launch the ranks of a multi-process job (the task's config checks for that executor already passed)."""
    from mindgr.parallel.context import under_msrun
    from mindgr.train.tasks import resolve_task
    task = resolve_task(cfg)
    ranks = under_msrun()    # a rank (or msrun's scheduler, which stops in the executor's init)
    kind = executor_kind(cfg, ranks)
    if ranks:
        return EXECUTORS[kind]()(cfg, task)
    if cfg.parallel.nproc > 1:
        task.check_config(kind)          # a task that cannot run there: one line before msrun starts
        return None
    return EXECUTORS[kind]()(cfg, task)
