"""The CPU backend's kernel table: one row per forward kernel, from which the package makes the MindSpore
Custom primitives and their backward registrations (mindgr/ops/cpu/__init__.py `_Primitives`).

A row names the public op it serves (`mindgr.ops.backend.OPS`), the C++ symbols of its forward and backward,
the forward's inputs and outputs, the output shape and dtype rules MindSpore needs (functions of the
inputs' shapes / dtypes), and how the backward is called:

    backward(*[inputs[i] for i in bwd_inputs], *saved outputs if reads_out, dout)  ->  gradients

where dout is the forward's one output gradient ("one"), that of its first output ("first": the other
outputs are saved for the backward only) or all of them ("all"); the gradients go to the inputs named in
`grads`, in that order (cast to the input's dtype for those in `cast_grads`); every other input gets zeros.
Lengths that are not a dimension of an input (N, T, the widths w_k) travel as the length of a zeros
"carrier" input. `variadic` rows take 1 + K inputs (K = 1 to 4 carriers), one primitive per K. The jagged
pair's backward is the other one's forward (`backward_is_forward_of`).

A new kernel: its .cc (entry points through `MINDGR_AOT_OP`, arguments checked with `MINDGR_REJECT_IF` and
codes from arg_errors.def), its file in `build.SOURCES`, one row here, and the public function that calls
`_P.<key>` in mindgr/ops/cpu/__init__.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class KernelRow:
    key: str                 # the primitive's name in `_P` (its backward: key + "_bwd")
    op: str                  # the public op (mindgr.ops.backend.OPS) this kernel computes
    forward: str             # C++ symbol of the forward
    inputs: tuple            # the forward's inputs, in order
    outputs: tuple           # the forward's outputs
    out_shape: Callable      # shapes of the inputs -> output shape(s)
    out_dtype: Callable      # dtypes of the inputs -> output dtype(s)
    backward: str            # C++ symbol that computes the gradients
    grads: tuple             # the inputs that get gradients, in the backward's output order
    grad_shape: Callable = None   # shapes of the backward's inputs -> its output shape(s)
    grad_dtype: Callable = None
    bwd_inputs: tuple = None      # the forward inputs the backward reads (None: all)
    reads_out: bool = False       # the backward also reads the forward's outputs
    dout: str = "one"             # "one", "first" or "all" (see above)
    cast_grads: tuple = ()        # inputs whose gradient is cast to their own dtype
    variadic: bool = False        # inputs: x then K carriers (one primitive per K)
    backward_is_forward_of: str = None   # key of the row whose forward is this one's gradient
    note: str = ""


def _t(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


TABLE = (
    KernelRow("hstu_fwd_ts", "hstu_attention", "MindgrHstuFwd",
              _t("q, k, v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N"), _t("out [T, H, dv]"),
              lambda q, k, v, o, t, r, wp, wt, c: v, lambda q, k, v, o, t, r, wp, wt, c: v,
              "MindgrHstuBwd", _t("q, k, v, w_pos, w_ts"),
              lambda q, k, v, o, t, r, wp, wt, c, d: (q, k, v, wp, wt),
              lambda q, k, v, o, t, r, wp, wt, c, d: (q, k, v, wp, wt)),
    KernelRow("hstu_fwd", "hstu_attention", "MindgrHstuFwdNoTs",
              _t("q, k, v, offsets, w_pos, carrier_N"), _t("out [T, H, dv]"),
              lambda q, k, v, o, wp, c: v, lambda q, k, v, o, wp, c: v,
              "MindgrHstuBwdNoTs", _t("q, k, v, w_pos"),
              lambda q, k, v, o, wp, c, d: (q, k, v, wp), lambda q, k, v, o, wp, c, d: (q, k, v, wp),
              note="w_ts is None"),
    KernelRow("bias_fwd_ts", "bias_attention", "MindgrBiasAttnFwd",
              _t("v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N"), _t("out [T, H, 2, dv]"),
              lambda v, o, t, r, wp, wt, c: [v[0], v[1], 2, v[2]], lambda v, o, t, r, wp, wt, c: v,
              "MindgrBiasAttnBwd", _t("v, w_pos, w_ts"),
              lambda v, o, t, r, wp, wt, c, d: (v, wp, wt), lambda v, o, t, r, wp, wt, c, d: (v, wp, wt)),
    KernelRow("bias_fwd", "bias_attention", "MindgrBiasAttnFwdNoTs",
              _t("v, offsets, w_pos, carrier_N"), _t("out [T, H, 1, dv]"),
              lambda v, o, wp, c: [v[0], v[1], 1, v[2]], lambda v, o, wp, c: v,
              "MindgrBiasAttnBwdNoTs", _t("v, w_pos"),
              lambda v, o, wp, c, d: (v, wp), lambda v, o, wp, c, d: (v, wp), note="w_ts is None"),
    KernelRow("softmax_fwd", "softmax_attention", "MindgrSoftmaxAttnFwd",
              _t("q, k, v, offsets, carrier_N"), _t("out [T, H, dv], lse [T, H]"),
              lambda q, k, v, o, c: (v, [q[0], q[1]]), lambda q, k, v, o, c: (v, v),
              "MindgrSoftmaxAttnBwd", _t("q, k, v"),
              lambda q, k, v, o, c, out, lse, d: (q, k, v), lambda q, k, v, o, c, out, lse, d: (q, k, v),
              reads_out=True, dout="first", note="the backward recomputes the weights from lse"),
    KernelRow("linattn_fwd", "linear_attention", "MindgrLinAttnFwd",
              _t("q, k, v, offsets, log_decay"), _t("out [T, H, dv]"),
              lambda q, k, v, o, g: v, lambda q, k, v, o, g: v,
              "MindgrLinAttnBwd", _t("q, k, v"),
              lambda q, k, v, o, g, d: (q, k, v), lambda q, k, v, o, g, d: (q, k, v),
              note="a recurrent scan; log_decay gets no gradient"),
    KernelRow("j2p", "jagged_to_padded", "MindgrJaggedToPadded",
              _t("values, offsets, carrier_N"), _t("padded [B, N, *F]"),
              lambda x, o, c: [o[0] - 1, c[0]] + list(x[1:]), lambda x, o, c: x,
              "MindgrPaddedToJagged", _t("values"), backward_is_forward_of="p2j"),
    KernelRow("p2j", "padded_to_jagged", "MindgrPaddedToJagged",
              _t("padded, offsets, carrier_T"), _t("values [T, *F]"),
              lambda p, o, c: [c[0]] + list(p[2:]), lambda p, o, c: p,
              "MindgrJaggedToPadded", _t("padded"), backward_is_forward_of="j2p"),
    KernelRow("sampled_logits", "sampled_logits", "MindgrSampledLogits",
              _t("out, table, ids"), _t("logits [T, R]"),
              lambda o, t, i: i, lambda o, t, i: o,
              "MindgrSampledLogitsBwd", _t("out, table"),
              lambda o, t, i, d: (o, t), lambda o, t, i, d: (o, t)),
    # the forward's probs [T, R] and u = d lse / d x [T, D] carry the backward's weights and d_x
    KernelRow("sampled_lse", "sampled_lse", "MindgrSampledLse",
              _t("x, table, ids, targets, pos"), _t("lse [T], probs [T, R], u [T, D]"),
              lambda x, t, i, g, p: (p, i, x), lambda x, t, i, g, p: (p, p, p),
              "MindgrSampledLseBwd", _t("x, table, pos"),
              lambda x, t, i, g, p, l, w, u, d: (x, t, p), lambda x, t, i, g, p, l, w, u, d: (x, x, p),
              reads_out=True, dout="first"),
    # d_cand comes out float32 and goes back in cand's dtype (float32 or float16)
    KernelRow("pool_lse", "shared_pool_lse", "MindgrPoolLse",
              _t("x, cand, logq, cand_ids, targets, pos"), _t("lse [T]"),
              lambda x, c, q, i, t, p: p, lambda x, c, q, i, t, p: p,
              "MindgrPoolLseBwd", _t("x, cand, logq, pos"),
              lambda x, c, q, i, t, p, l, g: (x, c, q, p), lambda x, c, q, i, t, p, l, g: (x, x, q, p),
              reads_out=True, cast_grads=_t("cand")),
    KernelRow("layer_norm", "layer_norm", "MindgrLayerNorm", _t("x, eps[1]"), _t("y"),
              lambda x, e: x, lambda x, e: x, "MindgrLayerNormBwd", _t("x"),
              lambda x, e, d: x, lambda x, e, d: x),
    KernelRow("gated_layer_norm", "gated_layer_norm", "MindgrGatedLayerNorm", _t("u, y, eps[1]"), _t("u * LN(y)"),
              lambda u, y, e: u, lambda u, y, e: u, "MindgrGatedLayerNormBwd", _t("u, y"),
              lambda u, y, e, d: (u, y), lambda u, y, e, d: (u, y)),
    KernelRow("l2_normalize", "l2_normalize", "MindgrL2Normalize", _t("x, eps[1]"), _t("x / sqrt(sum(x^2) + eps^2)"),
              lambda x, e: x, lambda x, e: x, "MindgrL2NormalizeBwd", _t("x"),
              lambda x, e, d: x, lambda x, e, d: x),
    KernelRow("silu_split", "silu_split", "MindgrSiluSplit", _t("x, carrier_w0 .. carrier_w{K-1}"),
              _t("out_0 .. out_{K-1}"),
              lambda x, *cars: tuple(list(x[:-1]) + [c[0]] for c in cars), lambda x, *cars: tuple(x for _ in cars),
              "MindgrSiluSplitBwd", _t("x"), lambda x, *d: x, lambda x, *d: x,
              bwd_inputs=(0,), dout="all", variadic=True, note="K = 1 to 4"),
)

ROWS = {row.key: row for row in TABLE}

# Plain C functions of the library (tests and reports), loaded and checked with the kernels.
HELPERS = ("mindgr_time_bucket", "mindgr_time_bucket_formula", "mindgr_num_threads", "mindgr_isa",
           "mindgr_vector_lanes", "mindgr_recip_probe", "mindgr_parallel_probe", "mindgr_arg_error_name",
           "mindgr_arg_error_text")


def kernel_symbols() -> tuple:
    """Every C++ kernel entry point of the table, each once, in table order."""
    seen = []
    for row in TABLE:
        for name in (row.forward, row.backward):
            if name not in seen:
                seen.append(name)
    return tuple(seen)


def op_of_symbol(symbol: str) -> str | None:
    """The op a kernel symbol serves: "<op>" for a forward, "<op> backward" for a gradient kernel (None if
    the symbol is not in the table). A symbol that is both (jagged <-> padded) is named as a forward."""
    for row in TABLE:
        if row.forward == symbol:
            return row.op
    for row in TABLE:
        if row.backward == symbol:
            return f"{row.op} backward"
    return None


def describe() -> str:
    """The registered kernels, one line per forward: inputs -> outputs [gradient kernel: inputs with gradients]."""
    lines = []
    for row in TABLE:
        note = f"; {row.note}" if row.note else ""
        lines.append(f"{row.op}: {row.forward}({', '.join(row.inputs)}) -> {', '.join(row.outputs)}"
                     f"   [{row.backward}: d {', '.join(row.grads)}{note}]")
    return "\n".join(lines)
