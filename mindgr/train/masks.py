"""Host-drawn dropout masks that any subset of token rows can be drawn from alone.

The masks of batch (epoch, batch) are keep-masks scaled by 1/(1-p), shape [sites, capacity, width]. Each
(site, token) row owns a fixed stretch of 64-bit words of the batch's PCG64 stream (four 16-bit units per
word; a unit is kept when its value >= p * 65536), so a rank of a multi-process job draws only the rows
of its own tokens of the global batch (PCG64.advance jumps to them): O(own tokens) host work, and the
same masks a single process draws for those tokens.
"""
from __future__ import annotations

import numpy as np


class DropoutMasks:
    def __init__(self, seed: int, p: float, shape: tuple[int, int, int]):
        self.seed, self.p = seed, float(p)
        self.sites, self.capacity, self.width = (int(d) for d in shape)
        self.words = -(-self.width // 4)                  # 64-bit words per (site, token) row
        self.threshold = np.uint16(min(round(self.p * 65536), 65535))
        self.scale = np.float32(1.0 / (1.0 - self.p))
        self._ones = None                                 # p = 0: one all-ones array, reused


    def _generator(self, epoch: int, batch: int) -> np.random.PCG64:
        return np.random.PCG64(np.random.SeedSequence([self.seed, epoch, batch, 8]))

    def _keep(self, raw: np.ndarray, rows: int, out: np.ndarray):
        """uint64 words of `rows` consecutive rows -> scaled keep-masks [rows, width] written to `out`."""
        units = raw.view(np.uint16).reshape(rows, 4 * self.words)[:, : self.width]
        np.multiply(units >= self.threshold, self.scale, out=out)

    def batch(self, epoch: int, batch: int) -> np.ndarray:
        """Every row of the batch: [sites, capacity, width]."""
        if self.p == 0:
            if self._ones is None:
                self._ones = np.ones((self.sites, self.capacity, self.width), np.float32)
            return self._ones
        out = np.empty((self.sites, self.capacity, self.width), np.float32)
        raw = self._generator(epoch, batch).random_raw(self.sites * self.capacity * self.words)
        for s in range(self.sites):
            span = self.capacity * self.words
            self._keep(raw[s * span: (s + 1) * span], self.capacity, out[s])
        return out

    def rows(self, epoch: int, batch: int, positions: np.ndarray, capacity: int) -> np.ndarray:
        """The rows of the given token positions of the batch, in that order, padded with 1.0 (keep,
        unscaled) to `capacity` rows: [sites, capacity, width]. Runs of consecutive positions are drawn
        in one piece."""
        positions = np.asarray(positions, np.int64)
        out = np.ones((self.sites, capacity, self.width), np.float32)
        if self.p == 0 or len(positions) == 0:
            return out
        if len(positions) > capacity or positions.min() < 0 or positions.max() >= self.capacity:
            raise ValueError(f"DropoutMasks.rows: {len(positions)} positions in [{positions.min()}, "
                             f"{positions.max()}] do not fit capacity {capacity} / batch rows {self.capacity}")
        starts = np.concatenate([[0], np.flatnonzero(np.diff(positions) != 1) + 1])
        ends = np.concatenate([starts[1:], [len(positions)]])
        gen, at = self._generator(epoch, batch), 0                  # `at`: words drawn so far
        state0 = gen.state
        for s in range(self.sites):
            for a, b in zip(starts.tolist(), ends.tolist()):
                first = (s * self.capacity + int(positions[a])) * self.words
                if first < at:                                      # runs out of order: start over
                    gen.state, at = state0, 0
                gen.advance(first - at)
                n = b - a
                self._keep(gen.random_raw(n * self.words), n, out[s, a:b])
                at = first + n * self.words
        return out
