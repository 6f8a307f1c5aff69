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
from mindgr.ops.cpu.table import HELPERS, kernel_symbols


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
# Custom primitives, created once on first use (the attribute access also works while a graph is
# being compiled: the properties run in Python during parsing).

def _aot(name: str, out_shape, out_dtype, bprop=None):
    return ops.Custom(f"{_library()}:{name}", out_shape=out_shape, out_dtype=out_dtype,
                      func_type="aot", bprop=bprop)


def _zeros_carrier(n: int):
    return ops.zeros((n,), ms.float32)


class _Primitives:
    """Lazily created Custom ops; one instance per process."""

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

    # HSTU attention with time bias ------------------------------------------------------------
    @property
    def hstu_bwd_ts(self):
        return self._get("hstu_bwd_ts", lambda: _aot(
            "MindgrHstuBwd",
            lambda q, k, v, o, t, r, wp, wt, c, d: (q, k, v, wp, wt),
            lambda q, k, v, o, t, r, wp, wt, c, d: (q, k, v, wp, wt)))

    @property
    def hstu_fwd_ts(self):
        def make():
            bwd = self.hstu_bwd_ts

            def bprop(q, k, v, off, ts, req, wp, wt, car, out, dout):
                dq, dk, dv, dwp, dwt = bwd(q, k, v, off, ts, req, wp, wt, car, dout)
                return (dq, dk, dv, ops.zeros_like(off), ops.zeros_like(ts), ops.zeros_like(req), dwp, dwt,
                        ops.zeros_like(car))

            return _aot("MindgrHstuFwd",
                        lambda q, k, v, o, t, r, wp, wt, c: v,
                        lambda q, k, v, o, t, r, wp, wt, c: v, bprop)
        return self._get("hstu_fwd_ts", make)

    # HSTU attention without time bias ---------------------------------------------------------
    @property
    def hstu_bwd(self):
        return self._get("hstu_bwd", lambda: _aot(
            "MindgrHstuBwdNoTs",
            lambda q, k, v, o, wp, c, d: (q, k, v, wp),
            lambda q, k, v, o, wp, c, d: (q, k, v, wp)))

    @property
    def hstu_fwd(self):
        def make():
            bwd = self.hstu_bwd

            def bprop(q, k, v, off, wp, car, out, dout):
                dq, dk, dv, dwp = bwd(q, k, v, off, wp, car, dout)
                return dq, dk, dv, ops.zeros_like(off), dwp, ops.zeros_like(car)

            return _aot("MindgrHstuFwdNoTs",
                        lambda q, k, v, o, wp, c: v,
                        lambda q, k, v, o, wp, c: v, bprop)
        return self._get("hstu_fwd", make)

    # FuXi-alpha bias-only channels (bias_attention.cc) ------------------------------------------
    @property
    def bias_bwd_ts(self):
        return self._get("bias_bwd_ts", lambda: _aot(
            "MindgrBiasAttnBwd",
            lambda v, o, t, r, wp, wt, c, d: (v, wp, wt),
            lambda v, o, t, r, wp, wt, c, d: (v, wp, wt)))

    @property
    def bias_fwd_ts(self):
        def make():
            bwd = self.bias_bwd_ts

            def bprop(v, off, ts, req, wp, wt, car, out, dout):
                dv, dwp, dwt = bwd(v, off, ts, req, wp, wt, car, dout)
                return (dv, ops.zeros_like(off), ops.zeros_like(ts), ops.zeros_like(req), dwp, dwt,
                        ops.zeros_like(car))

            return _aot("MindgrBiasAttnFwd",
                        lambda v, o, t, r, wp, wt, c: [v[0], v[1], 2, v[2]],
                        lambda v, o, t, r, wp, wt, c: v, bprop)
        return self._get("bias_fwd_ts", make)

    @property
    def bias_bwd(self):
        return self._get("bias_bwd", lambda: _aot(
            "MindgrBiasAttnBwdNoTs",
            lambda v, o, wp, c, d: (v, wp),
            lambda v, o, wp, c, d: (v, wp)))

    @property
    def bias_fwd(self):
        def make():
            bwd = self.bias_bwd

            def bprop(v, off, wp, car, out, dout):
                dv, dwp = bwd(v, off, wp, car, dout)
                return dv, ops.zeros_like(off), dwp, ops.zeros_like(car)

            return _aot("MindgrBiasAttnFwdNoTs",
                        lambda v, o, wp, c: [v[0], v[1], 1, v[2]],
                        lambda v, o, wp, c: v, bprop)
        return self._get("bias_fwd", make)

    # Causal softmax attention (softmax_attention.cc); the forward also returns lse [T, H] ----------
    @property
    def softmax_bwd(self):
        return self._get("softmax_bwd", lambda: _aot(
            "MindgrSoftmaxAttnBwd",
            lambda q, k, v, o, c, out, lse, d: (q, k, v),
            lambda q, k, v, o, c, out, lse, d: (q, k, v)))

    @property
    def softmax_fwd(self):
        def make():
            bwd = self.softmax_bwd

            def bprop(q, k, v, off, car, out, dout):
                dq, dk, dv = bwd(q, k, v, off, car, out[0], out[1], dout[0])
                return dq, dk, dv, ops.zeros_like(off), ops.zeros_like(car)

            return _aot("MindgrSoftmaxAttnFwd",
                        lambda q, k, v, o, c: (v, [q[0], q[1]]),
                        lambda q, k, v, o, c: (v, v), bprop)
        return self._get("softmax_fwd", make)

    # Linear attention (recurrent scan) ---------------------------------------------------------
    @property
    def linattn_bwd(self):
        return self._get("linattn_bwd", lambda: _aot(
            "MindgrLinAttnBwd",
            lambda q, k, v, o, g, d: (q, k, v),
            lambda q, k, v, o, g, d: (q, k, v)))

    @property
    def linattn_fwd(self):
        def make():
            bwd = self.linattn_bwd

            def bprop(q, k, v, off, lg, out, dout):
                dq, dk, dv = bwd(q, k, v, off, lg, dout)
                return dq, dk, dv, ops.zeros_like(off), ops.zeros_like(lg)

            return _aot("MindgrLinAttnFwd", lambda q, k, v, o, g: v, lambda q, k, v, o, g: v, bprop)
        return self._get("linattn_fwd", make)

    # Jagged <-> padded (each one's gradient is the other) -------------------------------------
    @property
    def _p2j_raw(self):
        return self._get("p2j_raw", lambda: _aot(
            "MindgrPaddedToJagged",
            lambda p, o, c: [c[0]] + list(p[2:]),
            lambda p, o, c: p))

    @property
    def _j2p_raw(self):
        return self._get("j2p_raw", lambda: _aot(
            "MindgrJaggedToPadded",
            lambda x, o, c: [o[0] - 1, c[0]] + list(x[1:]),
            lambda x, o, c: x))

    @property
    def j2p(self):
        def make():
            p2j = self._p2j_raw

            def bprop(values, off, car, out, dout):
                # the values themselves carry T
                return p2j(dout, off, values), ops.zeros_like(off), ops.zeros_like(car)

            return _aot("MindgrJaggedToPadded",
                        lambda x, o, c: [o[0] - 1, c[0]] + list(x[1:]),
                        lambda x, o, c: x, bprop)
        return self._get("j2p", make)

    @property
    def p2j(self):
        def make():
            j2p = self._j2p_raw

            def bprop(padded, off, car, out, dout):
                return j2p(dout, off, _zeros_carrier(padded.shape[1])), ops.zeros_like(off), ops.zeros_like(car)

            return _aot("MindgrPaddedToJagged",
                        lambda p, o, c: [c[0]] + list(p[2:]),
                        lambda p, o, c: p, bprop)
        return self._get("p2j", make)

    # Sampled scoring: logits[t, r] = out[t] . table[ids[t, r]] ---------------------------------
    @property
    def sampled_logits_bwd(self):
        return self._get("sampled_logits_bwd", lambda: _aot(
            "MindgrSampledLogitsBwd",
            lambda o, t, i, d: (o, t),
            lambda o, t, i, d: (o, t)))

    @property
    def sampled_logits(self):
        def make():
            bwd = self.sampled_logits_bwd

            def bprop(out, table, ids, res, dout):
                d_out, d_table = bwd(out, table, ids, dout)
                return d_out, d_table, ops.zeros_like(ids)

            return _aot("MindgrSampledLogits",
                        lambda o, t, i: i,
                        lambda o, t, i: o, bprop)
        return self._get("sampled_logits", make)

    # Sampled-softmax tail fused with the scoring: lse[t] over pos[t] and the kept negatives -----
    # (the forward's other outputs, probs [T, R] and u = d lse / d x [T, D], carry the backward's
    # weights and d_x: no rescoring, no gathers)
    @property
    def sampled_lse_bwd(self):
        return self._get("sampled_lse_bwd", lambda: _aot(
            "MindgrSampledLseBwd",
            lambda x, t, i, g, p, l, w, u, d: (x, t, p),
            lambda x, t, i, g, p, l, w, u, d: (x, x, p)))

    @property
    def sampled_lse(self):
        def make():
            bwd = self.sampled_lse_bwd

            def bprop(x, table, ids, tgt, pos, out, dout):
                d_x, d_table, d_pos = bwd(x, table, ids, tgt, pos, out[0], out[1], out[2], dout[0])
                return d_x, d_table, ops.zeros_like(ids), ops.zeros_like(tgt), d_pos

            return _aot("MindgrSampledLse",
                        lambda x, t, i, g, p: (p, i, x),
                        lambda x, t, i, g, p: (p, p, p), bprop)
        return self._get("sampled_lse", make)

    # Shared-pool log-sum-exp (streamed over the candidates, never [T, K]) --------------------------
    @property
    def pool_lse_bwd(self):
        return self._get("pool_lse_bwd", lambda: _aot(
            "MindgrPoolLseBwd",
            lambda x, c, q, i, t, p, l, g: (x, c, q, p),
            lambda x, c, q, i, t, p, l, g: (x, x, q, p)))  # d_cand is float32 even for fp16 candidates

    def _pool_lse(self, cand_dtype):
        """One primitive per candidate dtype: its bprop hands d_cand back in that dtype."""
        def make():
            bwd = self.pool_lse_bwd

            def bprop(x, cand, logq, ids, tgt, pos, lse, dlse):
                d_x, d_cand, d_logq, d_pos = bwd(x, cand, logq, ids, tgt, pos, lse, dlse)
                if cand_dtype != ms.float32:
                    d_cand = d_cand.astype(cand_dtype)
                return d_x, d_cand, d_logq, ops.zeros_like(ids), ops.zeros_like(tgt), d_pos

            return _aot("MindgrPoolLse",
                        lambda x, c, q, i, t, p: p,
                        lambda x, c, q, i, t, p: p, bprop)
        return self._get(("pool_lse", str(cand_dtype)), make)

    @property
    def pool_lse(self):
        return self._pool_lse(ms.float32)

    # Row LayerNorms of the block glue (layernorm.cc): the backward recomputes the row statistics ---
    @property
    def layer_norm_bwd(self):
        return self._get("layer_norm_bwd", lambda: _aot(
            "MindgrLayerNormBwd", lambda x, e, d: x, lambda x, e, d: x))

    @property
    def layer_norm(self):
        def make():
            bwd = self.layer_norm_bwd

            def bprop(x, eps, out, dout):
                return bwd(x, eps, dout), ops.zeros_like(eps)

            return _aot("MindgrLayerNorm", lambda x, e: x, lambda x, e: x, bprop)
        return self._get("layer_norm", make)

    @property
    def gated_layer_norm_bwd(self):
        return self._get("gated_layer_norm_bwd", lambda: _aot(
            "MindgrGatedLayerNormBwd", lambda u, y, e, d: (u, y), lambda u, y, e, d: (u, y)))

    @property
    def gated_layer_norm(self):
        def make():
            bwd = self.gated_layer_norm_bwd

            def bprop(u, y, eps, out, dout):
                du, dy = bwd(u, y, eps, dout)
                return du, dy, ops.zeros_like(eps)

            return _aot("MindgrGatedLayerNorm", lambda u, y, e: u, lambda u, y, e: u, bprop)
        return self._get("gated_layer_norm", make)

    @property
    def l2_normalize_bwd(self):
        return self._get("l2_normalize_bwd", lambda: _aot(
            "MindgrL2NormalizeBwd", lambda x, e, d: x, lambda x, e, d: x))

    @property
    def l2_normalize(self):
        def make():
            bwd = self.l2_normalize_bwd

            def bprop(x, eps, out, dout):
                return bwd(x, eps, dout), ops.zeros_like(eps)

            return _aot("MindgrL2Normalize", lambda x, e: x, lambda x, e: x, bprop)
        return self._get("l2_normalize", make)

    # SiLU of a projection split along its last axis (silu.cc): one primitive per number of outputs K,
    # the widths carried by K zero vectors of length w_k (shape inference reads their lengths) -----------
    def _silu_split(self, k: int):
        def make():
            bwd = _aot("MindgrSiluSplitBwd", lambda x, *d: x, lambda x, *d: x)
            z = ops.zeros_like

            # (graph mode needs a bprop of fixed arity: x, the k carriers, out, dout)
            def bprop1(x, c0, out, dout):
                return bwd(x, dout[0]), z(c0)

            def bprop2(x, c0, c1, out, dout):
                return bwd(x, dout[0], dout[1]), z(c0), z(c1)

            def bprop3(x, c0, c1, c2, out, dout):
                return bwd(x, dout[0], dout[1], dout[2]), z(c0), z(c1), z(c2)

            def bprop4(x, c0, c1, c2, c3, out, dout):
                return bwd(x, dout[0], dout[1], dout[2], dout[3]), z(c0), z(c1), z(c2), z(c3)

            bprop = (bprop1, bprop2, bprop3, bprop4)[k - 1]
            return _aot("MindgrSiluSplit", lambda x, *cars: tuple(list(x[:-1]) + [c[0]] for c in cars),
                        lambda x, *cars: tuple(x for _ in cars), bprop)
        return self._get(("silu_split", k), make)

    @property
    def silu_split1(self):
        return self._silu_split(1)

    @property
    def silu_split2(self):
        return self._silu_split(2)

    @property
    def silu_split3(self):
        return self._silu_split(3)

    @property
    def silu_split4(self):
        return self._silu_split(4)

    @property
    def pool_lse_fp16(self):
        return self._pool_lse(ms.float16)


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
        return _P.pool_lse_fp16(*args)
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
