"""Background input producer: batch t+1 is packed and its negatives and masks drawn while step t runs.

A thread is enough: the compiled step releases the GIL while it runs, and the producer's numpy work is
short. Items are produced strictly in order, so a run is deterministic for a seed. An error in the
producer is raised in the consumer with the producer's traceback; close() (also on Ctrl-C or normal end)
stops the thread without hanging.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback


class ProducerError(RuntimeError):
    """The input producer raised; the message carries its traceback."""


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


_END = object()


class Prefetcher:
    """Iterate (item, make(item)) over `items`, computing up to `depth` results ahead in a thread.

    `wait_s` accumulates the time the consumer spent blocked waiting for input.
    """

    def __init__(self, items, make, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self.wait_s = 0.0
        self._thread = threading.Thread(target=self._run, args=(iter(items), make), daemon=True,
                                        name="mindgr-input")
        self._thread.start()

    def _put(self, value) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items, make):
        try:
            for item in items:
                if self._stop.is_set() or not self._put((item, make(item))):
                    return
            self._put(_END)
        except BaseException as e:  # surfaced in the consumer
            self._put(_Failure(e))

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        while True:
            try:
                value = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise ProducerError("input producer stopped without a result") from None
        self.wait_s += time.perf_counter() - t0
        if value is _END:
            raise StopIteration
        if isinstance(value, _Failure):
            raise ProducerError(f"input producer failed: {value.exc!r}\n{value.text}") from value.exc
        return value

    def close(self, timeout: float = 5.0):
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Inline:
    """The same interface without a thread (config data.prefetch=0): for comparison and debugging."""

    def __init__(self, items, make, depth: int = 0):
        self._items, self._make = iter(items), make
        self.wait_s = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._items)
        t0 = time.perf_counter()
        result = self._make(item)
        self.wait_s += time.perf_counter() - t0
        return item, result

    def close(self, timeout: float = 0.0):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
