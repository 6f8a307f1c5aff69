"""Process setup, once per process and in one place: graph mode, device, compute threads, seed, ops backend.

Layer: above config and ops, below models' users (train, parallel, bench, cli). A multi-process job
(mindgr.parallel.context.init_distributed) selects the device here too, before communication starts;
`setup_mindspore` then leaves the device alone.
"""
from __future__ import annotations

import os

_state = {"device": None}   # the device this process selected (None: not yet)


def select_device() -> str:
    """Graph mode on the device this process runs on (Ascend when MindSpore targets it, else CPU). The device
    is set once: after communication is initialised it must not be set again."""
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE)
    if _state["device"] is None:
        if ms.get_context("device_target") != "Ascend":
            try:
                ms.set_device("CPU")
            except RuntimeError as exc:   # kernels already ran on the default device, CPU: it stays
                if "runtime has been initialized" not in str(exc) or ms.get_context("device_target") != "CPU":
                    raise
        _state["device"] = ms.get_context("device_target")
    return _state["device"]


def limit_threads(threads: int):
    """At most `threads` compute threads in this process: MindSpore's CPU kernels, our C++ kernels, BLAS.

    Measured (docs/distributed.md): `ms.device_context.cpu.op_tuning.threads_num(1)` runs every kernel on
    the calling thread; the BLAS variables only act on libraries not loaded yet (the launcher exports them).
    """
    if threads <= 0:
        return
    os.environ["MINDGR_CPU_THREADS"] = str(threads)   # read by mindgr.ops.cpu at every call
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    import mindspore as ms
    if ms.get_context("device_target") == "CPU":
        from mindspore._c_expression import RuntimeConf
        if not RuntimeConf.get_instance().is_op_threads_num_configured():
            ms.device_context.cpu.op_tuning.threads_num(threads)


def thread_env(threads: int) -> dict:
    """Environment for child processes so that every thread pool starts at `threads`."""
    if threads <= 0:
        return {}
    v = str(threads)
    return {"OMP_NUM_THREADS": v, "OPENBLAS_NUM_THREADS": v, "MKL_NUM_THREADS": v, "MINDGR_CPU_THREADS": v}


def setup_mindspore(cfg) -> str:
    """Graph mode, device, `parallel.threads`, `run.seed` and `ops.backend` for this process; returns the
    ops backend selected (mindgr.ops.backend)."""
    import mindspore as ms
    from mindgr.ops import set_backend
    select_device()
    limit_threads(cfg.parallel.threads)
    ms.set_seed(cfg.run.seed)
    return set_backend(cfg.ops.backend)
