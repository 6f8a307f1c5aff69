"""Server metrics for GET /metrics: request counts by status, latency percentiles, batch sizes, queue depth.

Thread-safe: the HTTP handlers record requests, the batcher's worker thread records batches.
Latency percentiles are over the most recent `window` requests (a bounded memory, whatever the uptime).
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque

import numpy as np


class ServerMetrics:
    def __init__(self, window: int = 20000):
        self._lock = threading.Lock()
        self.started = time.time()
        self.by_status = Counter()
        self.latencies = deque(maxlen=window)          # seconds, /recommend requests answered 200
        self.batch_sizes = Counter()                    # requests in a batch -> batches
        self.batch_shapes = Counter()                   # compiled rows used -> batches
        self.shape_seconds = Counter()                  # compiled rows -> seconds of encode + top-k
        self.queue_depth_max = 0
        self.decode_seconds = Counter()                 # GR: seconds by part (prefill, model, masks, select, total)
        self.decode_batches = 0
        self._queue_depth = lambda: 0

    def attach_queue(self, depth_fn):
        self._queue_depth = depth_fn

    def record_request(self, status: int, seconds: float, recommend: bool):
        with self._lock:
            self.by_status[int(status)] += 1
            if recommend and status == 200:
                self.latencies.append(seconds)

    def record_batch(self, size: int, rows: int, seconds: float):
        with self._lock:
            self.batch_sizes[int(size)] += 1
            self.batch_shapes[int(rows)] += 1
            self.shape_seconds[int(rows)] += seconds

    def record_decode(self, split: dict):
        """One GR batch's search time by part (DecodingEngine.timings plus the total)."""
        with self._lock:
            self.decode_batches += 1
            for key, sec in split.items():
                self.decode_seconds[key] += sec

    def record_queue_depth(self, depth: int):
        with self._lock:
            self.queue_depth_max = max(self.queue_depth_max, int(depth))

    def snapshot(self) -> dict:
        with self._lock:
            lat = np.array(self.latencies, np.float64)
            batches = sum(self.batch_sizes.values())
            answered = sum(k * v for k, v in self.batch_sizes.items())
            pct = {f"p{p}": (float(np.percentile(lat, p)) * 1e3 if len(lat) else None) for p in (50, 90, 99)}
            return {
                "uptime_s": round(time.time() - self.started, 3),
                "requests": {"total": sum(self.by_status.values()),
                             "by_status": {str(k): v for k, v in sorted(self.by_status.items())}},
                "latency_ms": dict(pct, count=int(len(lat)), window=self.latencies.maxlen,
                                   mean=float(lat.mean()) * 1e3 if len(lat) else None),
                "batches": {"count": batches, "mean_size": answered / batches if batches else None,
                            "size_histogram": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                            "shape_histogram": {str(k): v for k, v in sorted(self.batch_shapes.items())},
                            "compute_ms_per_batch": {str(k): 1e3 * v / self.batch_shapes[k]
                                                     for k, v in sorted(self.shape_seconds.items())},
                            "compute_s": round(sum(self.shape_seconds.values()), 4)},
                "queue": {"depth": int(self._queue_depth()), "max_depth": self.queue_depth_max},
                **({"decode": {"batches": self.decode_batches,
                               "ms_per_batch": {k: 1e3 * v / self.decode_batches
                                                for k, v in sorted(self.decode_seconds.items())}}}
                   if self.decode_batches else {}),
            }
