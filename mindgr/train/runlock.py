"""One writer per run directory: an exclusive flock on RUN_DIR/.lock, held for the life of a run.

The kernel drops a flock when its process exits in any way (kill -9 included), so a lock left by a dead
process is never live: the next run takes it. The holder's pid is written into the file so that a
refused second writer can say who holds the run.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mindgr.train.checkpoint import CheckpointError


class RunLock:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self._fd = None

    def acquire(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise CheckpointError(f"{self.path.parent} is in use by another training (pid {holder}): wait for it "
                                  "to end, or choose another run.name") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self):
        if self._fd is not None:
            os.close(self._fd)               # closing the descriptor drops the lock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self):
        self.release()
