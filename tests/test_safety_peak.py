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
