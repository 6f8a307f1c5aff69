"""CPU backend of the jagged ops: C++ kernels run as MindSpore custom AOT ops, with bprops.

    hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len, request_times=None) -> [T, H, dv]
    bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len, request_times=None) -> [T, H, C, dv]
                                                                                   (bias_attention.cc)
    softmax_attention(q, k, v, offsets, max_len) -> [T, H, dv]     (softmax_attention.cc: online softmax)
    linear_attention(q, k, v, offsets, log_decay, intra, tail, lead) -> [T, H, dv]
                                         (linear_attention.cc: a recurrent scan; the tables are unused)
    jagged_to_padded(values, offsets, max_len) -> [B, N, *F]
    padded_to_jagged(padded, offsets, num_tokens) -> [T, *F]
    sampled_logits(out, table, ids, score_all=False) -> [T, R]  (score_all: ignored)
    sampled_lse(x, table, ids, targets, pos) -> [T]   (the sampled-softmax tail fused with the scoring)
    shared_pool_lse(x, cand, logq, cand_ids, targets, pos) -> [T]
    layer_norm(x, eps) -> [.., D];  gated_layer_norm(u, y, eps) = u * layer_norm(y)   (layernorm.cc)
    l2_normalize(x, eps) -> [.., D]                                                  (layernorm.cc)
    silu_split(x, widths) -> (SiLU(x[.., o_k:o_k + w_k]) for each width w_k)          (silu.cc)

Same math as `mindgr.ops.reference`; usable in PyNative and inside a GRAPH-mode Cell (static shapes
only: a custom AOT op cannot infer a shape from a value). Output lengths that are not a dimension
of an input (max_len, num_tokens) travel as the first dimension of a "carrier" input
(zeros of length N or T). The shared library is built on first use (see `build.py`); importing this
module never builds or fails. Kernels use MINDGR_CPU_THREADS threads (default: the usable cores).

The registered kernels (C++ symbols, inputs, outputs, which inputs get gradients) are the rows of
`table.TABLE`; `table.describe()` lists them. A kernel that rejects its inputs returns a named code
of `arg_errors.def` (shared with the C++ side); `errors.kernel_errors()` and the CLI turn MindSpore's
"Return value from CPU AOT kernel ... is N" into one line, "<op>: <text> (code N)".

The time-bias variants take request_times [B] int64: the query time of each row's last position
(t_{i+1} elsewhere); the ops below default it to the last position's own time (the pre-request-time
convention) when None.
"""
from __future__ import annotations

import ctypes
import os
import threading

import mindspore as ms
from mindspore import ops

from mindgr.ops.reference import default_request_times
from mindgr.ops.reference import silu_split as _reference_silu_split
from mindgr.ops.cpu.table import HELPERS, ROWS, TABLE, kernel_symbols


def _builder():
    # imported lazily so that `python -m mindgr.ops.cpu.build` runs the module only once
    from mindgr.ops.cpu import build
    return build

_SYMBOLS = kernel_symbols() + HELPERS

_lock = threading.Lock()
_loaded: dict = {}  # "path" -> built library path, "cdll" -> ctypes handle, "error" -> reason


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(lines[:1] + lines[-1:]) if lines else "unknown error"


def _library() -> str:
    """Build (if needed) and load the kernels once per process; raise BuildError if impossible."""
    _build = _builder()
    with _lock:
        if "path" in _loaded:
            return _loaded["path"]
        if "error" in _loaded:
            raise _build.BuildError(_loaded["error"])
        try:
            path = _build.build()
            white = os.environ.get("MS_CUSTOM_AOT_WHITE_LIST")
            if white and os.path.commonpath([os.path.realpath(path), os.path.realpath(white)]) != \
                    os.path.realpath(white):
                raise _build.BuildError(f"the kernel library {path} is outside MS_CUSTOM_AOT_WHITE_LIST={white}; "
                                        f"set MINDGR_CPU_BUILD_DIR inside it or {_build.WAY_OUT}")
            try:
                cdll = ctypes.CDLL(path)
                for name in _SYMBOLS:
                    getattr(cdll, name)
            except (OSError, AttributeError) as exc:
                raise _build.BuildError(f"cannot load the C++ kernels from {path}: {exc}; {_build.WAY_OUT}") from exc
        except _build.BuildError as exc:
            _loaded["error"] = str(exc)
            raise
        for fn in (cdll.mindgr_time_bucket, cdll.mindgr_time_bucket_formula):
            fn.argtypes = (ctypes.c_int64, ctypes.c_int)
            fn.restype = ctypes.c_int
        cdll.mindgr_num_threads.restype = ctypes.c_int
        cdll.mindgr_isa.restype = ctypes.c_char_p
        cdll.mindgr_vector_lanes.restype = ctypes.c_int
        cdll.mindgr_recip_probe.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        cdll.mindgr_recip_probe.restype = None
        cdll.mindgr_parallel_probe.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
        cdll.mindgr_parallel_probe.restype = ctypes.c_int
        _loaded["cdll"] = cdll
        _loaded["path"] = path
        return path


