"""ShardedTable: the item table's rows spread over a shard group, looked up by de-duplicated ids.

Row `i` belongs to shard `i % S` (S = ranks of the shard group: the node's local ranks for the
hierarchical layout, every rank for the flat one) at slot `i // S`. Round robin rather than contiguous
ranges because item ids are assigned by raw id, so popular items are spread evenly either way and
round robin keeps shard sizes within one row of each other for any catalogue.

A step: `lookup(ids)` sends each id to its owner (all_to_all_v over the shard group), the owner answers
with its rows; `push(grads)` sends the rows' gradients back along the same routes (no ids again: the
owner kept the requests) and the owner sums what its peers sent for each slot. The sums are added in
source-rank order, so they are deterministic.
"""
from __future__ import annotations

import numpy as np

from mindgr.parallel import comm
from mindgr.parallel.sparse.traffic import ID_BYTES, Traffic, row_bytes


class ShardedTable:
    def __init__(self, rows: np.ndarray, num_rows: int, shards: int, shard: int, group, members: list,
                 traffic: Traffic):
        self.rows = rows                             # [slots, D] float32, this shard's rows in id order
        self.num_rows, self.shards, self.shard = num_rows, shards, shard
        self.group = group                           # communication group of the shards (None = world)
        self.members = np.asarray(members, np.int64)  # world rank of each shard index
        self.traffic = traffic
        self.dim = rows.shape[1]
        self._route = None

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        return ids // self.shards

    def _exchange(self, x, counts):
        if self.shards == 1:
            return x, counts
        return comm.all_to_all_v(x, counts, self.group)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows of the distinct ids `ids` ([n] int), in the order of `ids`: [n, D] float32."""
        ids = np.asarray(ids, np.int64)
        owner = ids % self.shards
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.shards)
        asked, asked_counts = self._exchange(ids[order].astype(np.int32), counts)
        self.traffic.send(self.members, counts * ID_BYTES, "lookup_ids")
        answer = self.rows[self.slots_of(asked.astype(np.int64))]
        got, _ = self._exchange(answer, asked_counts)
        self.traffic.send(self.members, asked_counts * row_bytes(self.dim), "lookup_rows")
        out = np.empty((len(ids), self.dim), np.float32)
        out[order] = got
        self._route = (order, counts, asked.astype(np.int64), asked_counts)
        return out

    def push(self, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradients of the rows of the last lookup (same order) to their owners; returns this shard's
        (distinct slots, summed gradients) over the shard group."""
        order, counts, asked, _ = self._route
        self._route = None
        got, _ = self._exchange(np.ascontiguousarray(grads[order], np.float32), counts)
        self.traffic.send(self.members, counts * row_bytes(self.dim), "grads")
        return sum_by_slot(self.slots_of(asked), got)


def sum_by_slot(slots: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct slots (sorted) and the sum of the gradient rows of each, added in input order."""
    uniq, inverse = np.unique(slots, return_inverse=True)
    summed = np.zeros((len(uniq), grads.shape[1]), np.float32)
    np.add.at(summed, inverse, grads)
    return uniq, summed
