"""A modelled inter-node link for the cross-node exchange (parallel.link_latency_ms, parallel.link_gbps).

On CPU the "nodes" are process groups on one machine: the cross-node exchange costs what the emulated
collectives cost on the host, nothing like a real link. With the model on, every exchange also takes

    seconds = messages x link_latency_ms / 1e3 + inter_bytes x local_ranks / (link_gbps x 1e9)

where messages and inter_bytes are what this rank sent across nodes in that exchange (the Traffic
counters, one message per cross-node destination of each phase) and the node's bandwidth (GB/s, as
parallel.inter_gbps) is shared equally by its local_ranks ranks, whose exchanges run at the same time.
The link is serial: an exchange's link time starts when its collectives are done and the previous
exchange has left the link. BoundedStaleness applies a gradient no earlier than its arrival, so the time
is inside the step at staleness 0 and overlaps the following steps' work at staleness >= 1. Off (both 0)
by default and on a real link (HCCL).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkModel:
    latency_ms: float = 0.0                 # per cross-node message
    gbps: float = 0.0                       # GB/s leaving a node; 0 = no bandwidth term
    local_ranks: int = 1                    # ranks sharing a node's link

    @property
    def on(self) -> bool:
        return self.latency_ms > 0 or self.gbps > 0

    def seconds(self, inter_bytes: int, messages: int) -> float:
        """The link time of one rank's exchange that sent `inter_bytes` in `messages` across nodes."""
        s = messages * self.latency_ms / 1e3
        if self.gbps > 0:
            s += inter_bytes * self.local_ranks / (self.gbps * 1e9)
        return float(s)


class MeasuredExchange:
    """Runs an exchange and returns its result with the link time of what it sent (Traffic deltas)."""

    def __init__(self, model: LinkModel, traffic):
        self.model, self.traffic = model, traffic

    def __call__(self, exchange, slots, grads):
        t = self.traffic
        b0, m0 = t.step_inter, t.step_inter_messages
        out = exchange(slots, grads)
        return out, self.model.seconds(t.step_inter - b0, t.step_inter_messages - m0)
