"""The retrieval serving model: raw item ids -> the user encoder at a few fixed batch shapes -> top-k over
the item table (exact, or a faiss IVF index), best first.

A history is encoded from its last max_len items (as in training and `mindgr eval`); the whole history is
what exclude_history removes, as eval does. The encoder is the exported MindIR graphs of each batch shape
(`Recommender.from_export`, what `mindgr serve` runs) or a loaded run's EncodeLast (`from_run`: the export
round-trip test and `mindgr bench serve --index-recall`).
"""
from __future__ import annotations

import numpy as np

from mindgr.serve.requests import DEFAULT_MAX_HISTORY, Catalogue, Query, ServingModel, parse_query

DEFAULT_SHAPES = (1, 4, 16, 64)   # rows per compiled batch; tokens = rows * max_len


def pack(queries, rows: int, tokens: int, max_len: int) -> dict:
    """The encoder's fixed-shape inputs for up to `rows` queries (last max_len items of each), with
    request_times [rows] (Query.when(); 0 for unused rows)."""
    if len(queries) > rows:
        raise ValueError(f"{len(queries)} queries for a batch of {rows} rows")
    ids = np.zeros(tokens, np.int32)
    positions = np.zeros(tokens, np.int32)
    times = np.zeros(tokens, np.int64)
    offsets = np.zeros(rows + 1, np.int32)
    request_times = np.zeros(rows, np.int64)
    at = 0
    for r, q in enumerate(queries):
        n = min(len(q.items), max_len)
        if at + n > tokens:
            raise ValueError(f"{at + n} tokens exceed the batch's {tokens}")
        ids[at:at + n] = q.items[-n:]
        times[at:at + n] = q.times[-n:]
        positions[at:at + n] = np.arange(n)
        request_times[r] = q.when()
        at += n
        offsets[r + 1] = at
    offsets[len(queries) + 1:] = at  # unused rows are empty
    return {"ids": ids, "positions": positions, "offsets": offsets, "timestamps": times,
            "request_times": request_times}


class Recommender(ServingModel):
    """A user encoder at a few fixed batch shapes plus its item table and an index."""

    def __init__(self, encode_last, item_table: np.ndarray, catalogue: Catalogue, max_len: int,
                 shapes=DEFAULT_SHAPES, time_unit: str = "s", index=None, max_history: int = DEFAULT_MAX_HISTORY):
        from mindgr.serve.index import ExactIndex
        self.encode_last, self.catalogue, self.max_len = encode_last, catalogue, max_len
        self.item_table = np.ascontiguousarray(item_table, np.float32)
        self.shapes = sorted({int(r) for r in shapes})
        if not self.shapes or self.shapes[0] < 1:
            raise ValueError(f"batch shapes: {shapes!r} (expected positive row counts)")
        self.time_unit, self.max_history = time_unit, max_history
        self.index = index if index is not None else ExactIndex(self.item_table)

    @classmethod
    def from_run(cls, loaded, shapes=DEFAULT_SHAPES, index: str = "exact", max_history=DEFAULT_MAX_HISTORY,
                 **index_options):
        """A loaded run (mindgr.train.saved_run.LoadedRun): its EncodeLast cell, compiled here."""
        from mindgr.serve.index import build_index
        table = loaded.model.item_table()
        return cls(loaded.model.encode_last, table, Catalogue(loaded.data.store.item_raw_ids),
                   loaded.cfg.data.max_len, shapes, loaded.data.store.time_unit,
                   build_index(index, table, **index_options), max_history)

    @classmethod
    def from_export(cls, export_dir, manifest: dict, shapes=None, index: str = "exact",
                    max_history=DEFAULT_MAX_HISTORY, **index_options):
        """An export directory (mindgr.serve.export; manifest already read and checked): the MindIR
        encoders of `shapes` (default: every exported shape; a shape not exported is an ExportError)."""
        from mindgr.serve.exported import load_export
        from mindgr.serve.index import build_index
        _, encoder, table, raw_ids = load_export(export_dir, manifest, rows=shapes)
        return cls(encoder, table, Catalogue(raw_ids), int(manifest["max_len"]), sorted(encoder.graphs),
                   (manifest.get("data") or {}).get("time_unit") or "s",
                   build_index(index, table, **index_options), max_history)

    def tokens(self, rows: int) -> int:
        return rows * self.max_len

    def parse(self, history, timestamps=None, request_time=None, k=10, exclude_history=True) -> Query:
        return parse_query(self.catalogue, history, timestamps, request_time, k, exclude_history,
                           self.max_history, self.time_unit)

    def warm_up(self):
        """Compile the encoder once per batch shape (graph mode compiles on first call of each shape)."""
        q = Query(np.ones(1, np.int32), np.zeros(1, np.int64), 1, False)
        for rows in self.shapes:
            self.encode([q], rows)

    def encode(self, queries, rows: int | None = None) -> np.ndarray:
        """User vectors [len(queries), D] at the batch shape for `rows` rows."""
        from mindspore import Tensor
        rows = rows or self.shape_for(len(queries))
        a = pack(queries, rows, self.tokens(rows), self.max_len)
        out = self.encode_last(Tensor(a["ids"]), Tensor(a["positions"]), Tensor(a["offsets"]),
                               Tensor(a["timestamps"]), Tensor(a["request_times"])).asnumpy()
        return out[: len(queries)]

    def recommend(self, queries, rows: int | None = None) -> list:
        """[(internal item ids [k], scores [k])] per query, best first."""
        users = self.encode(queries, rows)
        return self.index.top_k(users, [q.k for q in queries],
                                [q.items if q.exclude_history else None for q in queries])
