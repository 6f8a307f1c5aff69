"""Ascend backend of the jagged HSTU attention: AscendC custom ops run through MindSpore `ops.Custom`
(func_type="aot", the aclnn path of MindSpore 2.10), with a bprop that calls the fused backward op.

    hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len, request_times=None) -> [T, H, dv]
        same contract as mindgr.ops.reference / mindgr.ops.cpu (w_ts=None: no time bias; request_times
        [B] int64, the query time of each row's last position; None: that position's own time)
    unavailable_reason() -> None when usable here, else a one-line reason

Registered ops (sources in op_host/ and op_kernel/, built by scripts/build_ascend_ops.sh):
    HstuJaggedAttention(q, k, v, offsets, timestamps, request_times, w_pos, w_ts; max_len) -> out
    HstuJaggedAttentionGrad(dout, q, k, v, offsets, timestamps, request_times, w_pos, w_ts; max_len)
        -> dq, dk, dv, dw_pos, dw_ts
The request_times input (the published convention's query time at each row's last position) was
added to the AscendC sources to match the CPU kernels; it has NOT been compiled or run on Ascend
hardware (no CANN toolchain here): tests/unit/ops/test_ops_ascend_sources.py checks the sources agree with
this module and a numpy emulation of the kernels' decomposition against the reference.
Without a time bias the wrapper passes w_ts = [0.0] (one bucket, zero weight): the kernels then add
exactly 0 to every score, and the discarded dw_ts costs one reduction per chunk.

Importing this module never imports anything Ascend-only and never fails; the Custom primitives are
created on first use (creating one on Ascend compiles a small aclnn callback with g++ and reads the
installed op's aclnn header, see MindSpore's ops.Custom).
"""
from __future__ import annotations

import glob
import os
import threading

OP_FWD = "HstuJaggedAttention"
OP_BWD = "HstuJaggedAttentionGrad"
# Input / output / attribute names: must equal the OpDef in op_host/*.cpp (tests parse both).
FWD_INPUTS = ("q", "k", "v", "offsets", "timestamps", "request_times", "w_pos", "w_ts")
FWD_OUTPUTS = ("out",)
BWD_INPUTS = ("dout",) + FWD_INPUTS
BWD_OUTPUTS = ("dq", "dk", "dv", "dw_pos", "dw_ts")
ATTRS = (("max_len", "int"),)
VENDOR = "mindgr"
HERE = os.path.dirname(os.path.abspath(__file__))
ACLNN_HEADERS = ("aclnn_hstu_jagged_attention.h", "aclnn_hstu_jagged_attention_grad.h")

_lock = threading.Lock()
_prims: dict = {}


