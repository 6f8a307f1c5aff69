"""What every served model shares: a request validated into a Query of internal ids, the Catalogue of raw
ids, the one-line RequestError (an HTTP 4xx) and ServingModel, the interface the batcher and the HTTP app
call (mindgr.serve.retrieval and mindgr.serve.generative implement it).

Requests carry the data's raw item ids (e.g. MovieLens movie ids); the store numbers items 1..V (0 is
padding), and the Catalogue maps between the two.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_HISTORY = 4096        # longer requests are refused (only the last max_len are encoded anyway)


class RequestError(ValueError):
    """A request the server refuses, with a one-line reason (an HTTP 4xx)."""

    def __init__(self, reason: str, status: int = 422):
        super().__init__(reason)
        self.status = status


@dataclass
class Query:
    """One validated request in internal ids."""
    items: np.ndarray      # int32 [L], 1..V, the whole history
    times: np.ndarray      # int64 [L], seconds (zeros when the request had none)
    k: int
    exclude_history: bool
    # seconds: when the recommendation is requested (the last position's query time in a model trained
    # with model.request_time); None = the last history timestamp (0 without timestamps)
    request_time: int | None = None

    def when(self) -> int:
        """The request time the encoder gets."""
        if self.request_time is not None:
            return int(self.request_time)
        return int(self.times[-1]) if len(self.times) else 0


class Catalogue:
    """Raw item ids <-> the store's internal ids 1..V."""

    def __init__(self, item_raw_ids: np.ndarray):
        self.raw = np.asarray(item_raw_ids, np.int64)          # [V+1], raw[0] = -1 (padding)
        self.num_items = len(self.raw) - 1
        order = np.argsort(self.raw[1:], kind="stable")
        self._sorted_raw, self._sorted_internal = self.raw[1:][order], (order + 1).astype(np.int32)

    def to_internal(self, raw_ids) -> np.ndarray:
        """Internal ids of raw ids; a RequestError names the first unknown one."""
        try:
            raw = np.asarray(raw_ids, np.int64).reshape(-1)
        except OverflowError:
            raise RequestError("history: an item id does not fit in 64 bits") from None
        pos = np.minimum(np.searchsorted(self._sorted_raw, raw), self.num_items - 1)
        known = self._sorted_raw[pos] == raw
        if not known.all():
            bad = int(np.flatnonzero(~known)[0])
            raise RequestError(f"history[{bad}]: unknown item id {int(raw[bad])}")
        return self._sorted_internal[pos]

    def to_raw(self, internal_ids) -> np.ndarray:
        return self.raw[np.asarray(internal_ids, np.int64)]


def parse_query(cat: Catalogue, history, timestamps=None, request_time=None, k: int = 10,
                exclude_history: bool = True, max_history: int = DEFAULT_MAX_HISTORY,
                time_unit: str = "s") -> Query:
    """A Query from request fields (raw ids, times in the data's unit); RequestError on anything wrong.

    request_time (not before the last timestamp; default: the last timestamp) is when the recommendation
    is requested. A run trained with model.request_time (HSTU / FuXi-alpha with the time bias) ranks with
    it: the last position's time bias is bucket(request_time - t_j), as training used the target's time
    and `mindgr eval` the held-out target's. Other runs ignore it (their last position uses its own time)."""
    if history is None or len(history) == 0:
        raise RequestError("history: empty (give at least one item id)")
    if len(history) > max_history:
        raise RequestError(f"history: {len(history)} items, more than the limit {max_history}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= cat.num_items:
        raise RequestError(f"k: {k!r} (expected an integer in 1..{cat.num_items})")
    items = cat.to_internal(history)
    if timestamps is None:
        times = np.zeros(len(items), np.int64)
        if request_time is not None:
            raise RequestError("request_time: given without timestamps")
    else:
        if len(timestamps) != len(history):
            raise RequestError(f"timestamps: {len(timestamps)} values for {len(history)} history items")
        try:
            times = np.asarray(timestamps, np.int64)
        except OverflowError:
            raise RequestError("timestamps: a value does not fit in 64 bits") from None
        if (times < 0).any():
            raise RequestError(f"timestamps[{int(np.flatnonzero(times < 0)[0])}]: negative")
        if (np.diff(times) < 0).any():
            raise RequestError(f"timestamps[{int(np.flatnonzero(np.diff(times) < 0)[0]) + 1}]: earlier than "
                               "the item before it (histories are chronological)")
        if request_time is not None and request_time < int(times[-1]):
            raise RequestError(f"request_time: {request_time} is before the last timestamp {int(times[-1])}")
        if request_time is not None:
            try:
                request_time = int(np.int64(request_time))
            except OverflowError:
                raise RequestError("request_time: does not fit in 64 bits") from None
        if time_unit == "ms":  # HSTU's time buckets are defined on seconds (as mindgr.train.data does)
            times = times // 1000
            request_time = None if request_time is None else request_time // 1000
    if exclude_history and k > cat.num_items - len(np.unique(items)):
        raise RequestError(f"k: {k} is more than the {cat.num_items - len(np.unique(items))} items left "
                           "after excluding the history")
    return Query(items.astype(np.int32), times, int(k), bool(exclude_history), request_time)


class ServingModel:
    """What the batcher and the HTTP app need of a served model besides `recommend(queries, rows)`:
    `shapes` (the fixed batch sizes), `catalogue` (raw <-> internal ids)."""

    @property
    def max_rows(self) -> int:
        return self.shapes[-1]

    def shape_for(self, n: int) -> int:
        """The smallest fixed batch shape that holds n queries."""
        for rows in self.shapes:
            if rows >= n:
                return rows
        raise ValueError(f"{n} queries exceed the largest batch shape {self.shapes[-1]}")

    def recommend_many(self, queries) -> list:
        """Any number of queries, in chunks of the largest shape (the command line path)."""
        out = []
        for start in range(0, len(queries), self.max_rows):
            out.extend(self.recommend(queries[start:start + self.max_rows]))
        return out

    def check_complete(self, query: Query, ids) -> None:
        """RequestError (422) when the model found fewer than query.k items: the same rule for every kind
        of served model, so that an answer always holds exactly k items."""
        if len(ids) < query.k:
            raise RequestError(self.short_reason(query, len(ids)))

    def short_reason(self, query: Query, found: int) -> str:
        return f"k: {query.k} asked, only {found} items can be recommended for this history"

    def to_response(self, ids: np.ndarray, scores: np.ndarray) -> dict:
        return {"items": [int(x) for x in self.catalogue.to_raw(ids)], "scores": [float(s) for s in scores]}
