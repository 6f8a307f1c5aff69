"""The CPU backend's kernel table: one row per C++ forward entry point, with its gradient kernel.

Each row names the public op it serves (`mindgr.ops.backend.OPS`), the C++ symbols of its forward and
backward, the inputs and outputs of the forward (N / T / w_k: the length carried by a zeros "carrier"
input, see the package docstring) and which inputs get gradients (the others get zeros). The library
loader checks every symbol named here, argument errors name the op of the failing symbol
(`errors.py`), and `describe()` is the listing of the registered ops. A new kernel: its .cc (entry
points through `MINDGR_AOT_OP`, arguments checked with `MINDGR_REJECT_IF`), its file in
`build.SOURCES`, one row here, and its primitive in `_Primitives` (mindgr/ops/cpu/__init__.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelRow:
    op: str                 # the public op (mindgr.ops.backend.OPS) this kernel computes
    forward: str            # C++ symbol of the forward
    inputs: tuple           # the forward's inputs, in order
    outputs: tuple          # the forward's outputs
    backward: str           # C++ symbol that computes the gradients
    grads: tuple            # the inputs that get gradients (the others: zeros)
    note: str = ""


def _t(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


TABLE = (
    KernelRow("hstu_attention", "MindgrHstuFwd", _t("q, k, v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N"),
              _t("out [T, H, dv]"), "MindgrHstuBwd", _t("q, k, v, w_pos, w_ts")),
    KernelRow("hstu_attention", "MindgrHstuFwdNoTs", _t("q, k, v, offsets, w_pos, carrier_N"),
              _t("out [T, H, dv]"), "MindgrHstuBwdNoTs", _t("q, k, v, w_pos"), "w_ts is None"),
    KernelRow("bias_attention", "MindgrBiasAttnFwd", _t("v, offsets, timestamps, request_times, w_pos, w_ts, carrier_N"),
              _t("out [T, H, 2, dv]"), "MindgrBiasAttnBwd", _t("v, w_pos, w_ts")),
    KernelRow("bias_attention", "MindgrBiasAttnFwdNoTs", _t("v, offsets, w_pos, carrier_N"),
              _t("out [T, H, 1, dv]"), "MindgrBiasAttnBwdNoTs", _t("v, w_pos"), "w_ts is None"),
    KernelRow("softmax_attention", "MindgrSoftmaxAttnFwd", _t("q, k, v, offsets, carrier_N"),
              _t("out [T, H, dv], lse [T, H]"), "MindgrSoftmaxAttnBwd", _t("q, k, v"),
              "the backward also reads out and lse"),
    KernelRow("linear_attention", "MindgrLinAttnFwd", _t("q, k, v, offsets, log_decay"),
              _t("out [T, H, dv]"), "MindgrLinAttnBwd", _t("q, k, v")),
    KernelRow("jagged_to_padded", "MindgrJaggedToPadded", _t("values, offsets, carrier_N"),
              _t("padded [B, N, *F]"), "MindgrPaddedToJagged", _t("values"), "gradient: padded_to_jagged"),
    KernelRow("padded_to_jagged", "MindgrPaddedToJagged", _t("padded, offsets, carrier_T"),
              _t("values [T, *F]"), "MindgrJaggedToPadded", _t("padded"), "gradient: jagged_to_padded"),
    KernelRow("sampled_logits", "MindgrSampledLogits", _t("out, table, ids"),
              _t("logits [T, R]"), "MindgrSampledLogitsBwd", _t("out, table")),
    KernelRow("sampled_lse", "MindgrSampledLse", _t("x, table, ids, targets, pos"),
              _t("lse [T], probs [T, R], u [T, D]"), "MindgrSampledLseBwd", _t("x, table, pos"),
              "the backward also reads lse, probs and u"),
    KernelRow("shared_pool_lse", "MindgrPoolLse", _t("x, cand, logq, cand_ids, targets, pos"),
              _t("lse [T]"), "MindgrPoolLseBwd", _t("x, cand, logq, pos"),
              "the backward also reads lse; d_cand in cand's dtype"),
    KernelRow("layer_norm", "MindgrLayerNorm", _t("x, eps[1]"), _t("y"), "MindgrLayerNormBwd", _t("x")),
    KernelRow("gated_layer_norm", "MindgrGatedLayerNorm", _t("u, y, eps[1]"), _t("u * LN(y)"),
              "MindgrGatedLayerNormBwd", _t("u, y")),
    KernelRow("l2_normalize", "MindgrL2Normalize", _t("x, eps[1]"), _t("x / sqrt(sum(x^2) + eps^2)"),
              "MindgrL2NormalizeBwd", _t("x")),
    KernelRow("silu_split", "MindgrSiluSplit", _t("x, carrier_w0 .. carrier_w{K-1}"),
              _t("out_0 .. out_{K-1}"), "MindgrSiluSplitBwd", _t("x"), "K = 1 to 4"),
)

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
    """The registered ops, one line per forward: inputs -> outputs (gradient kernel: inputs with gradients)."""
    lines = []
    for row in TABLE:
        note = f"; {row.note}" if row.note else ""
        lines.append(f"{row.op}: {row.forward}({', '.join(row.inputs)}) -> {', '.join(row.outputs)}"
                     f"   [{row.backward}: d {', '.join(row.grads)}{note}]")
    return "\n".join(lines)
