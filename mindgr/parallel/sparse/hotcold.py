"""Row ownership of the frequency layout (docs/sparse.md): which rank holds a hot or a cold row, and where
in its table. Used by the plan (layout), the table (HotColdTable) and the traffic model alike."""
from __future__ import annotations

import numpy as np


class HotCold:
    """Row ownership of the frequency layout. Hot row at frequency rank p (position in `hot`): owner local
    rank p % L of every node group, hot slot p // L. Cold row at position q of the remaining ids (id order):
    owner world rank q % W, cold slot q // W. A rank's table holds its hot rows first, then its cold ones."""

    def __init__(self, hot: np.ndarray, num_rows: int, nodes: int, local_ranks: int):
        self.hot = np.asarray(hot, np.int64)
        self.num_rows, self.nodes, self.local_ranks = num_rows, nodes, local_ranks
        self.world = nodes * local_ranks
        if len(np.unique(self.hot)) != len(self.hot) or (len(self.hot) and
                                                         (self.hot.min() < 0 or self.hot.max() >= num_rows)):
            raise ValueError(f"hot rows must be distinct ids in [0, {num_rows})")
        self.is_hot = np.zeros(num_rows, bool)
        self.is_hot[self.hot] = True
        self.cold = np.flatnonzero(~self.is_hot)
        self.pos = np.empty(num_rows, np.int64)
        self.pos[self.hot] = np.arange(len(self.hot))
        self.pos[self.cold] = np.arange(len(self.cold))

    def hot_ids(self, local: int) -> np.ndarray:
        return self.hot[local::self.local_ranks]

    def cold_ids(self, rank: int) -> np.ndarray:
        return self.cold[rank::self.world]

    def rank_ids(self, rank: int) -> np.ndarray:
        """Ids of the rows `rank` holds, in its table's order (hot, then cold)."""
        return np.concatenate([self.hot_ids(rank % self.local_ranks), self.cold_ids(rank)])
