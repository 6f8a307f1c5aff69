"""Host-side collectives over a named group, with the same results on every backend.

all_reduce, all_gather, broadcast, all_to_all_v, reduce_scatter and barrier, called eagerly (PyNative)
on numpy arrays or MindSpore Tensors; the result has the kind of the input.

Ascend (HCCL) has every collective natively. CPU (mccl) has only AllReduce, AllGather and Broadcast
(docs/ARCHITECTURE.md "Platform facts"), so there all_to_all_v and reduce_scatter are EMULATED exactly:
  all_to_all_v   = AllGather of the per-destination counts, AllGather of the send buffers padded to
                   the longest one, then each rank slices what the others addressed to it
                   (pure data movement: bit-identical to a native AlltoAllV, at n x the traffic);
  reduce_scatter = AllReduce of the whole buffer, then each rank keeps its slice
                   (the same sums a native ReduceScatter computes; n x the traffic).
all_gather accepts a different first dimension on every rank on both paths (sizes first, then padded
data). On CPU, mccl's AllGather and Broadcast also refuse any group but the world, and its AllReduce only
sums; inside other groups (and for max/min/prod) the gather is an AllReduce-sum of a buffer where each
rank fills only its own slot, which is exact (adding zeros changes no value).
Set MINDGR_COMM_EMULATE=1 to force the emulation on Ascend, e.g. to compare the two paths.

Ranks are group ranks; `group=None` is the world. Every member of a group must make the same calls in
the same order (a collective a rank skips leaves the others waiting: see mindgr.parallel.watchdog).
"""
from __future__ import annotations

import os

import numpy as np

_REDUCE_OPS = ("sum", "max", "min", "prod")
_prims: dict = {}
_groups: dict = {}


def _ms():
    import mindspore as ms
    return ms


def world_group() -> str:
    from mindspore.communication import GlobalComm
    return GlobalComm.WORLD_COMM_GROUP


def _group(group):
    return world_group() if group is None else group


def rank(group=None) -> int:
    from mindspore.communication import get_rank
    return int(get_rank(_group(group)))


def size(group=None) -> int:
    from mindspore.communication import get_group_size
    return int(get_group_size(_group(group)))


def new_group(name: str, ranks) -> str:
    """Create (once) the group `name` of the given world ranks; call it on every member rank."""
    ranks = sorted(int(r) for r in ranks)
    if _groups.get(name) not in (None, ranks):
        raise ValueError(f"group {name!r} already exists with ranks {_groups[name]}, not {ranks}")
    if name not in _groups:
        from mindspore.communication import create_group
        create_group(name, ranks)
        _groups[name] = ranks
    return name


def native_collectives() -> bool:
    """True where AlltoAllV / ReduceScatter exist (Ascend/HCCL) and emulation is not forced."""
    if os.environ.get("MINDGR_COMM_EMULATE", "") not in ("", "0"):
        return False
    return _ms().get_context("device_target") == "Ascend"


def _prim(kind: str, group: str, arg=None):
    key = (kind, group, arg)
    if key not in _prims:
        from mindspore import ops
        if kind == "allreduce":
            _prims[key] = ops.AllReduce(getattr(ops.ReduceOp, arg.upper()), group=group)
        elif kind == "allgather":
            _prims[key] = ops.AllGather(group=group)
        elif kind == "broadcast":
            _prims[key] = ops.Broadcast(arg, group=group)
        elif kind == "reducescatter":
            _prims[key] = ops.ReduceScatter(getattr(ops.ReduceOp, arg.upper()), group=group)
        else:
            raise KeyError(kind)
    return _prims[key]


def _to_tensor(x):
    ms = _ms()
    if isinstance(x, ms.Tensor):
        return x, True
    return ms.Tensor(np.ascontiguousarray(x)), False


def _out(t, as_tensor: bool):
    return t if as_tensor else t.asnumpy()


def _check_op(op: str):
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce op {op!r}: expected one of {', '.join(_REDUCE_OPS)}")


