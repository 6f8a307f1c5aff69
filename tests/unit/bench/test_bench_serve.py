"""`mindgr bench serve --gr`: the capacity bound (per-shape batch times from two /metrics snapshots) and the
servers' memory guard; the --gr-sides (a decode mode, or BACKBONE:DECODE)."""
from mindgr.bench.serve import _shape_ms, capacity_bound


def snap(hist, ms):
    return {"batches": {"shape_histogram": hist, "compute_ms_per_batch": ms}}


def test_shape_ms_is_the_mean_of_the_batches_between_snapshots():
    before = snap({"1": 2, "2": 1}, {"1": 100.0, "2": 300.0})
    after = snap({"1": 3, "2": 3, "4": 1}, {"1": 110.0, "2": 320.0, "4": 900.0})
    got = _shape_ms(before, after)
    assert set(got) == {1, 2, 4}
    assert abs(got[1] - (330.0 - 200.0)) < 1e-9          # one new 1-user batch of 130 ms
    assert abs(got[2] - (960.0 - 300.0) / 2) < 1e-9      # two new 2-user batches, 330 ms each
    assert got[4] == 900.0


def test_capacity_is_the_best_users_per_second_over_shapes():
    assert capacity_bound({1: 500.0, 2: 800.0, 4: 2000.0}) == (2.5, 2)
    assert capacity_bound({}) == (None, None)


def test_a_server_over_its_memory_budget_is_killed_and_flagged():
    import subprocess
    import sys
    from mindgr.bench.serve import guard_memory, resident_bytes
    grow = "import time\nx = []\nfor _ in range(60):\n    x.append(bytearray(8 << 20)); time.sleep(0.02)\ntime.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", grow])
    try:
        guard_memory(proc, 200 << 20, every_s=0.05)
        assert proc.wait(20) != 0
        assert proc.memory_exceeded > 200 << 20
    finally:
        proc.kill()
    small = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    guard_memory(small, 2 << 30, every_s=0.05)
    assert small.wait(20) == 0 and small.memory_exceeded is None
    assert resident_bytes(small.pid) is None                   # gone


def test_gr_sides_name_a_decode_mode_or_a_backbone_and_mode():
    import pytest
    from mindgr.bench.serve import _sides, side_parts
    from mindgr.config import ConfigError
    assert _sides("linear:engine, hstu:engine") == ("linear:engine", "hstu:engine")
    assert side_parts("linear:engine", "hstu") == ("linear", "engine")
    assert side_parts("per_beam", "linear") == ("linear", "per_beam")
    assert side_parts("overlap-on", "hstu") == ("hstu", "engine")
    for bad in ("engine", "engine,engine", "gru:engine,hstu:engine", "linear:fast,hstu:engine"):
        with pytest.raises(ConfigError, match="--gr-sides"):
            _sides(bad)
