"""The background input producer: order, error propagation with traceback, clean shutdown."""
import threading
import time

import pytest

from mindgr.train.pipeline import Inline, Prefetcher, ProducerError


def test_results_in_order_and_same_as_inline():
    with Prefetcher(range(50), lambda i: i * i, depth=3) as p:
        threaded = list(p)
    assert threaded == [(i, i * i) for i in range(50)]
    assert list(Inline(range(50), lambda i: i * i)) == threaded


def test_producer_error_surfaces_with_traceback():
    def make(i):
        if i == 3:
            raise KeyError("bad batch 3")
        return i

    p = Prefetcher(range(10), make)
    got = [next(p), next(p), next(p)]
    assert [g[0] for g in got] == [0, 1, 2]
    with pytest.raises(ProducerError) as e:
        next(p)
    assert "bad batch 3" in str(e.value) and "Traceback" in str(e.value) and "make" in str(e.value)
    p.close()


def test_close_stops_a_blocked_producer_quickly():
    made = []

    def make(i):
        made.append(i)
        return i

    p = Prefetcher(range(10 ** 9), make, depth=2)
    next(p)
    t0 = time.perf_counter()
    p.close()
    assert time.perf_counter() - t0 < 2.0
    assert not any(t.name == "mindgr-input" and t.is_alive() for t in threading.enumerate())
    assert len(made) < 10  # bounded queue: it never ran far ahead


def test_wait_time_counts_blocking():
    def slow(i):
        time.sleep(0.05)
        return i

    with Prefetcher(range(4), slow, depth=1) as p:
        list(p)
    assert p.wait_s >= 0.1
