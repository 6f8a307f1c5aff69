"""The linear-attention block: causal retention with a fixed per-head decay, gated like HSTU's block.

Per block, for jagged tokens x [T, D] (rows given by offsets [B+1]):
    u, v, q, k = split(SiLU(LN(x) W_uvqk));  q scaled by dqk**-0.5
    S_t = gamma_h * S_{t-1} + k_t v_t^T      per row and head, S = 0 before a row's first token
    o_t = q_t^T S_t                          = sum_{j<=t, same row} gamma_h^(t-j) (q_t . k_j) v_j
    y   = x + Linear(Dropout(u * LN(o)))     (LN affine-free over all heads, as HSTU's u * LN(A v))
Parameters are named as HSTU's (`{prefix}.w_uvqk`, `{prefix}.w_out`, `{prefix}.b_out`); there is no
position or time bias: the decay encodes recency.

Which decay, and why. RetNet's multi-scale retention (Sun et al., 2023): a FIXED decay per head,
gamma_h = 1 - 2**(-5 - h), so head 0 remembers ~32 tokens, head 1 ~64, ... (head h ~2**(5+h)). Not a
data-dependent gate (GLA, Mamba-2): with a fixed gamma the state after n more tokens is the old state times
the scalar gamma_h**n, so "decay the shared prompt state by n decoded steps" is one scalar per head, which
is what decoding many beams over one shared prompt state exploits (the prompt part of every beam's
attention is q^T (gamma**n S_prompt)). No normaliser (RetNet's GroupNorm is replaced by HSTU's LN of the
gated output), no softmax: like HSTU's pointwise attention, a token's output is a plain sum over its past.

Training form: CHUNKED over the flat token stream (the ops reference, mindgr.ops.reference.linear_attention,
which the block calls through mindgr.ops.attention.jagged_linear_attention). The T tokens (padded with
zeros to a multiple of the chunk C) are cut into Nc = ceil(T / C) chunks of C consecutive tokens; a chunk
may hold the end of one row, whole rows and the start of another, so every product is masked by "same
row" (row ids from the offsets):
  - intra-chunk: (q k^T) * gamma^(i-j) [j <= i, same row] times v, one batched [C, C] product per chunk;
  - each chunk's contribution to the state of the row its last token belongs to, decayed to the chunk's
    end: K^T diag(gamma^(C-1-j) [row(j) = row(last)]) V  [H, Nc, dqk, dv];
  - the state entering chunk n: the sum over earlier chunks m whose last row is chunk n's first row
    (contiguous rows make every chunk between them that row's too) of gamma^(C (n-1-m)) * contribution(m),
    ONE [Nc, Nc] masked decay-matrix product per head (no loop, so autodiff gives the backward);
  - its readout: gamma^(i+1) q_i^T S_in(n) for the tokens of that first row.
Every decay is a constant of (gamma, C, Nc); only the row masks depend on the batch. The flat layout needs
no per-row padding (GR batches have many short rows and a long tail): the work is T*C for the chunks and
Nc^2 for the state pass, at the batch's static token capacity. Tokens past offsets[-1] give zeros.
The cpu ops backend runs a fused kernel instead (mindgr/ops/cpu/linear_attention.cc): the recurrent form,
one scan per (row, head) forward and one each way backward, which on a CPU beats the composed chunked ops
(the same function: the tests compare the two with each other and with a recurrent numpy reference).

Ascend mapping (UNVERIFIED, no Ascend device here): CANN's linear-attention primitives are the gated delta
rule pair: aclnnChunkGatedDeltaRule (chunked prefill / forward over variable-length sequences given
actual_seq_lengths, with a log-decay input g and the final states) and aclnnRecurrentGatedDeltaRule (the
token-by-token decode step over a state pool addressed by per-sequence ssm_state_indices: the shape of
a per-beam / shared-prompt state table). Their update is the delta rule S = a S + b k (v - a S^T k)^T
with L2-normalised q / k in bfloat16, so this block's plain decayed sum is not a setting of them (the
erase term cannot be switched off); fitting them means either a delta-rule backbone, or composing the
chunked form above from aclnn batched matmuls as here.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgr.models import layers
from mindgr.models.layers import apply_dropout, param, trunc_normal, xavier_uniform
from mindgr.ops.linear import linear
from mindgr.ops.norm import gated_layer_norm, layer_norm, silu_split
from mindgr.ops.attention import jagged_linear_attention
from mindgr.ops.backend import note_uses
from mindgr.ops.reference import token_rows

DEFAULT_CHUNK = 64
_MM_TA = ops.BatchMatMul(transpose_a=True)


def decay_rates(num_heads: int) -> np.ndarray:
    """RetNet's fixed multi-scale decays gamma_h = 1 - 2**(-5 - h), float32 [H]."""
    return (1.0 - 2.0 ** (-5.0 - np.arange(num_heads, dtype=np.float64))).astype(np.float32)


