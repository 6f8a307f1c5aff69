"""The modelled inter-node link (mindgr.parallel.sparse.link) and where BoundedStaleness waits for it.

No test times anything: a fake clock advances only when the code sleeps or the test moves it."""
import numpy as np
import pytest

from mindgr.config import ConfigError, load_config
from mindgr.parallel.sparse.exchange import BoundedStaleness
from mindgr.parallel.sparse.link import LinkModel, MeasuredExchange
from mindgr.parallel.sparse.traffic import Traffic


class FakeClock:
    def __init__(self):
        self.t = 100.0
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def test_link_seconds_from_bytes_and_messages():
    off = LinkModel()
    assert not off.on and off.seconds(10 ** 9, 7) == 0.0
    lat = LinkModel(latency_ms=0.05)
    assert lat.on and lat.seconds(10 ** 9, 4) == pytest.approx(4 * 0.05e-3)          # no bandwidth term
    bw = LinkModel(gbps=2.0, local_ranks=4)               # a rank gets 0.5 GB/s of its node's 2 GB/s
    assert bw.on and bw.seconds(1_000_000, 3) == pytest.approx(1e6 / 0.5e9)
    both = LinkModel(latency_ms=0.02, gbps=25.0, local_ranks=2)
    rng = np.random.default_rng(0)
    for nbytes, msgs in zip(rng.integers(0, 10 ** 8, 20), rng.integers(0, 64, 20)):
        assert both.seconds(int(nbytes), int(msgs)) == pytest.approx(msgs * 0.02e-3 + nbytes * 2 / 25e9)


def test_traffic_counts_cross_node_messages():
    t = Traffic(np.array([0, 0, 1, 1]), me=0)
    t.send([0, 1, 2, 3], [5, 7, 11, 0], "x")             # self, same node, two other-node (one empty) messages
    assert (t.step_intra, t.step_inter, t.step_inter_messages) == (7, 11, 2)
    assert t.end_step() == (7, 11) and t.step_inter_messages == 0


def test_measured_exchange_reads_only_its_own_bytes():
    t = Traffic(np.array([0, 1]), me=0)
    t.send([1], [1000], "lookup")                         # earlier traffic of the step: not the exchange's
    model = LinkModel(latency_ms=1.0, gbps=1e-3, local_ranks=1)

    def exchange(slots, grads):
        t.send([0, 1], [0, 4000], "inter_reduce")
        t.send([0, 1], [0, 6000], "inter_gather")
        return slots + 1, grads

    (s, g), seconds = MeasuredExchange(model, t)(exchange, np.arange(3), np.ones((3, 2)))
    assert np.array_equal(s, np.arange(1, 4))
    assert seconds == pytest.approx(model.seconds(10_000, 2)) == pytest.approx(2e-3 + 10_000 / 1e6)


def _stale(tau, seconds, clock):
    applied = []
    link = (lambda exchange, s, g: (exchange(s, g), seconds)) if seconds is not None else None
    stale = BoundedStaleness(tau, lambda s, g: (s, g), lambda s, g: applied.append(int(s[0])), link=link,
                             clock=clock, sleep=clock.sleep)
    return stale, applied


def _step(stale, step, clock, compute_s):
    """A step as the executor runs it: background exchange, compute, join, submit, apply. The fake
    collectives take no time, so the join comes first (the clock must not move under the thread)."""
    stale.start_background()
    stale.join()
    clock.t += compute_s                                  # the step's compute, while the link carries it
    stale.submit(step, np.array([step]), np.zeros((1, 2), np.float32))
    stale.apply_due(step)
    return stale.take_link()


def test_link_off_never_waits():
    clock = FakeClock()
    for tau in (0, 1, 2):
        stale, applied = _stale(tau, None, clock)
        for step in range(1, 6):
            assert _step(stale, step, clock, 0.05) == (0.0, 0.0)
        stale.flush(5)
        assert applied == [1, 2, 3, 4, 5] and clock.slept == []


def test_tau0_waits_the_whole_delay_inside_the_step():
    clock = FakeClock()
    stale, applied = _stale(0, 0.03, clock)
    for step in range(1, 4):
        delay, wait = _step(stale, step, clock, 0.05)
        assert delay == pytest.approx(0.03) and wait == pytest.approx(0.03)
    assert applied == [1, 2, 3] and clock.slept == pytest.approx([0.03] * 3)


def test_tau1_overlaps_the_delay_with_the_next_step():
    clock = FakeClock()
    stale, applied = _stale(1, 0.03, clock)              # compute 0.05 s hides a 0.03 s link entirely
    records = [_step(stale, step, clock, 0.05) for step in range(1, 5)]
    assert records[0] == (0.0, 0.0)                       # nothing exchanged yet in step 1
    # arrival = end of the exchange's collectives (the start of the step: the fake collectives take no
    # time) + 0.03 s, before the end of the step's 0.05 s compute: no wait
    assert all(d == pytest.approx(0.03) and w == 0.0 for d, w in records[1:])
    assert applied == [1, 2, 3]
    stale2, _ = _stale(1, 0.08, clock)                    # a 0.08 s link: 0.03 s of it stays visible
    records = [_step(stale2, step, clock, 0.05) for step in range(1, 5)]
    assert all(d == pytest.approx(0.08) and w == pytest.approx(0.03) for d, w in records[1:])


def test_serial_link_queues_and_flush_waits():
    clock = FakeClock()
    stale, applied = _stale(2, 0.08, clock)
    records = [_step(stale, step, clock, 0.05) for step in range(1, 6)]
    # exchanges start every step but the link needs 0.08 s each, more than a 0.05 s step: they queue
    # (arrivals 0.08, 0.16, 0.24 after the first start) and the applications at t + 2 start to wait
    assert [r[0] for r in records] == pytest.approx([0.0, 0.08, 0.08, 0.08, 0.08])
    assert [r[1] for r in records] == pytest.approx([0.0, 0.0, 0.0, 0.01, 0.03])
    assert applied == [1, 2, 3]
    stale.flush(5)                                        # step 4's arrival (queued) and step 5's (not started)
    assert applied == [1, 2, 3, 4, 5] and stale.take_link()[0] == pytest.approx(0.08)


def test_link_config_errors():
    hier = ["parallel.nproc=4", "parallel.sparse=hierarchical", "parallel.nodes=2"]
    cfg = load_config(None, hier + ["parallel.link_latency_ms=0.05", "parallel.link_gbps=0.008"])
    assert (cfg.parallel.link_latency_ms, cfg.parallel.link_gbps) == (0.05, 0.008)
    assert load_config(None, []).parallel.link_gbps == 0.0 == load_config(None, []).parallel.link_latency_ms
    for bad, words in ((["parallel.link_gbps=-1"], "link_gbps = -1"),
                       (["parallel.link_latency_ms=inf"], "link_latency_ms"),
                       (["parallel.sparse=flat", "parallel.link_gbps=1"], "hierarchical, not flat"),
                       (["parallel.sparse=none", "parallel.link_latency_ms=1"], "hierarchical, not none")):
        with pytest.raises(ConfigError, match=words):
            load_config(None, (hier if "parallel.sparse" not in bad[0] else ["parallel.nproc=4"]) + bad)