def _to_chunks(arr: np.ndarray) -> np.ndarray:
    """Bytes of `arr` as 16-bit pieces held in float32: [len(arr), k], every value exact."""
    rows = np.ascontiguousarray(arr).reshape(len(arr), -1).view(np.uint8)
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, np.zeros((len(rows), 1), np.uint8)], 1)
    return rows.view(np.uint16).astype(np.float32)


def _from_chunks(chunks: np.ndarray, like: np.ndarray) -> np.ndarray:
    raw = np.rint(chunks).astype(np.uint16).view(np.uint8)[:, : like[0].nbytes if len(like) else 0]
    return np.ascontiguousarray(raw).view(like.dtype).reshape(like.shape)


def _stack(arr: np.ndarray, group) -> np.ndarray:
    """Every rank's equally shaped `arr`, stacked in group-rank order: [n, *arr.shape], bit-exact.

    On CPU mccl's AllGather takes float32 / int32 and only the world group, and AllReduce takes floats
    only: anything else travels as 16-bit pieces in float32, and inside a subgroup as an AllReduce-sum
    where each rank fills only its own slot (a sum with zeros: exact).
    """
    ms = _ms()
    n = size(group)
    arr = np.ascontiguousarray(arr)
    cpu = _ms().get_context("device_target") == "CPU"
    slotted = cpu and _group(group) != world_group()
    if cpu and (slotted or arr.dtype not in (np.float32, np.int32)):
        flat = arr.reshape(1, -1)
        chunks = _to_chunks(flat)                                  # [1, k]
        if slotted:
            buf = np.zeros((n,) + chunks.shape[1:], np.float32)
            buf[rank(group)] = chunks[0]
            got = _prim("allreduce", _group(group), "sum")(ms.Tensor(buf)).asnumpy()
        else:
            got = _prim("allgather", _group(group))(ms.Tensor(chunks)).asnumpy()
        return np.stack([_from_chunks(got[r: r + 1], flat)[0] for r in range(n)]).reshape((n,) + arr.shape)
    out = _prim("allgather", _group(group))(ms.Tensor(arr[None]))
    return out.asnumpy().reshape((n,) + arr.shape)


def all_reduce(x, op: str = "sum", group=None):
    """Elementwise reduction over the group; every rank gets the result.

    mccl's AllReduce only sums floats: on CPU other ops and dtypes stack every rank's x and reduce in
    numpy (exact for integers; for float max/min too).
    """
    _check_op(op)
    t, as_tensor = _to_tensor(x)
    floats = t.dtype in (_ms().float32, _ms().float16)
    if native_collectives() or (op == "sum" and floats):
        return _out(_prim("allreduce", _group(group), op)(t), as_tensor)
    stacked = _stack(t.asnumpy(), group)
    out = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op](stacked, axis=0).astype(stacked.dtype)
    return _ms().Tensor(out) if as_tensor else out


def _gather_sizes(n_rows: int, group) -> np.ndarray:
    return _stack(np.array([n_rows], dtype=np.int32), group)[:, 0].astype(np.int64)


def _gather_padded(arr: np.ndarray, rows: int, group) -> np.ndarray:
    """Every rank's `arr` padded to `rows` rows, stacked: [n, rows, ...]."""
    if arr.shape[0] < rows:
        pad = np.zeros((rows - arr.shape[0],) + arr.shape[1:], dtype=arr.dtype)
        arr = np.concatenate([arr, pad], 0)
    return _stack(arr, group)


def all_gather(x, group=None, sizes=None):
    """Concatenation along axis 0 of every rank's `x` in rank order; first dimensions may differ.

    `sizes` (every rank's first dimension) skips the size exchange when the caller already knows it.
    """
    t, as_tensor = _to_tensor(x)
    arr = t.asnumpy()
    if arr.ndim == 0:
        arr = arr.reshape(1)
    sizes = _gather_sizes(arr.shape[0], group) if sizes is None else np.asarray(sizes, dtype=np.int64)
    stacked = _gather_padded(arr, max(int(sizes.max()), 1), group)
    out = np.concatenate([stacked[r, : sizes[r]] for r in range(len(sizes))], 0)
    return _ms().Tensor(out) if as_tensor else out