def decay_tables(decay, chunk: int):
    """The chunked form's constant decays for gammas `decay` [H] and chunk C, computed in float64 ->
    float32 numpy (intra [H, C, C]: gamma^(i-j) for j <= i, else 0; tail [H, C]: gamma^(C-1-j), a token's
    decay to its chunk's end; lead [H, C]: gamma^(i+1), the decay of the state entering the chunk)."""
    g = np.asarray(decay, np.float64).reshape(-1, 1)
    pos = np.arange(int(chunk), dtype=np.float64)
    diff = pos[:, None] - pos[None, :]
    intra = np.where(diff >= 0, g[:, :, None] ** np.maximum(diff, 0)[None], 0.0)
    return (intra.astype(np.float32), (g ** (chunk - 1 - pos)).astype(np.float32),
            (g ** (pos + 1)).astype(np.float32))


class LinearAttentionBlock(nn.Cell):
    """One linear-attention block (module docstring). h, dqk, dv; decay: np.float32 [H] (gamma_h).

    construct(x, offsets, timestamps=None, request_times=None, drop_mask=None) -> [T, D]: the signature
    of HSTUBlock's, so a decoder calls either the same way (timestamps and request_times are ignored).
    The pieces a cached decoder composes (plain MindSpore ops, no backend kernels):
    project(x) -> (u [T, H*dv], q [T, H, dqk] (scaled), k [T, H, dqk], v [T, H, dv]);
    finish(x, u, o [T, H*dv]) -> y (no dropout); prompt_forward(x, offsets, rows, row_len) -> (y, S);
    prompt_last(x, offsets, rows, row_len, last) -> (y at the last tokens, S): a prefill's last block."""

    def __init__(self, rng, dim, num_heads, dqk, dv, prefix, chunk: int = DEFAULT_CHUNK):
        super().__init__()
        note_uses("linear_attention")   # logs once if the backend runs it on the reference
        self.h, self.dqk, self.dv = num_heads, dqk, dv
        self.chunk = int(chunk)
        self.decay = decay_rates(num_heads)
        self.log_decay = Tensor(np.log(self.decay.astype(np.float64)).astype(np.float32))
        self.intra, self.tail, self.lead = (Tensor(a) for a in decay_tables(self.decay, self.chunk))
        self.scale = float(dqk) ** -0.5
        width = num_heads * (2 * dv + 2 * dqk)
        self.w_uvqk = param(trunc_normal(rng, (dim, width), 0.02), f"{prefix}.w_uvqk")
        self.w_out = param(xavier_uniform(rng, num_heads * dv, dim), f"{prefix}.w_out")
        self.b_out = param(np.zeros(dim, np.float32), f"{prefix}.b_out")

    def construct(self, x, offsets, timestamps=None, request_times=None, drop_mask=None):
        """x [T, D] -> [T, D] (training and the plain forward; the ops backend's fused glue as HSTU's)."""
        u, q, k, v = self._projected(x)
        return self._output(x, u, self._attention(q, k, v, offsets), drop_mask)

    def _projected(self, x):
        """construct's u [T, H*dv], q [T, H, dqk] (scaled), k [T, H, dqk], v [T, H, dv]: the backend's glue."""
        t = x.shape[0]
        hv, hqk = self.h * self.dv, self.h * self.dqk
        u, v, q, k = silu_split(linear(layer_norm(x), self.w_uvqk), (hv, hv, hqk, hqk))
        return (u, q.reshape(t, self.h, self.dqk) * self.scale, k.reshape(t, self.h, self.dqk),
                v.reshape(t, self.h, self.dv))

    def _attention(self, q, k, v, offsets):
        """The jagged causal linear attention of the heads, flattened -> [T, H*dv]."""
        attn = jagged_linear_attention(q, k, v, offsets, self.log_decay, self.intra, self.tail, self.lead)
        return attn.reshape(q.shape[0], self.h * self.dv)

    def _output(self, x, u, attn, drop_mask=None):
        """x + Linear(Dropout(u * LN(attn)))."""
        o = gated_layer_norm(u, attn)
        if drop_mask is not None:
            o = apply_dropout(o, drop_mask)
        return x + linear(o, self.w_out) + self.b_out

    # ---- the pieces of a cached forward (what a decoder built from these blocks generates with) ----------

    def project(self, x):
        """u [T, H*dv], q [T, H, dqk] (times dqk**-0.5), k [T, H, dqk], v [T, H, dv] of inputs x [T, D]: the
        backend's fused glue, as construct's (a decode step's few hundred rows: fewer ops per step)."""
        return self._projected(x)

    def finish(self, x, u, o):
        """The block's output from its attention output o [T, H*dv]: x + Linear(u * LN(o)) (no dropout)."""
        return self._output(x, u, o)

    def _project_plain(self, x):
        """project in plain MindSpore ops: where a custom op would cost more than it saves (prompt_last's
        few rows at the end of a long prefill graph, measured slower with the fused glue)."""
        t = x.shape[0]
        hv, hqk = self.h * self.dv, self.h * self.dqk
        z = ops.silu(ops.matmul(layers.layer_norm(x), self.w_uvqk))
        u, v, q, k = ops.split(z, [hv, hv, hqk, hqk], 1)
        return (u, q.reshape(t, self.h, self.dqk) * self.scale, k.reshape(t, self.h, self.dqk),
                v.reshape(t, self.h, self.dv))

    def prompt_forward(self, x, offsets, rows: int, row_len: int):
        """The block over prompts laid out one per `row_len` tokens (x [rows*row_len, D]: row r's prompt is
        the jagged row holding token r*row_len, the rest of its stride another row or padding, as
        mindgr.models.kv_cache.prompt_batch lays them out) -> (y [T, D], S [rows, H, dqk, dv]): each
        prompt's state after its last token (its tokens only: what follows in the stride neither adds to
        nor decays it). One projection serves both."""
        u, q, k, v = self._projected(x)
        y = self._output(x, u, self._attention(q, k, v, offsets))
        return y, self._prompt_states(k, v, offsets, rows, row_len)

    def prompt_last(self, x, offsets, rows: int, row_len: int, last):
        """prompt_forward for the LAST block of a prefill, whose outputs are read only at each prompt's last
        token (last [rows], flat token indices) -> (y [rows, D] at those tokens, S [rows, H, dqk, dv]).
        Every token still gives its k and v to the state (only those columns of W_uvqk are projected), but
        no other token's attention or output is computed: the last token's output is q^T S, its state
        including itself."""
        t = x.shape[0]
        hv, hqk = self.h * self.dv, self.h * self.dqk
        w = self.w_uvqk
        w_vk = ops.concat((ops.narrow(w, 1, hv, hv), ops.narrow(w, 1, 2 * hv + hqk, hqk)), 1)
        v, k = silu_split(linear(layer_norm(x), w_vk), (hv, hqk))
        s = self._prompt_states(k.reshape(t, self.h, self.dqk), v.reshape(t, self.h, self.dv), offsets, rows,
                                row_len)
        x_last = ops.gather(x, last, 0)
        u, q, _, _ = self._project_plain(x_last)
        o = ops.matmul(q.reshape(rows, self.h, 1, self.dqk), s).reshape(rows, self.h * self.dv)
        return x_last + ops.matmul(u * layers.layer_norm(o), self.w_out) + self.b_out, s

    def _prompt_states(self, k, v, offsets, rows: int, row_len: int):
        """S = sum_j gamma^(n-1-j) k_j v_j^T over each prompt's n tokens (prompt_forward's layout)."""
        num_rows = offsets.shape[0] - 1
        seg = token_rows(offsets, k.shape[0]).reshape(rows, row_len)
        mine = ops.logical_and(seg == ops.narrow(seg, 1, 0, 1), seg < num_rows)       # [rows, L]
        n = mine.astype(ms.float32).sum(1, keepdims=True)                             # [rows, 1] prompt length
        age = n - 1.0 - ops.arange(row_len).astype(ms.float32).reshape(1, row_len)    # steps to the last token
        w = ops.exp(ops.expand_dims(ops.maximum(age, 0.0), 2) * self.log_decay.reshape(1, 1, self.h))
        w = w * ops.expand_dims(mine.astype(ms.float32), 2)                           # [rows, L, H] gamma^age
        kw = (k.reshape(rows, row_len, self.h, self.dqk) * ops.expand_dims(w, 3)).reshape(rows, row_len, -1)
        # every head pair in one product over the tokens (no [T]-sized transposes), then the diagonal blocks
        full = _MM_TA(kw, v.reshape(rows, row_len, self.h * self.dv))                # [rows, H*dqk, H*dv]
        full = full.reshape(rows, self.h, self.dqk, self.h, self.dv).transpose(0, 1, 3, 2, 4)
        diag = Tensor(np.arange(self.h) * (self.h + 1), ms.int32)
        return ops.gather(full.reshape(rows, self.h * self.h, self.dqk, self.dv), diag, 1)   # [rows, H, dqk, dv]


