"""mindgr.runtime: process setup in one place (graph mode, device once, threads, seed, ops backend)."""
import mindspore as ms

from mindgr import runtime
from mindgr.config import load_config
from mindgr.ops import backend


def test_setup_selects_graph_mode_device_and_backend():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    previous = backend.get_backend()
    try:
        assert runtime.setup_mindspore(load_config(None, ["ops.backend=reference", "run.seed=3"])) == "reference"
        assert ms.get_context("mode") == ms.GRAPH_MODE
        assert runtime.select_device() == ms.get_context("device_target") == "CPU"
        assert backend.get_backend() == "reference" and set(backend.ACTIVE) == set(backend.OPS)
    finally:
        backend.set_backend(previous)


def test_trainer_and_context_use_the_runtimes_functions():
    from mindgr.parallel import context
    from mindgr.train import trainer
    assert trainer.setup_mindspore is runtime.setup_mindspore
    assert context.limit_threads is runtime.limit_threads and context.thread_env is runtime.thread_env


def test_thread_env():
    assert runtime.thread_env(0) == {}
    env = runtime.thread_env(2)
    assert env["MINDGR_CPU_THREADS"] == env["OMP_NUM_THREADS"] == "2"


def test_device_selection_survives_kernels_that_ran_first():
    """A process (e.g. a test session) that ran kernels before any setup keeps its CPU device."""
    import subprocess
    import sys
    from conftest import REPO
    code = ("import numpy as np, mindspore as ms; from mindgr import runtime; from mindgr.config import load_config; "
            "print(float(ms.Tensor(np.ones(2, np.float32)).sum())); "
            "print(runtime.setup_mindspore(load_config(None, ['ops.backend=reference'])), runtime.select_device())")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-2:] == ["reference", "CPU"]
