"""Resident memory of this process: current and peak RSS, the peak of each phase of a run, and handing
memory freed by Python and MindSpore back to the system between phases.

Linux reports both figures in /proc/self/status (VmRSS, VmHWM); elsewhere they read 0 and nothing is
reset. A phase's peak is the high-water mark since the phase began: MemoryPhases resets the mark when a
phase begins (writing 5 to /proc/self/clear_refs) and keeps the largest mark seen before any reset, so
process_peak_mb() stays the whole process's peak.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

_reset_peak_mb = 0.0          # the largest high-water mark seen before a reset


def _status_mb(key: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def rss_mb() -> float:
    """Resident memory now (VmRSS, MB = 2^20 bytes)."""
    return _status_mb("VmRSS")


def process_peak_mb() -> float:
    """This process's resident high-water mark since it started (VmHWM, including marks before a reset)."""
    return max(_reset_peak_mb, _status_mb("VmHWM"))


def reset_peak() -> bool:
    """Start a new high-water mark (the old one is kept for process_peak_mb); False where it cannot."""
    global _reset_peak_mb
    hwm = _status_mb("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    _reset_peak_mb = max(_reset_peak_mb, hwm)
    return True


_libc = None


def release_memory(graphs: bool = False) -> float:
    """Collect Python's garbage and give the C heap's free pages back to the system (glibc malloc_trim; a
    no-op elsewhere): memory a finished phase freed stops counting as resident. graphs: first free every
    compiled MindSpore graph and its buffers (mindspore.ms_memory_recycle; a cell called again compiles
    its graph again). Returns the MB released."""
    global _libc
    before = rss_mb()
    gc.collect()
    if graphs:
        import mindspore as ms
        ms.ms_memory_recycle()
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
            if _libc and not hasattr(_libc, "malloc_trim"):
                _libc = False
        except OSError:
            _libc = False
    if _libc:
        _libc.malloc_trim(0)
    return max(before - rss_mb(), 0.0)


class MemoryPhases:
    """The peak resident memory of each named phase of a run (a name may recur: its largest peak is kept)
    and the resident memory when it last ended. enter(name) ends the current phase and begins `name`."""

    def __init__(self):
        self.current = None
        self.phases: dict[str, dict] = {}
        self.per_phase = False          # whether the mark could be reset (else peaks are cumulative)
        self._start = 0.0

    def enter(self, name: str | None):
        if self.current is not None:
            peak, end = _status_mb("VmHWM"), rss_mb()
            rec = self.phases.setdefault(self.current, {"peak_mb": 0.0, "start_rss_mb": 0.0, "end_rss_mb": 0.0})
            if peak >= rec["peak_mb"]:
                rec["peak_mb"], rec["start_rss_mb"] = round(peak, 1), round(self._start, 1)
            rec["end_rss_mb"] = round(end, 1)
        self.current = name
        if name is not None:
            self.per_phase = reset_peak()
            self._start = rss_mb()

    def summary(self) -> dict:
        """{"peak_rss_mb": the process's peak, "phases": {name: {"peak_mb", "start_rss_mb" (resident when the
        phase began, at its highest peak), "end_rss_mb" (when it last ended)}}, "per_phase"}."""
        return {"peak_rss_mb": round(process_peak_mb(), 1), "phases": {k: dict(v) for k, v in self.phases.items()},
                "per_phase": self.per_phase}