def unavailable_reason() -> str | None:
    """None when the kernels are built and loadable, else a one-line reason (builds on first call)."""
    try:
        _library()
    except _builder().BuildError as exc:
        return _one_line(exc)
    return None


def library_path() -> str:
    return _library()


def kernel_threads() -> int:
    """Threads the kernels use now (MINDGR_CPU_THREADS, default the usable cores)."""
    _library()
    return int(_loaded["cdll"].mindgr_num_threads())


def isa() -> str:
    """The vector ISA the loaded kernels were built for ("avx512", "avx2", "neon" or "generic") and
    their lanes per vector, e.g. "avx2 (8 lanes)"; see build.py for how it is chosen."""
    _library()
    cdll = _loaded["cdll"]
    return f"{cdll.mindgr_isa().decode()} ({int(cdll.mindgr_vector_lanes())} lanes)"


def recip_probe(x):
    """(1/x, x * sigmoid(x)) for a float32 numpy array, as the attention kernels compute them (tests)."""
    import numpy as np
    _library()
    x = np.ascontiguousarray(x, dtype=np.float32)
    y, z = np.empty_like(x), np.empty_like(x)
    _loaded["cdll"].mindgr_recip_probe(x.ctypes.data, y.ctypes.data, z.ctypes.data, x.size)
    return y, z


def parallel_probe(n: int, rounds: int, throw_tid: int = -1):
    """For tests: `rounds` calls of the kernels' parallel_run over n tids (workers.cc), each counting
    its tid, tid `throw_tid` throwing. Returns (counts per tid, True if every call's exception reached
    the caller and no other did)."""
    import numpy as np
    _library()
    counts = np.zeros(max(n, 1), dtype=np.int32)
    bad = _loaded["cdll"].mindgr_parallel_probe(int(n), int(rounds), int(throw_tid), counts.ctypes.data)
    return counts[:n], bad == 0


def time_bucket(dt: int, num_buckets: int, formula: bool = False) -> int:
    """The time bucket the attention kernel assigns to a gap dt (for tests): from its lookup table,
    or with formula=True straight from clamp(floor(logf(float(max(|dt|, 1))) / 0.301f), 0, nb)."""
    _library()
    fn = _loaded["cdll"].mindgr_time_bucket_formula if formula else _loaded["cdll"].mindgr_time_bucket
    return int(fn(int(dt), int(num_buckets)))


# ------------------------------------------------------------------------------------------------
# Custom primitives, made from the kernel table (table.py) once on first use. They are properties
# (`_P.hstu_fwd`, `_P.hstu_fwd_bwd`, `_P.silu_split2`, ...): attribute access also works while a graph
# is being compiled, the properties run in Python during parsing.

def _aot(name: str, out_shape, out_dtype, bprop=None):
    return ops.Custom(f"{_library()}:{name}", out_shape=out_shape, out_dtype=out_dtype,
                      func_type="aot", bprop=bprop)


def _zeros_carrier(n: int):
    return ops.zeros((n,), ms.float32)


def _fixed_arity(n: int, rule):
    """bprop(input_0 .. input_{n-1}, out, dout) = rule(inputs, out, dout): graph mode needs a bprop of
    fixed arity."""
    if n == 2:
        def bprop(a, b, out, dout):
            return rule((a, b), out, dout)
    elif n == 3:
        def bprop(a, b, c, out, dout):
            return rule((a, b, c), out, dout)
    elif n == 4:
        def bprop(a, b, c, d, out, dout):
            return rule((a, b, c, d), out, dout)
    elif n == 5:
        def bprop(a, b, c, d, e, out, dout):
            return rule((a, b, c, d, e), out, dout)
    elif n == 6:
        def bprop(a, b, c, d, e, f, out, dout):
            return rule((a, b, c, d, e, f), out, dout)
    elif n == 7:
        def bprop(a, b, c, d, e, f, g, out, dout):
            return rule((a, b, c, d, e, f, g), out, dout)
    elif n == 9:
        def bprop(a, b, c, d, e, f, g, h, i, out, dout):
            return rule((a, b, c, d, e, f, g, h, i), out, dout)
    else:
        raise ValueError(f"no bprop of {n} inputs: add one to _fixed_arity")
    return bprop


