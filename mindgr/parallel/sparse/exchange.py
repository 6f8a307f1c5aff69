"""The cross-node exchange of embedding gradients, synchronous or semi-asynchronous with bounded staleness.

Every node holds a replica of every shard; after the in-node route-back (ShardedTable.push) the owner of
shard l on node n holds that node's summed gradient for the rows of l its node touched. The replicas of
shard l (one per node: the inter group) then exchange in two phases:
  1. each row has one reducer replica (slot % nodes): every replica sends it its rows (all_to_all_v);
     the reducer adds them in node order;
  2. every reducer sends its sums to all replicas (all_gather).
All replicas receive the same bytes and apply the same update, so they stay bit-identical.

Staleness (config `parallel.staleness` = tau). The gradient of step t is applied to the table at the end
of step t + tau (tau = 0: at the end of step t, synchronous). With tau >= 1 the exchange of step t runs in a
background thread while step t + 1 computes; the main thread waits for it before its own next
collective, because mccl fails when two threads run collectives at the same time (measured: "Ring
ReduceScatter wait receiving ... failed"), while a collective in one thread overlapping a compiled graph
without collectives in another works. Every application asserts t_apply - t <= tau. The lookups of step
s therefore miss exactly the updates of steps s - tau .. s - 1: a bounded delay, the setting of the
convergence result quoted in docs/sparse.md.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from mindgr.parallel import comm
from mindgr.parallel.sparse.table import sum_by_slot
from mindgr.parallel.sparse.traffic import ID_BYTES, Traffic, row_bytes


class StalenessError(AssertionError):
    """An embedding update would be applied later than `parallel.staleness` steps after its gradient."""


def exchange_replicas(slots: np.ndarray, grads: np.ndarray, group, members: list, traffic: Traffic):
    """Sum of every replica's (slots, grads) over the inter group: (distinct slots, sums), identical on
    every replica."""
    nodes = len(members)
    if nodes == 1:
        return slots, grads
    me = comm.rank(group)
    dim = grads.shape[1]
    reducer = slots % nodes
    order = np.argsort(reducer, kind="stable")
    counts = np.bincount(reducer, minlength=nodes)
    got_slots, _ = comm.all_to_all_v(slots[order].astype(np.int32), counts, group)
    got, _ = comm.all_to_all_v(np.ascontiguousarray(grads[order]), counts, group)
    traffic.send(members, counts * (ID_BYTES + row_bytes(dim)), "inter_reduce")
    mine_slots, mine = sum_by_slot(got_slots.astype(np.int64), got)
    sizes = comm.all_gather(np.array([len(mine_slots)], np.int64), group)
    traffic.send(members, np.where(np.arange(nodes) == me, 0, len(mine_slots) * (ID_BYTES + row_bytes(dim))),
                 "inter_gather")
    all_slots = comm.all_gather(mine_slots.astype(np.int32), group, sizes=sizes).astype(np.int64)
    all_sums = comm.all_gather(mine, group, sizes=sizes)
    order = np.argsort(all_slots, kind="stable")                  # slot order, as a node-local sum gives
    return all_slots[order], all_sums[order]


def exchange_hot(slots: np.ndarray, grads: np.ndarray, hot_slots: int, group, members: list, traffic: Traffic):
    """The frequency layout's cross-node exchange: slots below `hot_slots` are replicated hot rows whose
    sums cover one node (exchange_replicas finishes them); the cold slots' sums already cover the job
    (HotColdTable.push) and pass through."""
    if hot_slots == 0:                  # the same on every replica of this shard: none of them exchanges
        return slots, grads
    hot = slots < hot_slots
    hs, hg = exchange_replicas(slots[hot], grads[hot], group, members, traffic)
    return np.concatenate([hs, slots[~hot]]), np.concatenate([hg, grads[~hot]])


class BoundedStaleness:
    """Schedules the cross-node exchange of each step's gradient and its application at step t + tau.

    `link` (mindgr.parallel.sparse.link.MeasuredExchange, or None: no modelled link) gives each exchange
    a link time; the gradient arrives that long after its collectives are done (a serial link: after the
    previous exchange's arrival too) and is applied no earlier. `clock` / `sleep` are injectable so tests
    need not time anything."""

    def __init__(self, tau: int, exchange, apply, link=None, clock=time.perf_counter, sleep=time.sleep):
        self.tau = tau
        self.exchange = exchange                   # (slots, grads) -> (slots, grads) summed over nodes
        self.apply = apply                         # (slots, grads) -> None: the row optimizer
        self.link, self.clock, self.sleep = link, clock, sleep
        self.ready = deque()                       # (origin step, slots, grads, arrival), exchanged, not applied
        self._pending = None                       # (step, slots, grads) submitted, not exchanged yet
        self._thread = None
        self._result = None
        self.max_staleness = 0
        self._link_free = 0.0                      # when the modelled link is free again (clock)
        self.link_delay_s = 0.0                    # modelled link time injected, since take_link()
        self.link_wait_s = 0.0                     # time the caller blocked on arrivals, since take_link()

    def _exchange(self, step: int, slots: np.ndarray, grads: np.ndarray) -> tuple:
        """(step, summed slots, summed grads, arrival time) of one exchange."""
        if self.link is None:
            return (step,) + self.exchange(slots, grads) + (0.0,)
        (s, g), seconds = self.link(self.exchange, slots, grads)
        arrival = max(self.clock(), self._link_free) + seconds
        self._link_free = arrival
        self.link_delay_s += seconds
        return step, s, g, arrival

    def submit(self, step: int, slots: np.ndarray, grads: np.ndarray):
        """Node-summed gradient of `step`: exchanged now (tau = 0) or queued for the background."""
        if self.tau == 0:
            self.ready.append(self._exchange(step, slots, grads))
        else:
            self._pending = (step, slots, grads)

    def start_background(self):
        """Start the exchange submitted last (the previous step's) while this step computes."""
        pending, self._pending = self._pending, None
        if pending is None:
            return

        def run():
            try:
                self._result = self._exchange(*pending)
            except BaseException as e:             # re-raised in the main thread by join()
                self._result = e

        self._thread = threading.Thread(target=run, name="mindgr-exchange", daemon=True)
        self._thread.start()

    def join(self):
        """Wait for the background exchange; call before any other collective of this process."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        result, self._result = self._result, None
        if isinstance(result, BaseException):
            raise result
        self.ready.append(result)

    def apply_due(self, step: int, flush: bool = False):
        """At the end of `step`: apply every exchanged gradient whose origin + tau == step (all if flush),
        each once it has arrived over the modelled link."""
        while self.ready and (flush or self.ready[0][0] + self.tau <= step):
            origin, slots, grads, arrival = self.ready.popleft()
            lag = step - origin
            if lag > self.tau:
                raise StalenessError(f"embedding gradient of step {origin} applied at step {step}: staleness "
                                     f"{lag} > parallel.staleness = {self.tau}")
            wait = arrival - self.clock()
            if wait > 0:                           # time.sleep releases the GIL: other threads run on
                self.sleep(wait)
                self.link_wait_s += wait
            self.max_staleness = max(self.max_staleness, lag)
            self.apply(slots, grads)

    def take_link(self) -> tuple[float, float]:
        """(link time injected, time blocked on it) since the last call."""
        out = (self.link_delay_s, self.link_wait_s)
        self.link_delay_s = self.link_wait_s = 0.0
        return out

    def flush(self, step: int):
        """Exchange and apply everything outstanding now (before a checkpoint, an evaluation, the end)."""
        self.join()
        pending, self._pending = self._pending, None
        if pending is not None:
            self.ready.append(self._exchange(*pending))
        self.apply_due(step, flush=True)
