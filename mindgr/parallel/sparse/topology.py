"""Who shares a node group: `nodes x local_ranks` ranks, rank r = node * local_ranks + local.

The item table is sharded row-wise over the `local_ranks` ranks of a node group (the intra group) and
replicated across node groups; the ranks holding the same shard on every node form an inter group.
On CPU the node groups are process groups on one machine (config `parallel.nodes`); on a real cluster
`parallel.nodes = 0` takes the nodes from the job (ranks grouped by host name).
"""
from __future__ import annotations

import socket
import zlib
from dataclasses import dataclass

import numpy as np

from mindgr.config import ConfigError


@dataclass(frozen=True)
class Topology:
    nodes: int
    local_ranks: int
    rank: int

    @property
    def world(self) -> int:
        return self.nodes * self.local_ranks

    @property
    def node(self) -> int:
        return self.rank // self.local_ranks

    @property
    def local(self) -> int:
        return self.rank % self.local_ranks

    def node_of(self, rank) -> np.ndarray:
        return np.asarray(rank) // self.local_ranks

    @property
    def intra_ranks(self) -> list[int]:
        """World ranks of this rank's node group, in local order."""
        return [self.node * self.local_ranks + i for i in range(self.local_ranks)]

    @property
    def inter_ranks(self) -> list[int]:
        """World ranks holding the same shard as this rank, one per node, in node order."""
        return [n * self.local_ranks + self.local for n in range(self.nodes)]


def resolve(nodes: int, local_ranks: int, world: int, rank: int, hosts=None) -> Topology:
    """The topology from the config (0 = not set) and the job: `hosts` (one name per rank) gives the
    nodes when parallel.nodes is 0."""
    if nodes == 0 and local_ranks == 0:
        nodes = len(set(hosts)) if hosts is not None else 1
    if nodes == 0:
        nodes = world // local_ranks if local_ranks and world % local_ranks == 0 else 0
    if local_ranks == 0 and nodes and world % nodes == 0:
        local_ranks = world // nodes
    if nodes * local_ranks != world:
        raise ConfigError(f"config: parallel.nodes x parallel.local_ranks = {nodes} x {local_ranks} does not "
                          f"match the {world} ranks of the job")
    return Topology(nodes, local_ranks, rank)


def host_names(world: int) -> list[int]:
    """A crc32 of every rank's host name (all-gathered): ranks on one machine share a node."""
    from mindgr.parallel import comm
    mine = np.array([zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF], np.int64)
    return comm.all_gather(mine).tolist()


class Groups:
    """Communication groups of a topology; None stands for the world (mccl's AllGather wants it); a group
    of one rank is never created (its callers skip the collective)."""

    def __init__(self, topo: Topology):
        from mindgr.parallel import comm
        self.topo = topo
        self.intra = self._make(comm, f"mindgr_intra_{topo.node}", topo.intra_ranks)
        self.inter = self._make(comm, f"mindgr_inter_{topo.local}", topo.inter_ranks)

    @staticmethod
    def _make(comm, name, ranks):
        if len(ranks) == 1:
            return name                                    # never used in a collective
        if len(ranks) == comm.size():
            return None
        return comm.new_group(name, ranks)
