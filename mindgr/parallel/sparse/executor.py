"""ShardedTableExecutor: the data-parallel executor with the item table sharded (parallel.sparse), for the
retrieval task (a task with an item table).

Per step s, on every rank (docs/sparse.md):
  input thread  its share of the global batch (as DataParallelExecutor), the distinct ids of its tokens,
                targets and negatives (per-token, or the step's shared pool: the same ids on every rank),
                every id remapped to its slot in that list (padded to U_cap)
  lookup        the rows of those ids from their owners (ShardedTable.lookup, inside the shard group)
  background    (staleness >= 1) the cross-node exchange of step s-1's embedding gradient
  compute       RowsGrads: loss, gradient of the rows, dense gradients (no communication)
  dense         dense gradients summed over all ranks and applied (synchronous, as data parallel)
  route back    row gradients to their owners, summed per node (ShardedTable.push)
  cross-node    (staleness 0) the exchange now; the row optimizer applies step s - tau's sum once it has
                arrived over the modelled link, if one is on (parallel.link_*, mindgr.parallel.sparse.link)
Evaluations and checkpoints first flush the outstanding exchange.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from mindgr.config import ConfigError
from mindgr.parallel import comm
from mindgr.parallel.executor import DataParallelExecutor, _step_cpu
from mindgr.train import table_checkpoint as table_ckpt
from mindgr.train.step import StepInputs
from mindgr.train.executor import StepShape


def remap(uniq: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.searchsorted(uniq, x).astype(np.int32)


class SparseModel:
    """Encoder without its item table, the dense optimizer, the row optimizer and the sharded table, laid
    out by `layout` (a TableLayout, mindgr.parallel.sparse.layout); `group` is its shard group's handle."""

    def __init__(self, cfg, num_items: int, layout, group, traffic):
        from mindgr.models import build_encoder
        from mindgr.models.losses import use_score_all
        from mindgr.parallel.dp import ReduceApply
        from mindgr.parallel.sparse.init import ShardDraw
        from mindgr.parallel.sparse.row_adam import RowAdam
        from mindgr.parallel.sparse.step import DenseState, EncodeRows, RowsGrads, RowsLoss, RowsPoolLoss
        from mindgr.parallel.sparse.table import ShardedTable
        from mindgr.train.step import EncodeLast, build_optimizer
        self.layout = layout
        self.num_rows = layout.num_rows
        self.group = group
        draw = ShardDraw(layout.owned_ids())
        self.encoder = build_encoder(cfg.model, num_items, cfg.data.max_len, cfg.run.seed, item_init=draw)
        if layout.kind == "frequency":                  # group: the topology's Groups (intra and inter)
            from mindgr.parallel.sparse.table import HotColdTable
            self.table = HotColdTable(draw.rows, layout.hot_cold(), layout.rank, group.intra,
                                      group.topo.intra_ranks, group.inter, list(layout.replicas), traffic)
        else:
            self.table = ShardedTable(draw.rows, self.num_rows, layout.shards, layout.shard, group,
                                      list(layout.members), traffic)
        dense = [p for p in self.encoder.trainable_params() if p.name != "item_emb"]
        self.optimizer = build_optimizer(dense, cfg.train)
        t = cfg.train
        self.row_opt = RowAdam(self.table.rows, t.lr, t.beta1, t.beta2, t.eps, t.weight_decay,
                               lazy=cfg.parallel.sparse_update == "lazy")
        self.u_cap = layout.unique_capacity
        self.pool = cfg.loss.pool_size if cfg.loss.negatives == "shared_pool" else 0
        if self.pool:        # one pool per step, the same on every rank (the task's draw of the global batch)
            self.loss_net = RowsPoolLoss(self.encoder, cfg.loss.temperature, cfg.loss.fp16_negatives)
        else:
            self.loss_net = RowsLoss(self.encoder, cfg.loss.temperature,
                                     use_score_all(self.u_cap - 1, cfg.loss.num_negatives))
        self.grads = RowsGrads(self.loss_net, self.optimizer.parameters)
        self.reduce_apply = ReduceApply(self.optimizer)
        self.train_step = DenseState(self.encoder, self.optimizer)     # what the dense checkpoint holds
        self.encode_last = EncodeLast(self.encoder)       # unused: the encoder has no table (EncodeRows)
        self.encode_rows = EncodeRows(self.encoder)

    def full_table(self) -> np.ndarray:
        """The whole raw table, assembled from the shards of this rank's shard group (a collective)."""
        from mindgr.parallel.sparse.init import owned_rows
        shards, t = self.layout.shards, self.table
        if hasattr(t, "assemble"):
            return t.assemble(self.layout.rank // self.layout.local_ranks)
        if shards == 1:
            return t.rows.copy()
        sizes = [len(owned_rows(self.num_rows, shards, k)) for k in range(shards)]
        got = comm.all_gather(t.rows, self.group, sizes=sizes)
        full = np.empty((self.num_rows, t.dim), np.float32)
        lo = 0
        for k, n in enumerate(sizes):
            full[k::shards] = got[lo: lo + n]
            lo += n
        return full

class _SparseLocal:
    """The `local(*inputs)` the calibration probe times: the compute of a sparse step on a dense-layout
    synthetic batch (ids remapped on the host, rows random), no communication."""

    def __init__(self, model):
        self.model = model

    def local(self, *tensors):
        from mindspore import Tensor
        m = self.model
        k = StepInputs._fields.index("negatives")                    # calibrate.step_inputs' tensors
        x = StepInputs(*tensors[:k], (tensors[k],), *tensors[k + 1:])
        ids, targets, negatives = x.ids.asnumpy(), x.targets.asnumpy(), x.negatives[0].asnumpy()
        rng = np.random.default_rng(0)
        if m.pool:                            # the probe's batches carry per-token ids: a uniform pool instead
            from mindgr.train.negatives import uniform_items
            negatives = uniform_items(rng, m.num_rows - 1, m.pool)
        uniq = np.unique(np.concatenate([[0], ids, targets, negatives.ravel()]))[: m.u_cap]
        rows = np.zeros((m.u_cap, m.table.dim), np.float32)
        rows[: len(uniq)] = rng.standard_normal((len(uniq), m.table.dim)) * 0.02
        clip = len(uniq) - 1
        mapped = Tensor(np.minimum(remap(uniq, negatives), clip))
        x = x._replace(ids=Tensor(np.minimum(remap(uniq, ids), clip)),
                       targets=Tensor(np.minimum(remap(uniq, targets), clip)),
                       negatives=(mapped, Tensor(np.zeros(m.pool, np.float32))) if m.pool else (mapped,))
        return m.grads(Tensor(rows), *x.as_tuple())


class ShardedTableExecutor(DataParallelExecutor):
    """Data parallel for the dense weights; the item table sharded over each node group's ranks."""

    kind = "sharded_table"

    def set_learning_rate(self, lr: float):
        super().set_learning_rate(lr)
        self.model.row_opt.lr = np.float32(lr)     # the table's host-side optimizer follows the same rate

    # ---- setup -----------------------------------------------------------------------------------
    def plan_shape(self) -> StepShape:
        """The topology and the table's layout (TableLayout), whose per-rank capacities are the step's."""
        from mindgr.parallel.sparse.layout import plan_table
        from mindgr.parallel.sparse.topology import host_names, resolve
        p, world, rank = self.cfg.parallel, self.ctx.world, self.ctx.rank
        hosts = host_names(world) if p.nodes == 0 and p.local_ranks == 0 else None
        self.topo = resolve(p.nodes, p.local_ranks, world, rank, hosts)
        tr = self.data.train
        freq = None
        if p.sparse == "frequency":                      # the plan's id statistics: the training targets
            from mindgr.train.negatives import item_frequencies
            freq = item_frequencies(self.data.split.train, self.data.num_items)
        self.layout = plan_table(self.topo, self.cfg, self.data.num_items, tr.token_capacity, tr.row_capacity,
                                 freq=freq)
        lay = self.layout
        return StepShape(tr.token_capacity, tr.row_capacity, lay.rank_tokens, lay.rank_rows, lay.unique_capacity)

    def build_model(self):
        from mindgr.parallel.sparse.exchange import BoundedStaleness, exchange_hot, exchange_replicas
        from mindgr.parallel.sparse.link import LinkModel, MeasuredExchange
        from mindgr.parallel.sparse.topology import Groups
        from mindgr.parallel.sparse.traffic import Bandwidth, Traffic
        p, world, layout = self.cfg.parallel, self.ctx.world, self.layout
        self.traffic = Traffic(self.topo.node_of(np.arange(world)), self.ctx.rank)
        self.bandwidth = Bandwidth(p.intra_gbps, p.inter_gbps)
        if layout.kind == "hierarchical":
            self.groups = Groups(self.topo)
            group, inter = self.groups.intra, (self.groups.inter, list(layout.replicas))
        elif layout.kind == "frequency":                 # hot rows as hierarchical, cold rows flat
            self.groups = Groups(self.topo)
            group, inter = self.groups, (self.groups.inter, list(layout.replicas))
        else:                                            # flat: every rank owns a shard, no replicas
            group, inter = None, (None, list(layout.replicas))
        model = SparseModel(self.cfg, self.data.num_items, layout, group, self.traffic)
        self.task.model, self.task.sampler = model, self.task.make_sampler(model.encoder)   # the task's draws
        exchange = exchange_replicas
        if layout.kind == "frequency":
            exchange = (lambda s, g, *a: exchange_hot(s, g, model.table.hot_slots, *a))
        self.link = LinkModel(p.link_latency_ms, p.link_gbps, self.topo.local_ranks)
        self.stale = BoundedStaleness(layout.staleness,
                                      lambda s, g: exchange(s, g, inter[0], inter[1], self.traffic),
                                      model.row_opt.apply,
                                      link=MeasuredExchange(self.link, self.traffic) if self.link.on else None)
        if self.link.on:
            self.run.log.info(f"sparse: modelled inter-node link on: {p.link_latency_ms:g} ms per cross-node "
                              f"message, {p.link_gbps:g} GB/s per node shared by {self.topo.local_ranks} ranks")
        if layout.cut:
            self.run.log.info(f"sparse: frequency layout, {layout.cut['hot_rows']} hot rows "
                              f"({layout.cut['rule']}; ~{layout.cut['hot_share_of_rank_ids']:.1%} of a rank's ids)")
        self.sparse_win = {"intra": [], "inter": [], "lookup_s": [], "exchange_wait_s": [], "unique": [],
                           "link_delay_s": [], "link_wait_s": []}
        self.run.log.info(f"sparse: {p.sparse} item table, {self.topo.nodes} node groups x {self.topo.local_ranks} "
                          f"local ranks, {layout.shards} shards of ~{len(model.table.rows)} rows x "
                          f"{model.table.dim}, staleness {self.stale.tau}, U_cap {model.u_cap}, row update "
                          f"{p.sparse_update}")
        return model

    def make_local_step(self):
        return _SparseLocal(self.model)

    # ---- a step ----------------------------------------------------------------------------------
    def prepare(self, epoch: int, b: int, indices):
        inputs, info = super().prepare(epoch, b, indices)
        ids, targets, (negatives, *logq) = inputs.ids, inputs.targets, inputs.negatives   # shared_pool: + logQ
        uniq = np.unique(np.concatenate([np.zeros(1, ids.dtype), ids, targets, negatives.ravel()]).astype(np.int64))
        u_cap = self.shape.unique_capacity
        if len(uniq) > u_cap:
            raise ConfigError(f"config: parallel.unique_capacity = {u_cap}: a rank's batch holds "
                              f"{len(uniq)} distinct item ids (batch {b} of epoch {epoch}); raise it")
        info["unique"] = uniq
        mapped = inputs._replace(ids=remap(uniq, ids), targets=remap(uniq, targets),
                                 negatives=(remap(uniq, negatives), *logq))
        return mapped, info

    def execute(self, prepared, step: int):
        from mindspore import Tensor, mutable
        inputs, info = prepared
        m, uniq = self.model, info["unique"]
        self.before_step(step)
        self.stale.take_link()                            # a flush's link time (evaluation) is not this step's
        t0 = time.perf_counter()
        rows = np.empty((m.u_cap, m.table.dim), np.float32)
        rows[len(uniq):] = 0.0
        rows[: len(uniq)] = m.table.lookup(uniq)
        t_lookup = time.perf_counter()
        self.stale.start_background()                     # step s-1's cross-node exchange, during compute
        c0 = _step_cpu()
        loss, (row_grads, dense_grads) = m.grads(Tensor(rows), *inputs.tensors())
        loss.asnumpy()
        t1, c1 = time.perf_counter(), _step_cpu()
        self.stale.join()
        t_join = time.perf_counter()
        loss = float(m.reduce_apply(loss.reshape((1,)), mutable(dense_grads)).asnumpy()[0])
        slots, sums = m.table.push(row_grads.asnumpy()[: len(uniq)])
        self.stale.submit(step, slots, sums)
        self.stale.apply_due(step)
        t2 = time.perf_counter()
        intra, inter = self.traffic.end_step()
        link_delay, link_wait = self.stale.take_link()
        self.record_step(step, info["share"], t1 - t_lookup, c1 - c0, t2 - t1)
        sw = self.sparse_win
        sw["intra"].append(intra)
        sw["inter"].append(inter)
        sw["lookup_s"].append(t_lookup - t0)
        sw["exchange_wait_s"].append(t_join - t1)
        sw["unique"].append(len(uniq))
        sw["link_delay_s"].append(link_delay)
        sw["link_wait_s"].append(link_wait)
        return loss, t2 - t0, info

    def window_extra(self):
        extra, text = super().window_extra()
        sw = self.sparse_win
        if not sw["intra"]:
            return extra, text
        mine = np.array([np.mean(sw[k]) for k in ("intra", "inter", "link_delay_s", "link_wait_s")], np.float64)
        every = comm.all_gather(mine[None, :])                       # [rank, (intra, inter, delay, wait)]
        node = self.topo.node_of(np.arange(self.ctx.world))
        per_node = np.array([every[node == n].sum(0) for n in range(self.topo.nodes)])
        extra.update({"sparse_intra_bytes": float(every[:, 0].sum()), "sparse_inter_bytes": float(every[:, 1].sum()),
                      "sparse_model_s": self.bandwidth.seconds(per_node[:, 0], per_node[:, 1]),
                      "sparse_lookup_s": float(np.mean(sw["lookup_s"])),
                      "sparse_exchange_wait_s": float(np.mean(sw["exchange_wait_s"])),
                      "sparse_unique": float(np.mean(sw["unique"])), "staleness_max": self.stale.max_staleness})
        if self.link.on:             # per step, the slowest rank's: the others wait for it at the next collective
            extra.update({"sparse_link_delay_s": float(every[:, 2].max()),
                          "sparse_link_wait_s": float(every[:, 3].max())})
        for v in sw.values():
            v.clear()
        text += f" emb {extra['sparse_intra_bytes'] / 1e6:.2f}/{extra['sparse_inter_bytes'] / 1e6:.2f} MB intra/inter"
        if self.link.on:
            text += (f" link {extra['sparse_link_delay_s'] * 1e3:.1f}/{extra['sparse_link_wait_s'] * 1e3:.1f}"
                     " ms delay/wait")
        return extra, text

    # ---- evaluation ------------------------------------------------------------------------------
    def evaluate(self, split: str, step: int) -> dict:
        """Full ranking needs every item: the node group's shards are assembled (one copy of the table per
        rank); users are encoded from gathered rows and scored against the raw rows times 1 / norm (the
        cosine of l2_normalize, eps 1e-6), so no second copy of the table is made."""
        self.stale.flush(step)
        full = self.model.full_table()
        inv_norm = 1.0 / np.sqrt(np.einsum("ij,ij->i", full, full) + np.float32(1e-12))
        self.eval_table = (full, inv_norm.astype(np.float32))
        try:
            return super().evaluate(split, step)
        finally:
            self.eval_table = None

    def encode_batch(self, batch) -> np.ndarray:
        from mindspore import Tensor
        from mindgr.train.step import encoder_inputs
        full, _ = self.eval_table
        uniq = np.unique(np.concatenate([[0], batch.ids]).astype(np.int64))
        rows = np.zeros((len(batch.ids) + 1, full.shape[1]), np.float32)      # static shape: T_cap + 1
        rows[: len(uniq)] = full[uniq]
        ids, *rest = encoder_inputs(batch)
        return self.model.encode_rows(Tensor(rows), Tensor(remap(uniq, ids)), *[Tensor(x) for x in rest]).asnumpy()

    def rank_items(self, model, evalset, split_data, ks, filter_history):
        """The split ranking with users encoded from gathered rows and scored against the assembled table."""
        from mindgr.parallel.evaluate import evaluate_sharded
        full, inv_norm = self.eval_table
        return evaluate_sharded(None, None, evalset, split_data, ks, self.ctx.rank, self.ctx.world,
                                beat=self.watchdog.beat, encode_batch=self.encode_batch,
                                score=lambda u: (u @ full.T) * inv_norm[None, :], filter_history=filter_history)

    # ---- state, checkpoints ----------------------------------------------------------------------
    def rank_state(self, step: int, cursor: dict) -> dict:
        """The data-parallel rank state plus a digest of this rank's table shard: replicas of a shard (same
        local rank, other node groups) must show the same one."""
        state = super().rank_state(step, cursor)
        state["table"] = {"shard": self.layout.shard, "shards": self.layout.shards, "node": self.topo.node,
                          "rows_crc32": zlib.crc32(np.ascontiguousarray(self.model.table.rows).tobytes())}
        return state

    def _writes_table(self) -> bool:
        """Replicas are identical: the ranks of node group 0 (all ranks when flat or frequency) write."""
        return self.cfg.parallel.sparse in ("flat", "frequency") or self.topo.node == 0

    def _save_table(self, name: str):
        m, ckpt_dir = self.model, self.run.ckpt_dir
        if m.layout.kind == "frequency":       # every rank its cold rows, node group 0 its hot rows too
            keep = slice(None) if self.topo.node == 0 else slice(m.table.hot_slots, None)
            table_ckpt.save_shard(ckpt_dir, name, m.layout.shard, m.layout.shards, m.num_rows, m.table.rows[keep],
                                  m.row_opt.m[keep], m.row_opt.v[keep], ids=m.table.ids[keep],
                                  hot=m.layout.hot if self.ctx.rank == 0 else None)
        elif self._writes_table():
            table_ckpt.save_shard(ckpt_dir, name, m.layout.shard, m.layout.shards, m.num_rows,
                                  m.table.rows, m.row_opt.m, m.row_opt.v)
        comm.barrier()                         # every shard is on disk before the checkpoint is committed
        if self.writer:                        # e.g. `best` of the run this one resumed with other ranks
            table_ckpt.drop_other_layouts(ckpt_dir, name, m.layout.shards)

    def _load_table(self, name: str):
        m = self.model
        rows, mom1, mom2 = table_ckpt.load_shard(self.run.ckpt_dir, name, m.num_rows, m.layout.shards,
                                                 m.layout.shard, ids=m.layout.owned_ids())
        m.table.rows[...], m.row_opt.m[...], m.row_opt.v[...] = rows, mom1, mom2

    def restore(self, tensors: dict, path):
        super().restore(tensors, path)
        self._load_table(path.name)

    def check_finite(self) -> str | None:
        if not np.isfinite(self.model.table.rows).all():
            return f"rank {self.ctx.rank}'s item table shard holds non-finite values"
        return None

    def settle(self, what: str, step: int):
        self.stale.flush(step)
        super().settle(what, step)

    def save_checkpoint(self, step: int, cursor: dict, commit):
        self._save_table(f"ckpt-step{step:08d}")
        path = super().save_checkpoint(step, cursor, commit)
        if self.writer:
            keep = {p.stem for p in self.run.ckpt_dir.glob("ckpt-step*.json")} | {"best"}
            table_ckpt.prune(self.run.ckpt_dir, keep)
        return path

    def save_best(self, commit):
        self._save_table("best")
        super().save_best(commit)

    def meta(self) -> dict:
        meta = super().meta()
        meta["parallel"]["table"] = {"layout": self.cfg.parallel.sparse, "shards": self.layout.shards,
                                     "rows": self.model.num_rows, "staleness": self.stale.tau}
        if self.link.on:
            meta["parallel"]["table"]["link"] = {"latency_ms": self.link.latency_ms, "gbps": self.link.gbps,
                                                 "local_ranks": self.link.local_ranks}
        if self.layout.cut:
            meta["parallel"]["table"]["hot"] = self.layout.cut
        return meta

    def training_done(self):
        self.model.row_opt.m = self.model.row_opt.v = None   # training is over (saved): room for the eval table
