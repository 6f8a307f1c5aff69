"""A rank that makes no progress for `timeout` seconds exits with a clear message instead of hanging.

When a peer dies or hangs, the survivors block inside a collective that never completes. msrun stops
the job when a process EXITS, not when one hangs; this watchdog turns a hang into an exit. The
collectives release the GIL while they wait (measured), so a Python thread can watch; faulthandler is a
second line for a hang that holds the GIL: it prints every thread's stack and exits 30 s later.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

EXIT_CODE = 75


class Watchdog:
    def __init__(self, timeout: float, rank: int):
        self.timeout, self.rank = float(timeout), rank
        self._last = time.monotonic()
        self._what = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="mindgr-watchdog")
        self._thread.start()
        self.beat("starting")

    def beat(self, what: str):
        """Progress was made; `what` is the phase now entered (shown if this rank gets stuck in it)."""
        self._last, self._what = time.monotonic(), what
        faulthandler.dump_traceback_later(self.timeout + 30.0, exit=True)

    def _watch(self):
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                print(f"mindgr: error: rank {self.rank}: no progress for {idle:.0f} s while {self._what} "
                      f"(parallel.timeout = {self.timeout:g} s); another rank has probably died or hung: "
                      "stopping this rank", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(EXIT_CODE)

    def close(self):
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
