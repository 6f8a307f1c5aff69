"""Sum one float32 vector over the ranks of ONE host through shared memory (parallel.grad_reduce=host).

On CPU, mccl's AllReduce of the ~1 MB of dense gradients costs several ms per step (5.7 ms wall measured
for 240k floats on 2 ranks) where two processes of one host can add the same floats through a shared
mapping in well under one. Layout of the mapping (a file in /dev/shm, unlinked once every rank holds it, so
nothing is left behind by a crash):

    world int64 arrival counters, one per cache line | 2 x world slots of n float32 (double-buffered by step)

Step s: each rank writes its vector into slot [s % 2][rank], then publishes counter[rank] = s + 1, waits
until every counter is >= s + 1 and adds the slots in rank order, so every rank computes the same floats
(replicas stay bit-identical; with 2 ranks the result equals one float32 addition, as an AllReduce's).
Double buffering makes one wait per step enough: a rank writes slot [s % 2] again only at step s + 2,
after every rank published s + 2, i.e. after every rank finished reading step s.

The publish-after-write order relies on x86-64's total store order (stores become visible in program
order); other hosts keep MindSpore's reducer (mindgr.parallel.dp.reduce_mode). Ascend uses HCCL.
"""
from __future__ import annotations

import mmap
import os
import platform
import time

import numpy as np

_LINE = 64                                  # bytes: one counter per cache line, no false sharing


def supported() -> str | None:
    """None when this host can use the shared-memory sum, else why not (one line)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the shared-memory sum relies on x86-64 store ordering; this host is {platform.machine()}"
    if not os.path.isdir("/dev/shm"):
        return "the shared-memory sum needs /dev/shm"
    return None


def segment_path(token: int) -> str:
    return f"/dev/shm/mindgr-hostsum-{int(token):08x}"


class HostSum:
    """The shared-memory sum of one process (`rank` of `world`, every rank on this host) over vectors of
    `n` float32. Rank 0 creates the file (`create=True`) before the others open it; `unlink()` once every
    rank has opened it. `timeout` seconds without every rank arriving raises TimeoutError."""

    def __init__(self, path: str, rank: int, world: int, n: int, create: bool, timeout: float = 300.0):
        if not 0 <= rank < world:
            raise ValueError(f"HostSum: rank {rank} outside world {world}")
        self.path, self.rank, self.world, self.n, self.timeout = path, int(rank), int(world), int(n), float(timeout)
        head = self.world * _LINE
        size = head + 2 * self.world * self.n * 4
        if create:
            st = os.statvfs(os.path.dirname(path))
            if size > st.f_bavail * st.f_frsize:
                raise OSError(f"the shared-memory gradient sum needs {size / 2**20:.1f} MiB in "
                              f"{os.path.dirname(path)}, which has {st.f_bavail * st.f_frsize / 2**20:.1f} MiB free")
        flags = (os.O_CREAT | os.O_EXCL | os.O_RDWR) if create else os.O_RDWR
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    # reserve every page now: a full /dev/shm fails here, not later as SIGBUS mid-step
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    os.unlink(path)
                    raise OSError(f"the shared-memory gradient sum needs {size / 2**20:.1f} MiB in "
                                  f"{os.path.dirname(path)}: {e.strerror}") from None
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"HostSum: {path} holds {os.fstat(fd).st_size} bytes, expected {size} "
                                 "(the ranks disagree on the vector's length)")
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.counters = np.frombuffer(self._map, np.int64, count=head // 8)[:: _LINE // 8]
        self.slots = np.frombuffer(self._map, np.float32, count=2 * self.world * self.n,
                                   offset=head).reshape(2, self.world, self.n)
        self.step = 0

    def unlink(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def slot(self) -> np.ndarray:
        """Where this rank writes the vector of the next `sum()`: a float32 view of length n."""
        return self.slots[self.step % 2, self.rank]

    def sum(self) -> np.ndarray:
        """Every rank's vector of this step (written into `slot()`), added in rank order; a new array."""
        s = self.step
        self.step += 1
        self.counters[self.rank] = s + 1          # publish: this rank's slot of step s is written
        self._wait(s + 1)
        parts = self.slots[s % 2]
        out = parts[0].copy()
        for r in range(1, self.world):
            out += parts[r]
        return out

    def _wait(self, target: int):
        # Spin briefly (the peer is often microseconds away), then sleep in short naps: a spinning rank
        # would take CPU from the late peer, or from this rank's input thread, when they share a core.
        spins, deadline = 0, time.monotonic() + self.timeout
        while int(self.counters.min()) < target:
            spins += 1
            if spins < 200:
                continue
            time.sleep(2e-5)
            if spins % 1024 == 0 and time.monotonic() > deadline:
                late = [r for r in range(self.world) if int(self.counters[r]) < target]
                raise TimeoutError(f"host gradient sum: rank(s) {late} did not arrive within "
                                   f"{self.timeout:g} s at step {target - 1}")

    def close(self):
        self.counters = self.slots = None
        self._map.close()