def _opp_paths():
    paths = [p for p in os.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    opp = os.environ.get("ASCEND_OPP_PATH")
    if opp:
        paths += sorted(glob.glob(os.path.join(opp, "vendors", "*")))
    return paths


def installed_package() -> str | None:
    """The custom op package (vendor directory) that provides both ops' aclnn headers, if any."""
    for path in _opp_paths():
        inc = os.path.join(path, "op_api", "include")
        if all(os.path.isfile(os.path.join(inc, h)) for h in ACLNN_HEADERS):
            return path
    return None


def unavailable_reason() -> str | None:
    """None when the ops can run here (device Ascend, package installed), else a one-line reason."""
    try:
        import mindspore as ms
    except ImportError:
        return "MindSpore is not installed"
    target = ms.get_context("device_target")
    if target != "Ascend":
        return f"the device is {target}, not Ascend"
    if not os.environ.get("ASCEND_OPP_PATH") and not os.environ.get("ASCEND_HOME_PATH"):
        return "the CANN environment is not set (source <CANN>/set_env.sh: ASCEND_OPP_PATH is missing)"
    if installed_package() is None:
        return ("the custom op package is not installed: run scripts/build_ascend_ops.sh and add its vendor "
                "directory to ASCEND_CUSTOM_OPP_PATH")
    return None


def _reg_info(name, inputs, outputs, out_dtypes_of):
    """CustomRegOp info: one dtype_format row per activation dtype (float32, float16, bfloat16)."""
    from mindspore.ops import CustomRegOp, DataType
    reg = CustomRegOp(name)
    for i, n in enumerate(inputs):
        reg = reg.input(i, n, "required")
    for i, n in enumerate(outputs):
        reg = reg.output(i, n, "required")
    for attr, kind in ATTRS:
        reg = reg.attr(attr, "required", kind)
    fixed = {"offsets": DataType.I32_Default, "timestamps": DataType.I64_Default,
             "request_times": DataType.I64_Default,
             "w_pos": DataType.F32_Default, "w_ts": DataType.F32_Default,
             "dw_pos": DataType.F32_Default, "dw_ts": DataType.F32_Default}
    for act in (DataType.F32_Default, DataType.F16_Default, DataType.BF16_Default):
        row = [fixed.get(n, act) for n in inputs] + [fixed.get(n, act) for n in outputs]
        reg = reg.dtype_format(*row)
    return reg.target("Ascend").get_op_info()


def _primitives():
    """(forward, backward) Custom primitives, created once per process."""
    with _lock:
        if "fwd" in _prims:
            return _prims["fwd"], _prims["bwd"]
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"the Ascend HSTU attention ops cannot run here: {reason}")
        from mindspore import ops

        bwd = ops.Custom(
            "aclnn" + OP_BWD,
            out_shape=lambda do, q, k, v, o, t, r, wp, wt, n: (q, k, v, wp, wt),
            out_dtype=lambda do, q, k, v, o, t, r, wp, wt, n: (q, k, v, wp, wt),
            func_type="aot", bprop=None,
            reg_info=_reg_info(OP_BWD, BWD_INPUTS, BWD_OUTPUTS, None))

        def bprop(q, k, v, off, ts, req, wp, wt, n, out, dout):
            dq, dk, dv, dwp, dwt = bwd(dout, q, k, v, off, ts, req, wp, wt, n)
            return dq, dk, dv, ops.zeros_like(off), ops.zeros_like(ts), ops.zeros_like(req), dwp, dwt, 0

        fwd = ops.Custom(
            "aclnn" + OP_FWD,
            out_shape=lambda q, k, v, o, t, r, wp, wt, n: (q[0], q[1], v[2]),
            out_dtype=lambda q, k, v, o, t, r, wp, wt, n: q,
            func_type="aot", bprop=bprop,
            reg_info=_reg_info(OP_FWD, FWD_INPUTS, FWD_OUTPUTS, None))
        _prims["fwd"], _prims["bwd"] = fwd, bwd
        return fwd, bwd


def hstu_attention(q, k, v, offsets, timestamps, w_pos, w_ts, max_len: int, request_times=None):
    """out_i = sum_{j<=i} SiLU(q_i.k_j + w_pos[N-1+j-i] (+ w_ts[bucket])) / N * v_j; see reference.

    q, k, v share one dtype (float32, float16 or bfloat16); the op computes in float32 and returns
    that dtype. w_pos / w_ts are float32 (cast here otherwise)."""
    import mindspore as ms
    from mindspore import ops

    fwd, _ = _primitives()
    n = int(max_len)
    if w_pos.shape[0] < 2 * n - 1:
        raise ValueError(f"w_pos has {w_pos.shape[0]} entries, needs 2 * max_len - 1 = {2 * n - 1}")
    if k.dtype != q.dtype:
        k = k.astype(q.dtype)
    if v.dtype != q.dtype:
        v = v.astype(q.dtype)
    if w_pos.dtype != ms.float32:
        w_pos = w_pos.astype(ms.float32)
    if offsets.dtype != ms.int32:
        offsets = offsets.astype(ms.int32)
    if w_ts is None:
        w_ts = ops.zeros((1,), ms.float32)
        if timestamps is None:
            timestamps = ops.zeros((q.shape[0],), ms.int64)
    elif w_ts.dtype != ms.float32:
        w_ts = w_ts.astype(ms.float32)
    if timestamps.dtype != ms.int64:
        timestamps = timestamps.astype(ms.int64)
    if request_times is None:
        from mindgr.ops.reference import default_request_times
        request_times = default_request_times(offsets, timestamps, n)
    elif request_times.dtype != ms.int64:
        request_times = request_times.astype(ms.int64)
    return fwd(q, k, v, offsets, timestamps, request_times, w_pos, w_ts, n)


# The backend registry's view of this module (mindgr.ops.backend): the other ops run the reference.
PROVIDES = {"hstu_attention": hstu_attention}
