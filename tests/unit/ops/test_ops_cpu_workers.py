"""The kernels' persistent worker threads (mindgr/ops/cpu/workers.cc, behind common.h parallel_run).

parallel_run(n, fn) must run fn(tid) exactly once for every tid in [0, n) per call and return only when
all have run, also when two threads call it at once (ctypes drops the GIL, so the Python threads below
call into the kernels concurrently), when n changes between calls (a pool wider than the job), when a
fn throws (the exception reaches the caller, the pool stays usable) and in a forked child (the parent's
workers do not exist there). The kernels' results themselves are checked by the other kernel tests.
"""
import os
import threading

import numpy as np

from ops_fixtures import needs_compiler

pytestmark = needs_compiler

from mindgr.ops import cpu  # noqa: E402


def test_every_tid_runs_once_per_call():
    for n in (1, 2, 3, 5, 2, 8, 3):
        counts, ok = cpu.parallel_probe(n, 50)
        assert ok and counts.tolist() == [50] * n, (n, counts)


def test_exceptions_reach_the_caller_and_the_pool_survives():
    for tid in (0, 1, 3):
        counts, ok = cpu.parallel_probe(4, 20, throw_tid=tid)
        assert ok and counts.tolist() == [20] * 4, (tid, counts)
    counts, ok = cpu.parallel_probe(4, 20)
    assert ok and counts.tolist() == [20] * 4


def test_concurrent_callers():
    results = []

    def worker(n):
        results.append((n, cpu.parallel_probe(n, 300)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in (2, 3, 4, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    for n, (counts, ok) in results:
        assert ok and counts.tolist() == [300] * n, (n, counts)


def test_forked_child_gets_its_own_workers():
    cpu.parallel_probe(3, 5)  # the parent's pool exists and has workers
    pid = os.fork()
    if pid == 0:  # child: no pytest here, only the exit code
        code = 1
        try:
            counts, ok = cpu.parallel_probe(3, 20)
            code = 0 if ok and counts.tolist() == [20] * 3 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    counts, ok = cpu.parallel_probe(3, 5)
    assert ok and counts.tolist() == [5] * 3
