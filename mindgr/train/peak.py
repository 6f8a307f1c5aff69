"""This machine's fp32 GEMM rate through MindSpore MatMul: the MFU denominator. Measured, then cached.

The cache (~/.cache/mindgr/peak.json, or $MINDGR_CACHE) holds one entry per CPU model and core count.
A peak measured while other processes keep the host busy can be half the quiet one and would double every
MFU printed afterwards, so such a measurement is used for this process only and never cached: the next
start measures again. "Busy" is judged by the CPU time other processes took during the measurement
(/proc/stat minus our own), by the spread of the repeats and, once a quiet peak is cached, by a rate well
below it (a VM's noisy neighbours slow every repeat alike without showing in this guest's /proc/stat).
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write

BUSY_SHARE = 0.15       # other processes' share of the CPUs above which a measurement is not cached
SPREAD = 0.25           # (median - best) / best of the repeats above which it is not cached either
SLOW = 0.8              # a rate below this fraction of the cached quiet peak: the host was slowed
_uncached: dict = {}    # this process's measurement when it could not be cached


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
    return f"{cpu}|{os.cpu_count()} cores|mindspore {ms.__version__}"


def _host_busy_s() -> float | None:
    """CPU seconds every process on the host has spent busy so far (/proc/stat), None if unknown."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure_peak(size: int = 1024, repeats: int = 10, rounds: int = 3) -> dict:
    """Best of `rounds` x `repeats` timed [size x size] x [size x size] fp32 MatMuls, in FLOP/s, with what the
    host's other processes did meanwhile: {"flops_per_s", "others_share", "spread"}."""
    import mindspore as ms
    from mindspore import Tensor, ops
    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((size, size), dtype=np.float32))
    b = Tensor(rng.standard_normal((size, size), dtype=np.float32))
    matmul = ms.jit(ops.matmul)
    matmul(a, b).asnumpy()  # compile and warm up
    host0, own0, wall0 = _host_busy_s(), time.process_time(), time.perf_counter()
    times = []
    for _ in range(rounds * repeats):
        t0 = time.perf_counter()
        matmul(a, b).asnumpy()
        times.append(time.perf_counter() - t0)
    host1, own1, wall1 = _host_busy_s(), time.process_time(), time.perf_counter()
    others = None
    if host0 is not None and host1 is not None:
        others = max(0.0, (host1 - host0) - (own1 - own0)) / ((wall1 - wall0) * (os.cpu_count() or 1))
    best = min(times)
    return {"flops_per_s": 2.0 * size ** 3 / best, "others_share": others,
            "spread": float(np.median(times) - best) / best, "repeats": rounds * repeats}


def busy_reason(m: dict, quiet: float | None = None) -> str | None:
    """Why a measurement looks taken on a busy host (None: quiet enough to cache); `quiet`: this machine's
    cached quiet peak in FLOP/s, if known (quiet_peak())."""
    if m.get("others_share") is not None and m["others_share"] > BUSY_SHARE:
        return f"other processes used {m['others_share'] * 100:.0f}% of the CPUs while it ran"
    if m["spread"] > SPREAD:
        return f"its repeats spread by {m['spread'] * 100:.0f}%"
    if quiet and m["flops_per_s"] < SLOW * quiet:
        return (f"its {m['flops_per_s'] / 1e9:.1f} GFLOP/s is {100 * (1 - m['flops_per_s'] / quiet):.0f}% below "
                f"this machine's cached quiet peak of {quiet / 1e9:.1f}")
    return None


def quiet_peak() -> float | None:
    """This machine's cached quiet peak (FLOP/s) without measuring; None when none is cached."""
    entry = _read_cache(_cache_path()).get(_machine_key())
    try:
        return float(entry["flops_per_s"])
    except (TypeError, KeyError, ValueError):
        return None


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("machines", {}) if isinstance(data, dict) else {}


def peak_flops(refresh: bool = False, log=None) -> dict:
    """{"flops_per_s", "key", "measured_at", "method", "cached"}: the cached peak of this CPU model and core
    count, else measured now (cached only if the host was quiet; `log` is told when it was not)."""
    path = _cache_path()
    key = _machine_key()
    machines = _read_cache(path)
    if not refresh:
        if key in machines:
            return dict(machines[key], cached=True)
        if key in _uncached:
            return _uncached[key]
    m = measure_peak()
    result = {"flops_per_s": m["flops_per_s"], "key": key, "measured_at": time.time(),
              "method": f"best of {m['repeats']} MindSpore fp32 MatMul 1024^3", "others_share": m["others_share"],
              "spread": m["spread"]}
    busy = busy_reason(m, quiet_peak())    # a --refresh on a slowed host must not replace the quiet peak
    if busy:
        result.update(cached=False, busy=busy)
        _uncached[key] = result
        if log:
            log(f"note: GEMM peak {m['flops_per_s'] / 1e9:.1f} GFLOP/s measured on a busy host ({busy}): not "
                "cached, MFU figures of this run may be too high; it is measured again next time")
        return result
    machines[key] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"machines": machines}, indent=1))
    _uncached.pop(key, None)
    return dict(result, cached=True)
