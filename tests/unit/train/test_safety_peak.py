"""The MFU denominator (issue 14): cached per CPU model and core count, never from a busy host."""
import json

import pytest

import mindgr.train.peak as peak


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDGR_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "_uncached", {})
    return tmp_path / "peak.json"


def _fake(monkeypatch, flops, others, spread):
    calls = []

    def measure():
        calls.append(1)
        return {"flops_per_s": flops, "others_share": others, "spread": spread, "repeats": 30}
    monkeypatch.setattr(peak, "measure_peak", measure)
    return calls


def test_a_busy_measurement_is_not_cached_and_is_measured_again(cache, monkeypatch):
    notes = []
    calls = _fake(monkeypatch, 73.5e9, others=0.6, spread=0.05)
    p = peak.peak_flops(log=notes.append)
    assert p["flops_per_s"] == 73.5e9 and p["cached"] is False and not cache.exists()
    assert notes and "busy host" in notes[0] and "not cached" in notes[0]
    peak.peak_flops()                                     # same process: reused, not measured again
    assert len(calls) == 1
    monkeypatch.setattr(peak, "_uncached", {})            # a later start measures again
    calls = _fake(monkeypatch, 166e9, others=0.01, spread=0.05)
    p = peak.peak_flops()
    assert p["flops_per_s"] == 166e9 and p["cached"] is True and len(calls) == 1
    machines = json.loads(cache.read_text())["machines"]
    (key, entry), = machines.items()
    assert entry["flops_per_s"] == 166e9 and "cores" in key
    assert peak.peak_flops()["flops_per_s"] == 166e9 and len(calls) == 1      # now from the cache


def test_a_scattered_measurement_is_not_cached(cache, monkeypatch):
    _fake(monkeypatch, 90e9, others=None, spread=0.8)
    p = peak.peak_flops()
    assert p["cached"] is False and "spread" in p["busy"] and not cache.exists()


def test_the_cache_key_is_the_cpu_model_and_core_count_not_the_host_name(monkeypatch):
    import os
    import platform
    key = peak._machine_key()
    assert f"{os.cpu_count()} cores" in key and platform.node() not in key.split("|")


def test_a_rate_well_below_the_cached_quiet_peak_is_called_busy(cache, monkeypatch):
    """A VM's neighbours can slow every repeat alike (small spread, nothing in this guest's /proc/stat):
    once a quiet peak is cached, a rate below 80% of it is named, so a bench's MFU against it is marked."""
    assert peak.quiet_peak() is None
    _fake(monkeypatch, 160e9, others=0.01, spread=0.05)
    peak.peak_flops()                                          # cached: the quiet peak
    assert peak.quiet_peak() == 160e9
    slow = {"flops_per_s": 88e9, "others_share": 0.02, "spread": 0.03}
    assert peak.busy_reason(slow) is None                      # the old checks alone miss it
    why = peak.busy_reason(slow, peak.quiet_peak())
    assert "88.0 GFLOP/s" in why and "45% below" in why and "160.0" in why
    assert peak.busy_reason(dict(slow, flops_per_s=140e9), peak.quiet_peak()) is None
    cache.write_text('{"machines": {"%s": {}}}' % peak._machine_key())   # a damaged entry: unknown, no error
    assert peak.quiet_peak() is None


def test_a_slowed_refresh_does_not_replace_the_cached_quiet_peak(cache, monkeypatch):
    _fake(monkeypatch, 160e9, others=0.01, spread=0.05)
    peak.peak_flops()
    _fake(monkeypatch, 88e9, others=0.01, spread=0.05)        # tight repeats, quiet /proc/stat, but slowed
    p = peak.peak_flops(refresh=True)
    assert p["cached"] is False and "below" in p["busy"] and peak.quiet_peak() == 160e9
