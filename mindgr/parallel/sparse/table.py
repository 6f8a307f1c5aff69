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


class HotColdTable:
    """The frequency layout's table (mindgr.parallel.sparse.layout.HotCold): this rank's hot rows (replicas
    of its node group's hot shard) followed by its cold rows (its flat shard of the rest).

    lookup(ids), one all_to_all_v inside the node: every id goes to a local rank of its own node, the hot
    row's owner or, for a cold row, the gateway with the owner's local index. Stage 2 (cold only): each
    gateway de-duplicates the cold ids its node asked for and sends them to their owners (the ranks with
    its local index on other nodes: the inter group), which answer with the rows. push(grads) follows the
    same routes backwards (no ids again); the gateway sums its node's gradients of each cold row before
    they cross, so a cold row's gradient crosses nodes at most once per node, and the owner's sum is the
    sum over the job (nothing left to exchange). Hot sums cover this node only: exchange_hot finishes
    them across nodes. Sums are added in source order: deterministic.
    """

    def __init__(self, rows: np.ndarray, plan, rank: int, intra, intra_members: list, inter,
                 inter_members: list, traffic: Traffic):
        self.rows = rows
        self.plan, self.rank = plan, rank
        self.ids = plan.rank_ids(rank)               # row id of every local row
        self.hot_slots = len(plan.hot_ids(rank % plan.local_ranks))
        self.intra, self.intra_members = intra, np.asarray(intra_members, np.int64)
        self.inter, self.inter_members = inter, np.asarray(inter_members, np.int64)
        self.traffic = traffic
        self.dim = rows.shape[1]
        self.num_rows = plan.num_rows
        self._route = None

    @staticmethod
    def _a2a(x, counts, group, members):
        if len(members) == 1:
            return x, counts
        return comm.all_to_all_v(x, counts, group)

    def _local_slot(self, ids: np.ndarray) -> np.ndarray:
        """Slot in this rank's rows of ids it holds (hot rows of its local index, cold rows of its rank)."""
        p = self.plan
        pos = p.pos[ids]
        return np.where(p.is_hot[ids], pos // p.local_ranks, self.hot_slots + pos // p.world)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        p, L, W = self.plan, self.plan.local_ranks, self.plan.world
        rb = row_bytes(self.dim)
        ids = np.asarray(ids, np.int64)
        pos = p.pos[ids]
        dest = np.where(p.is_hot[ids], pos % L, (pos % W) % L)       # hot owner or cold gateway, local index
        order = np.argsort(dest, kind="stable")
        counts = np.bincount(dest, minlength=L)
        asked, asked_counts = self._a2a(ids[order].astype(np.int32), counts, self.intra, self.intra_members)
        self.traffic.send(self.intra_members, counts * ID_BYTES, "lookup_ids")
        asked = asked.astype(np.int64)
        answer = np.empty((len(asked), self.dim), np.float32)
        hot = p.is_hot[asked]
        answer[hot] = self.rows[self._local_slot(asked[hot])]
        # stage 2: the node's distinct cold ids of this gateway to their owners on the other nodes
        cold, inverse = np.unique(asked[~hot], return_inverse=True)
        node = (p.pos[cold] % W) // L
        order2 = np.argsort(node, kind="stable")
        counts2 = np.bincount(node, minlength=p.nodes)
        asked2, asked2_counts = self._a2a(cold[order2].astype(np.int32), counts2, self.inter, self.inter_members)
        self.traffic.send(self.inter_members, counts2 * ID_BYTES, "cold_ids")
        asked2 = asked2.astype(np.int64)
        got2, _ = self._a2a(self.rows[self._local_slot(asked2)], asked2_counts, self.inter, self.inter_members)
        self.traffic.send(self.inter_members, asked2_counts * rb, "cold_rows")
        fetched = np.empty((len(cold), self.dim), np.float32)
        fetched[order2] = got2
        answer[~hot] = fetched[inverse]
        got, _ = self._a2a(answer, asked_counts, self.intra, self.intra_members)
        self.traffic.send(self.intra_members, asked_counts * rb, "lookup_rows")
        out = np.empty((len(ids), self.dim), np.float32)
        out[order] = got
        self._route = (order, counts, asked, hot, inverse, len(cold), order2, counts2, asked2)
        return out

    def push(self, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradients of the last lookup's rows (same order) to their owners: this rank's (distinct slots,
        sums), hot slots (< hot_slots) summed over its node, cold slots over the job."""
        order, counts, asked, hot, inverse, n_cold, order2, counts2, asked2 = self._route
        self._route = None
        rb = row_bytes(self.dim)
        got, _ = self._a2a(np.ascontiguousarray(grads[order], np.float32), counts, self.intra, self.intra_members)
        self.traffic.send(self.intra_members, counts * rb, "grads")
        hot_slots, hot_sums = sum_by_slot(self._local_slot(asked[hot]), got[hot])
        node_sum = np.zeros((n_cold, self.dim), np.float32)       # the node's gradient of each cold row
        np.add.at(node_sum, inverse, got[~hot])
        got2, _ = self._a2a(np.ascontiguousarray(node_sum[order2]), counts2, self.inter, self.inter_members)
        self.traffic.send(self.inter_members, counts2 * rb, "cold_grads")
        cold_slots, cold_sums = sum_by_slot(self._local_slot(asked2), got2)
        return np.concatenate([hot_slots, cold_slots]), np.concatenate([hot_sums, cold_sums])

    def assemble(self, node: int) -> np.ndarray:
        """The whole table on every rank (a world all_gather): node group 0 contributes the hot rows."""
        keep = slice(None) if node == 0 else slice(self.hot_slots, None)
        if self.plan.world == 1:
            full = np.empty((self.num_rows, self.dim), np.float32)
            full[self.ids] = self.rows
            return full
        ids = comm.all_gather(self.ids[keep].astype(np.int64))
        rows = comm.all_gather(np.ascontiguousarray(self.rows[keep]))
        full = np.empty((self.num_rows, self.dim), np.float32)
        full[ids] = rows
        return full
