"""This machine's fp32 GEMM rate through MindSpore MatMul: the MFU denominator. Measured once, cached."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np


def _cache_path() -> Path:
    root = os.environ.get("MINDGR_CACHE", str(Path.home() / ".cache" / "mindgr"))
    return Path(root) / "peak.json"


def _machine_key() -> str:
    import mindspore as ms
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|{os.cpu_count()}|mindspore {ms.__version__}"


def measure_peak(size: int = 1024, repeats: int = 10) -> float:
    """Best of `repeats` timed [size x size] x [size x size] fp32 MatMuls, in FLOP/s."""
    import mindspore as ms
    from mindspore import Tensor, ops
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((size, size), dtype=np.float32))
    b = Tensor(rng.standard_normal((size, size), dtype=np.float32))
    matmul = ms.jit(ops.matmul)
    matmul(a, b).asnumpy()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).asnumpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size ** 3 / best


def peak_flops(refresh: bool = False) -> dict:
    """{"flops_per_s", "key", "measured_at", "method"}; measured if not cached for this machine."""
    path = _cache_path()
    key = _machine_key()
    if not refresh and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                return cached
        except (OSError, ValueError):
            pass
    result = {"flops_per_s": measure_peak(), "key": key, "measured_at": time.time(),
              "method": "best of 10 MindSpore fp32 MatMul 1024^3"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)
    return result