def _table_bprop(row, n_in: int, bwd):
    """The row's bprop: backward(picked inputs, saved outputs, dout) -> gradients of row.grads, zeros else."""
    names = row.inputs if not row.variadic else (row.inputs[0],) + tuple(f"carrier_{j}" for j in range(n_in - 1))
    pick = tuple(range(n_in)) if row.bwd_inputs is None else tuple(row.bwd_inputs)
    slots = tuple(row.grads.index(name) if name in row.grads else -1 for name in names)
    casts = tuple(name in row.cast_grads for name in names)
    multi_out = len(row.outputs) > 1 or row.variadic

    if not row.reads_out:
        def saved(out):
            return ()
    elif multi_out:
        def saved(out):
            return tuple(out)
    else:
        def saved(out):
            return (out,)
    if row.dout == "all":
        def incoming(dout):
            return tuple(dout)
    elif row.dout == "first":
        def incoming(dout):
            return (dout[0],)
    else:
        def incoming(dout):
            return (dout,)
    if len(row.grads) == 1:
        def gradients(xs):
            return (bwd(*xs),)
    else:
        def gradients(xs):
            return bwd(*xs)

    def rule(args, out, dout):
        xs = ()
        for i in pick:
            xs = xs + (args[i],)
        g = gradients(xs + saved(out) + incoming(dout))
        res = ()
        for i in range(n_in):
            if slots[i] < 0:
                res = res + (ops.zeros_like(args[i]),)
            elif casts[i]:
                res = res + (ops.cast(g[slots[i]], args[i].dtype),)
            else:
                res = res + (g[slots[i]],)
        return res

    return _fixed_arity(n_in, rule)


class _Primitives:
    """Lazily created Custom ops, one per table row (and K for variadic rows); one instance per process."""

    def __init__(self):
        self._cache = {}
        self._mu = threading.RLock()  # make() may fetch another primitive

    def _get(self, key, make):
        prim = self._cache.get(key)
        if prim is None:
            with self._mu:
                prim = self._cache.get(key)
                if prim is None:
                    prim = make()
                    self._cache[key] = prim
        return prim

    def backward(self, key: str, k: int = 0):
        row = ROWS[key]
        return self._get((key, k, "bwd"), lambda: _aot(row.backward, row.grad_shape, row.grad_dtype))

    def raw(self, key: str):
        """The forward without a bprop (the jagged pair's gradients)."""
        row = ROWS[key]
        return self._get((key, "raw"), lambda: _aot(row.forward, row.out_shape, row.out_dtype))

    def forward(self, key: str, k: int = 0):
        row = ROWS[key]

        def make():
            if row.backward_is_forward_of is not None:
                bprop = _jagged_bprop(key, self.raw(row.backward_is_forward_of))
            else:
                bprop = _table_bprop(row, 1 + k if row.variadic else len(row.inputs), self.backward(key, k))
            return _aot(row.forward, row.out_shape, row.out_dtype, bprop)
        return self._get((key, k), make)


def _jagged_bprop(key: str, other):
    """jagged <-> padded: each one's gradient is the other's forward, its length carried by values / zeros."""
    if key == "j2p":
        def bprop(values, off, car, out, dout):
            return other(dout, off, values), ops.zeros_like(off), ops.zeros_like(car)  # the values carry T
    else:
        def bprop(padded, off, car, out, dout):
            return other(dout, off, _zeros_carrier(padded.shape[1])), ops.zeros_like(off), ops.zeros_like(car)
    return bprop


def _add_properties():
    for row in TABLE:
        for k in (range(1, 5) if row.variadic else (0,)):
            name = f"{row.key}{k}" if row.variadic else row.key
            setattr(_Primitives, name, property(lambda self, key=row.key, k=k: self.forward(key, k)))
            setattr(_Primitives, name + "_bwd", property(lambda self, key=row.key, k=k: self.backward(key, k)))


_add_properties()
_P = _Primitives()


