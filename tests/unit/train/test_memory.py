"""Resident-memory figures of a run (mindgr.train.memory): phase peaks, the process peak across resets, and
handing freed heap pages back."""
import sys

import numpy as np
import pytest

from mindgr.train import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")


@linux
def test_phase_peaks_and_the_process_peak_across_resets():
    phases = memory.MemoryPhases()
    phases.enter("big")
    big = np.ones(200 * 2**20 // 8)                 # 200 MB, touched
    big_peak = memory.rss_mb()
    del big
    memory.release_memory()
    phases.enter("small")
    small = np.ones(20 * 2**20 // 8)
    del small
    phases.enter("big")                             # a name that recurs keeps its largest peak
    phases.enter(None)
    s = phases.summary()
    assert set(s["phases"]) == {"big", "small"}
    if not s["per_phase"]:
        pytest.skip("this kernel does not reset the high-water mark (/proc/self/clear_refs)")
    assert s["phases"]["big"]["peak_mb"] >= big_peak - 1
    # the mark was reset when "small" began: its peak is far below the 200 MB array's
    assert s["phases"]["small"]["peak_mb"] < s["phases"]["big"]["peak_mb"] - 100
    # the process peak still counts the mark from before the resets
    assert s["peak_rss_mb"] >= s["phases"]["big"]["peak_mb"]
    assert memory.process_peak_mb() >= big_peak - 1


@linux
def test_release_memory_gives_freed_heap_pages_back():
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # many small blocks (below the mmap threshold: they live in the heap, which free() alone keeps)
    blocks = [libc.malloc(64 * 1024) for _ in range(1600)]          # 100 MB
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)
    keep = blocks[-1]                                             # the heap's top stays in use
    for b in blocks[:-1]:
        libc.free(b)
    resident = memory.rss_mb()
    released = memory.release_memory()
    assert released > 50, (resident, released)
    assert memory.rss_mb() < resident - 50
    libc.free(keep)
