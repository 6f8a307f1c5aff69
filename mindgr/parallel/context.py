"""Who am I in the job: msrun detection, communication init, core binding (the device and thread limits
are mindgr.runtime's, re-exported here)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from mindgr.runtime import limit_threads, select_device, thread_env  # noqa: F401  (thread_env: re-export)

_ctx = None
_COLLECTIVE = re.compile(r"\b(AllReduce|AllGather|Broadcast|ReduceScatter|AlltoAll\w*)\b")


class CollectiveError(RuntimeError):
    """A collective failed on this rank (one line): usually another rank died or hung."""


def collective_failure(exc: BaseException) -> str | None:
    """The collective named in a MindSpore kernel failure, or None if `exc` is something else."""
    text = str(exc)
    m = _COLLECTIVE.search(text)
    return m.group(1) if m and ("failed" in text or "timeout" in text.lower()) else None


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    backend: str          # "mccl" on CPU, "hccl" on Ascend
    cores: tuple = ()     # the CPU cores this process is bound to; () = not bound

    @property
    def is_writer(self) -> bool:
        """Rank 0 logs and writes the shared outputs (config, metrics, checkpoints, eval.json)."""
        return self.rank == 0


def under_msrun() -> bool:
    """True in a process started by msrun (a worker, or the scheduler that runs the same command)."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED") and "MS_WORKER_NUM" in os.environ


def core_share(cpus, local_rank: int, local_size: int) -> list[int]:
    """The cores of local rank `local_rank` of `local_size`: an equal contiguous block of `cpus` (sorted);
    [] when there are fewer cores than local ranks (nothing to bind to)."""
    cpus = sorted(int(c) for c in cpus)
    if local_size < 1 or not 0 <= local_rank < local_size or len(cpus) < local_size:
        return []
    n = len(cpus)
    return cpus[local_rank * n // local_size: (local_rank + 1) * n // local_size]


def bind_cores(enabled: bool) -> tuple:
    """parallel.bind_cores: pin every thread of this process to its local rank's share of the host's cores.

    Measured on this 2-core machine (benchmarks/results/distributed.md, benchmarks/probes/bind_cores_ab.py):
    no gain, pinned / free = 1.009 [95% 0.981, 1.034] in 2-process tokens/s; so it is off by default. On
    Ascend, MindSpore's own mindspore.runtime.set_cpu_affinity knows the NPU topology and is preferable.
    """
    if not enabled or not hasattr(os, "sched_setaffinity"):
        return ()
    from mindspore.communication import get_local_rank, get_local_rank_size
    mine = core_share(os.sched_getaffinity(0), int(get_local_rank()), int(get_local_rank_size()))
    if not mine:
        from mindgr.config import ConfigError
        raise ConfigError(f"config: parallel.bind_cores = true, but the {len(os.sched_getaffinity(0))} cores are "
                          f"fewer than the {get_local_rank_size()} ranks on this host")
    pin_threads(mine)
    return tuple(mine)


def pin_threads(cores):
    """Set the CPU affinity of every thread of this process (os.sched_setaffinity on a pid sets only
    that one thread; MindSpore's runtime threads already exist)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, PermissionError):   # a thread that just ended; a foreign-owned one
            pass


def init_distributed(threads: int = 0, bind: bool = False) -> DistContext:
    """Graph mode, device, thread limits, the collective backend, then core binding. Idempotent.

    msrun's scheduler process runs the same command: init() turns it into the scheduler and it never
    returns, so call this before any expensive work.
    """
    global _ctx
    if _ctx is not None:
        return _ctx
    select_device()
    limit_threads(threads)
    from mindspore.communication import GlobalComm, get_group_size, get_rank, init
    init()
    _ctx = DistContext(rank=int(get_rank()), world=int(get_group_size()), backend=str(GlobalComm.BACKEND),
                       cores=bind_cores(bind))
    from mindgr.parallel.launch import record_pid
    record_pid(_ctx.rank)
    bound = f", cores {list(_ctx.cores)}" if _ctx.cores else ""
    print(f"mindgr: rank {_ctx.rank}/{_ctx.world} pid {os.getpid()} ({_ctx.backend}{bound})", flush=True)
    return _ctx


def use_data_parallel_mode(world: int):
    """MindSpore's DATA_PARALLEL mode for this process (parallel.grad_reduce = mindspore): after
    communication is initialised (device_num is the world size) and before any model parameter or step
    graph is built (MindSpore reads the mode when it creates initializers and compiles). Gradients are
    summed, not averaged: each rank's loss is already weighted by its share of the global batch
    (mindgr.parallel.dp). Fusion buckets are set when the reducer is built (MindSporeReduceApply)."""
    import mindspore as ms
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=False,
                                 device_num=int(world))


def current() -> DistContext | None:
    return _ctx
