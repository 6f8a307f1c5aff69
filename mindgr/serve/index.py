"""Top-k over the item table: exact (one matmul, default) or a faiss IVF index for large catalogues.

Both take user vectors [n, D] and return, per user, (internal ids [k], scores [k]) best first, never
the padding id 0 and, when asked, none of the user's history items.
"""
from __future__ import annotations

import numpy as np


def _best_first(scores: np.ndarray, k: int):
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    order = np.lexsort((top, -scores[top]))        # higher score first, lower id on ties
    return top[order], scores[top[order]]


class ExactIndex:
    """Scores every item: the ranking `mindgr eval` measures."""
    name = "exact"

    def __init__(self, item_table: np.ndarray):
        self.table = np.ascontiguousarray(item_table, np.float32)   # [V+1, D], row 0 = padding

    def top_k(self, users: np.ndarray, ks, excludes) -> list:
        scores = users.astype(np.float32) @ self.table.T
        scores[:, 0] = -np.inf
        out = []
        for u, (k, ex) in enumerate(zip(ks, excludes)):
            row = scores[u]
            if ex is not None and len(ex):
                row[ex] = -np.inf
            out.append(_best_first(row, k))
        return out


class FaissIVFIndex:
    """Approximate inner-product search (faiss IndexIVFFlat): k-means cells, `nprobe` cells searched."""
    name = "faiss-ivf"

    def __init__(self, item_table: np.ndarray, nlist: int = 0, nprobe: int = 8, seed: int = 0):
        import faiss
        vectors = np.ascontiguousarray(item_table[1:], np.float32)
        n, d = vectors.shape
        self.nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39 or 1))  # faiss wants ~39 points a cell
        quantizer = faiss.IndexFlatIP(d)
        self.index = faiss.IndexIVFFlat(quantizer, d, self.nlist, faiss.METRIC_INNER_PRODUCT)
        self.index.cp.seed = seed
        self.index.train(vectors)
        self.index.add(vectors)
        self.index.nprobe = self.nprobe = min(nprobe, self.nlist)
        self._quantizer = quantizer  # faiss does not own it: keep it alive

    def top_k(self, users: np.ndarray, ks, excludes) -> list:
        # Ask for k plus the history length, then drop history items (faiss has no per-query filter here).
        want = max(k + (len(ex) if ex is not None else 0) for k, ex in zip(ks, excludes))
        want = min(want, self.index.ntotal)
        scores, ids = self.index.search(np.ascontiguousarray(users, np.float32), want)
        out = []
        for u, (k, ex) in enumerate(zip(ks, excludes)):
            found = ids[u] >= 0
            item, score = ids[u][found] + 1, scores[u][found]
            if ex is not None and len(ex):
                keep = ~np.isin(item, ex)
                item, score = item[keep], score[keep]
            out.append((item[:k].astype(np.int64), score[:k]))
        return out


def build_index(kind: str, item_table: np.ndarray, **options):
    if kind == "exact":
        return ExactIndex(item_table)
    if kind == "faiss-ivf":
        return FaissIVFIndex(item_table, **options)
    raise ValueError(f"index: {kind!r} (expected exact or faiss-ivf)")


def recall_at_k(approx: list, exact: list) -> float:
    """Mean over users of |approx top-k ∩ exact top-k| / k."""
    if not exact:
        return float("nan")
    return float(np.mean([len(np.intersect1d(a[0], e[0])) / max(len(e[0]), 1) for a, e in zip(approx, exact)]))