def encoder_flops(model_cfg, lengths, chunk: int = DEFAULT_CHUNK) -> float:
    """Forward FLOPs of linear-attention blocks for rows of these token lengths (conventions:
    mindgr.train.flops): per block and real token the projections as HSTU's, 2*D*H*(2dv+2dqk) + 2*H*dv*D;
    per head the chunked form's work a row needs, its tokens chunked from the row's start: intra-chunk pairs
    (causal half, diagonal included) x (2*dqk + 2*dv), each token's k v^T into its chunk's state and q against
    the incoming state, 2 x 2*dqk*dv, and the state pass, 2*dqk*dv per pair of the row's chunks. Products the
    flat batch layout masks out (other rows sharing a chunk, padding) are not counted, as HSTU's count leaves
    out the masked half."""
    from mindgr.models.hstu import head_widths
    m = model_cfg
    lengths = np.asarray(lengths, dtype=np.int64)
    d, h = m.dim, m.num_heads
    dqk, dv = head_widths(m)
    c = int(chunk)
    per_token = 2 * d * h * (2 * dv + 2 * dqk) + 2 * h * dv * d + h * 4 * dqk * dv
    full, rest = lengths // c, lengths % c
    pairs = full * (c * (c + 1) // 2) + rest * (rest + 1) // 2
    chunks = full + (rest > 0)
    attn = h * ((2 * dqk + 2 * dv) * float(pairs.sum()) + 2 * dqk * dv * float((chunks * (chunks - 1) // 2).sum()))
    return m.num_blocks * (per_token * float(lengths.sum()) + attn)
