"""Dynamic batching: concurrent requests -> a few fixed batch shapes, one worker thread, a bounded queue.

The worker takes the oldest request, then waits at most `max_wait_ms` for more (up to the largest
shape's rows), runs the smallest compiled shape that holds them, and answers each request's future.
Every MindSpore call (the start-up compile of each shape included) runs on that one thread, unless the
recommender asks for more workers (`recommender.workers`, the GR path's overlap): then that many worker
threads each gather and run their own batch, and the recommender routes its MindSpore calls to one
model thread of its own (mindgr.serve.generative.ModelThread).

A full queue refuses at once (Overloaded -> HTTP 503) rather than growing latency without bound.
close() stops taking requests, answers everything already queued, then stops the worker (drain).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future


class Overloaded(RuntimeError):
    """The queue is full (HTTP 503)."""


class ShuttingDown(RuntimeError):
    """The server is draining and takes no new requests (HTTP 503)."""


class DynamicBatcher:
    def __init__(self, recommender, metrics, queue_size: int = 256, max_wait_ms: float = 2.0,
                 test_delay_ms: float = 0.0):
        """test_delay_ms: extra time per batch, only for tests of overload and drain (keeps requests in flight)."""
        if queue_size < 1:
            raise ValueError(f"queue size: {queue_size} (expected >= 1)")
        if max_wait_ms < 0:
            raise ValueError(f"max wait: {max_wait_ms} ms (expected >= 0)")
        self.recommender, self.metrics = recommender, metrics
        self.max_wait = max_wait_ms / 1e3
        self.test_delay = test_delay_ms / 1e3
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()       # closing and put() are atomic together: nothing lands after close
        self._closing = False
        self._ready = threading.Event()
        self._start_error = None
        self.workers = int(getattr(recommender, "workers", 1))
        self._threads = [threading.Thread(target=self._main, args=(i,), name=f"mindgr-batcher-{i}", daemon=True)
                         for i in range(self.workers)]
        metrics.attach_queue(self._queue.qsize)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def start(self):
        """Start the worker; returns once every batch shape is compiled."""
        self._threads[0].start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        for t in self._threads[1:]:
            t.start()

    def submit(self, query) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closing:
                raise ShuttingDown("server is shutting down")
            try:
                self._queue.put_nowait((query, fut))
            except queue.Full:
                raise Overloaded(f"queue full ({self._queue.maxsize} requests waiting)") from None
        self.metrics.record_queue_depth(self._queue.qsize())
        return fut

    def close(self, timeout: float | None = None):
        """Refuse new requests, answer the queued ones, stop the worker."""
        with self._lock:
            self._closing = True
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)

    def _main(self, worker: int = 0):
        if worker == 0:
            try:
                self.recommender.warm_up()
            except BaseException as e:  # reported by start(), in the thread that called it
                self._start_error = e
                self._ready.set()
                return
            self._ready.set()
        while True:
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._closing:
                    return  # closed and nothing left: drained
                continue
            self._run(self._gather(first))

    def _gather(self, first) -> list:
        batch = [first]
        deadline = time.monotonic() + self.max_wait
        while len(batch) < self.recommender.max_rows:
            remaining = deadline - time.monotonic()
            try:  # past the deadline, still take what is already queued
                batch.append(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self, batch):
        live = [(q, f) for q, f in batch if f.set_running_or_notify_cancel()]  # drop requests given up on
        if not live:
            return
        t0 = time.perf_counter()
        try:
            rows = self.recommender.shape_for(len(live))
            results = self.recommender.recommend([q for q, _ in live], rows)
            if self.test_delay:
                time.sleep(self.test_delay)
        except Exception as e:  # answer every request of the batch (HTTP 500); the worker keeps going
            for _, f in live:
                f.set_exception(e)
            return
        self.metrics.record_batch(len(live), rows, time.perf_counter() - t0)
        for (_, f), result in zip(live, results):
            f.set_result(result)