# ------------------------------------------------------------------------------------------------
# The ops (same signatures as mindgr.ops.reference).

def _as(x, dtype):
    """x in the dtype a kernel reads (the kernels take fixed dtypes; a no-op when it already is)."""
    return x if x.dtype == dtype else x.astype(dtype)


def _request_times(offsets, timestamps, request_times, max_len: int):
    """int64 [B]: the given request times, or (None) each row's last kept token's own time."""
    if request_times is None:
        return default_request_times(offsets, _as(timestamps, ms.int64), max_len)
    return _as(request_times, ms.int64)


def hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """out_i = sum_{j<=i} SiLU(q_i.k_j + w_pos[N-1+j-i] (+ w_ts[bucket])) / N * v_j; see reference."""
    dtype = q.dtype
    q, k, v, w_pos = _as(q, ms.float32), _as(k, ms.float32), _as(v, ms.float32), _as(w_pos, ms.float32)
    carrier = _zeros_carrier(max_len)
    if w_ts is None:
        out = _P.hstu_fwd(q, k, v, offsets, w_pos, carrier)
    else:
        req = _request_times(offsets, timestamps, request_times, max_len)
        out = _P.hstu_fwd_ts(q, k, v, offsets, _as(timestamps, ms.int64), req, w_pos, _as(w_ts, ms.float32),
                             carrier)
    return _as(out, dtype)