def broadcast(x, root: int = 0, group=None):
    """Every rank gets `root`'s x (same shape and dtype on every rank); root is a group rank."""
    t, as_tensor = _to_tensor(x)
    if _ms().get_context("device_target") == "CPU" and _group(group) != world_group():
        out = _stack(t.asnumpy(), group)[int(root)]
        return _ms().Tensor(out) if as_tensor else out
    from mindspore.communication import get_world_rank_from_group_rank
    world_root = int(root) if _group(group) == world_group() else \
        int(get_world_rank_from_group_rank(_group(group), int(root)))
    return _out(_prim("broadcast", _group(group), world_root)((t,))[0], as_tensor)


def barrier(group=None):
    """Returns on each rank once every rank of the group has called it."""
    all_reduce(np.zeros(1, dtype=np.float32), "sum", group)


def all_to_all_v(x, send_counts, group=None):
    """Rows of `x` go to ranks in order: the first send_counts[0] to rank 0, the next to rank 1, ...

    Returns (received rows concatenated in source-rank order, recv_counts per source rank).
    """
    t, as_tensor = _to_tensor(x)
    send_counts = np.asarray(send_counts, dtype=np.int64)
    n, me = size(group), rank(group)
    if send_counts.shape != (n,) or send_counts.min() < 0 or send_counts.sum() != t.shape[0]:
        raise ValueError(f"all_to_all_v: send_counts {send_counts.tolist()} must be {n} counts >= 0 "
                         f"summing to the {t.shape[0]} rows of x")
    matrix = _stack(send_counts.astype(np.int32), group).astype(np.int64)   # [source, destination]
    recv_counts = matrix[:, me]
    if native_collectives():
        from mindspore import mint, ops
        out = ops.zeros((int(recv_counts.sum()),) + tuple(t.shape[1:]), t.dtype)
        mint.distributed.all_to_all_single(out, t, recv_counts.tolist(), send_counts.tolist(), group=_group(group))
        return _out(out, as_tensor), recv_counts
    stacked = _gather_padded(t.asnumpy(), max(int(matrix.sum(1).max()), 1), group)
    starts = np.cumsum(matrix, 1) - matrix                      # where each destination's rows begin
    pieces = [stacked[s, starts[s, me]: starts[s, me] + matrix[s, me]] for s in range(n)]
    out = np.concatenate(pieces, 0)
    return (_ms().Tensor(out) if as_tensor else out), recv_counts


def reduce_scatter(x, recv_counts=None, op: str = "sum", group=None):
    """Elementwise reduction of `x` (same shape everywhere), rank r keeping rows
    [sum(recv_counts[:r]), sum(recv_counts[:r+1])); recv_counts=None splits evenly."""
    _check_op(op)
    t, as_tensor = _to_tensor(x)
    n, me = size(group), rank(group)
    rows = t.shape[0]
    if recv_counts is None:
        if rows % n:
            raise ValueError(f"reduce_scatter: {rows} rows do not split evenly over {n} ranks; pass recv_counts")
        recv_counts = [rows // n] * n
    counts = np.asarray(recv_counts, dtype=np.int64)
    if counts.shape != (n,) or counts.min() < 0 or counts.sum() != rows:
        raise ValueError(f"reduce_scatter: recv_counts {counts.tolist()} must be {n} counts >= 0 summing to {rows}")
    if native_collectives():
        if np.all(counts == counts[0]):
            return _out(_prim("reducescatter", _group(group), op)(t), as_tensor)
        from mindspore import mint, ops
        out = ops.zeros((int(counts[me]),) + tuple(t.shape[1:]), t.dtype)
        mint.distributed.reduce_scatter_tensor_uneven(out, t, counts.tolist(), op=op, group=_group(group))
        return _out(out, as_tensor)
    total = all_reduce(t.asnumpy(), op, group)
    start = int(counts[:me].sum())
    mine = np.ascontiguousarray(total[start: start + int(counts[me])])
    return _ms().Tensor(mine) if as_tensor else mine