def bias_attention(v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """FuXi-alpha's positional (and, with w_ts, temporal) channel: [T, H, C, dv]; see reference."""
    dtype = v.dtype
    v, w_pos = _as(v, ms.float32), _as(w_pos, ms.float32)
    carrier = _zeros_carrier(max_len)
    if w_ts is None:
        out = _P.bias_fwd(v, offsets, w_pos, carrier)
    else:
        req = _request_times(offsets, timestamps, request_times, max_len)
        out = _P.bias_fwd_ts(v, offsets, _as(timestamps, ms.int64), req, w_pos, _as(w_ts, ms.float32), carrier)
    return _as(out, dtype)


def softmax_attention(q, k, v, offsets, max_len: int):
    """Causal softmax attention per row and head, scores q.k / sqrt(d), rows cut to max_len; see reference.
    Online softmax over blocks of keys (no [B, N, N] tensor); the backward recomputes the weights from
    the forward's log-sum-exp. Deterministic and independent of the thread count."""
    dtype = q.dtype
    out = _P.softmax_fwd(_as(q, ms.float32), _as(k, ms.float32), _as(v, ms.float32), offsets,
                         _zeros_carrier(max_len))
    return _as(out[0], dtype)


def linear_attention(q, k, v, offsets, log_decay, intra, tail, lead):
    """Causal linear attention with a fixed per-head decay (see mindgr.ops.attention): a recurrent scan
    per (row, head), its backward one scan each way; the chunked form's tables are not needed.
    Deterministic and independent of the thread count."""
    dtype = q.dtype
    out = _P.linattn_fwd(_as(q, ms.float32), _as(k, ms.float32), _as(v, ms.float32), offsets,
                         _as(log_decay, ms.float32))
    return _as(out, dtype)


def jagged_to_padded(values, offsets, max_len: int):
    """values [T, *F] -> [B, N, *F], zeros past each row's length (rows longer than N are cut)."""
    return _P.j2p(values, offsets, _zeros_carrier(max_len))


def padded_to_jagged(padded, offsets, num_tokens: int):
    """padded [B, N, *F] -> [T, *F]; tokens outside every row (the unused tail) are zero."""
    return _P.p2j(padded, offsets, _zeros_carrier(num_tokens))


def sampled_logits(out, table, ids, score_all: bool = False):
    """logits[t, r] = out[t] . table[ids[t, r]]: out [T, D], table [V+1, D], ids [T, R] int32/int64
    (every id in [0, V]) -> [T, R] float32, without materialising [T, V+1] or [T, R, D] (so score_all,
    the reference's choice between those two, does not apply). Gradients
    flow to out and table (deterministic, independent of the thread count); ids get zeros."""
    if ids.dtype != ms.int64:
        ids = _as(ids, ms.int32)
    return _P.sampled_logits(_as(out, ms.float32), _as(table, ms.float32), ids)


def sampled_lse(x, table, ids, targets, pos, score_all: bool = False):
    """lse[t] = log(exp(pos[t]) + sum_{r: ids[t, r] != targets[t]} exp(x[t] . table[ids[t, r]])) for
    targets[t] > 0, else 0: x [T, D], table [V+1, D], ids [T, R], targets [T], pos [T] -> [T] float32.
    The sampled-softmax loss tail (accidental-hit mask, log-sum-exp with the positive) fused with the
    scoring: the one [T, R] tensor it leaves is the negatives' softmax weights, kept with d lse / d x [T, D] for
    the backward (so that it neither scores nor gathers again). Gradients flow to x, table and pos (deterministic,
    independent of the thread count); the reference is sampled_logits + mask + logsumexp (score_all, the
    reference's choice of how to score, does not apply)."""
    if ids.dtype != ms.int64:
        ids = _as(ids, ms.int32)
    return _P.sampled_lse(_as(x, ms.float32), _as(table, ms.float32), ids, _as(targets, ms.int32),
                          _as(pos, ms.float32))[0]


def shared_pool_lse(x, cand, logq, cand_ids, targets, pos):
    """lse[t] = log(exp(pos[t]) + sum_{k: ids[k] != 0, ids[k] != targets[t]} exp(x[t] . cand[k] - logq[k]))
    for targets[t] > 0, else 0: x [T, D], cand [K, D] float32 or float16, logq [K], cand_ids [K],
    targets [T], pos [T] -> [T] float32. Streams over K in chunks (never [T, K]); gradients flow to
    x, cand (in its dtype), logq and pos, deterministically and independent of the thread count."""
    args = (_as(x, ms.float32), cand, _as(logq, ms.float32), _as(cand_ids, ms.int32), _as(targets, ms.int32),
            _as(pos, ms.float32))
    if cand.dtype == ms.float16:
        return _P.pool_lse(*args)
    return _P.pool_lse(args[0], _as(cand, ms.float32), *args[2:])


def _eps(eps: float):
    return ops.full((1,), eps, dtype=ms.float32)


def layer_norm(x, eps: float = 1e-6):
    """(x - mean) / sqrt(var + eps) over the last axis, no scale or shift (HSTU's LayerNorm): one pass over
    x forward, one over (x, dy) backward (the row statistics are recomputed, nothing saved); see reference."""
    dtype = x.dtype
    return _as(_P.layer_norm(_as(x, ms.float32), _eps(eps)), dtype)


def gated_layer_norm(u, y, eps: float = 1e-6):
    """u * layer_norm(y) (HSTU's u * LayerNorm(A v)), u and y of the same shape [.., D], forward and
    backward (du, dy) each in one pass over their [.., D] inputs; see reference."""
    dtype = y.dtype
    return _as(_P.gated_layer_norm(_as(u, ms.float32), _as(y, ms.float32), _eps(eps)), dtype)


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2, -1) + eps^2) over the last axis: one pass over x forward, one over (x, dy) backward;
    see reference."""
    dtype = x.dtype
    return _as(_P.l2_normalize(_as(x, ms.float32), _eps(eps)), dtype)


def silu_split(x, widths):
    """split(SiLU(x), widths, axis=-1) in one pass over x forward and one over (x, gradients) backward,
    which writes x's gradient once (no zero-filled slice gradients); see reference. 1 to 4 outputs (more:
    the reference)."""
    k = len(widths)
    if k > 4:
        return _reference_silu_split(x, widths)
    dtype = x.dtype
    xf = _as(x, ms.float32)
    c = [_zeros_carrier(w) for w in widths]
    if k == 1:
        outs = _P.silu_split1(xf, c[0])
    elif k == 2:
        outs = _P.silu_split2(xf, c[0], c[1])
    elif k == 3:
        outs = _P.silu_split3(xf, c[0], c[1], c[2])
    else:
        outs = _P.silu_split4(xf, c[0], c[1], c[2], c[3])
    return tuple(_as(o, dtype) for o in outs)


# The backend registry's view of this module (mindgr.ops.backend).
PROVIDES = {"hstu_attention": hstu_attention, "bias_attention": bias_attention,
            "softmax_attention": softmax_attention, "linear_attention": linear_attention,
            "jagged_to_padded": jagged_to_padded,
            "padded_to_jagged": padded_to_jagged, "sampled_logits": sampled_logits,
            "sampled_lse": sampled_lse, "shared_pool_lse": shared_pool_lse,
            "layer_norm": layer_norm, "gated_layer_norm": gated_layer_norm, "silu_split": silu_split,
            "l2_normalize": l2_normalize}
