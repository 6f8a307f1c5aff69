"""The linear-attention block (mindgr.models.linear_attention) against a plain recurrent numpy reference.

The reference walks every row token by token in float64: S = gamma * S + k v^T, o = q^T S (S = 0 at a
row's start). Checked: the chunked form's forward on jagged batches with rows of length 0, 1, N and a long
tail (a row over several chunks, lengths that are not multiples of the chunk, a partly filled last chunk,
tokens past offsets[-1]); its gradients against those of a dense O(T^2) masked form written here in
MindSpore (whose forward is itself checked against the reference); the whole block's forward and
gradients against central differences of the float64 numpy block; prompt_forward's states; project /
finish against construct.

Tolerances (float32 MindSpore vs float64 numpy): values rtol 1e-4 / atol 1e-5 (attention atol 1e-4 over
sums of up to ~60 terms); gradients along random directions d: |<g, d> - fd| <= 3e-4 sum|g d| + 1e-6, as
tests/unit/models/test_models_hstu.py.
"""

import numpy as np
import pytest

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402

from block_grad import BlockGrad, check_directional_grads  # noqa: E402
from mindgr.models.linear_attention import LinearAttentionBlock, decay_rates, decay_tables  # noqa: E402
from mindgr.ops import reference  # noqa: E402

pytestmark = pytest.mark.graph_mode("auto")

D, DQK, DV = 8, 3, 4


# ---- the numpy reference ------------------------------------------------------------------------------

def recurrent_attention(q, k, v, offsets, decay):
    """Per row, head and token: S = gamma_h S + k_t v_t^T; o_t = q_t^T S. -> (o [T, H, dv] (zeros past
    offsets[-1]), final state of every row [B, H, dqk, dv] (zeros for an empty row))."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    t, h, dqk = q.shape
    dv = v.shape[2]
    out = np.zeros((t, h, dv))
    states = np.zeros((len(offsets) - 1, h, dqk, dv))
    for b in range(len(offsets) - 1):
        for head in range(h):
            s = np.zeros((dqk, dv))
            for i in range(int(offsets[b]), int(offsets[b + 1])):
                s = decay[head] * s + np.outer(k[i, head], v[i, head])
                out[i, head] = q[i, head] @ s
            states[b, head] = s
    return out, states


def silu(x):
    return x / (1.0 + np.exp(-x))


def layer_norm(x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def numpy_block(p, offsets, h, decay):
    """The block's formulas in float64 with the recurrent attention."""
    x = p["x"]
    t = x.shape[0]
    z = silu(layer_norm(x) @ p["w_uvqk"])
    hv, hqk = h * DV, h * DQK
    u, v, q, k = np.split(z, np.cumsum([hv, hv, hqk]), axis=1)
    o, _ = recurrent_attention(q.reshape(t, h, DQK) * DQK ** -0.5, k.reshape(t, h, DQK), v.reshape(t, h, DV),
                               offsets, decay)
    return x + (u * layer_norm(o.reshape(t, hv))) @ p["w_out"] + p["b_out"]


# ---- MindSpore cells under test -----------------------------------------------------------------------

def dense_linear_attention(q, k, v, offsets, log_decay):
    """The O(T^2) masked form: o = ((q k^T) * gamma^(i-j) [j <= i, same row]) v per head (the test's second
    MindSpore path, for gradients)."""
    t, h, _ = q.shape
    num_rows = offsets.shape[0] - 1
    seg = ops.searchsorted(offsets[1:], ops.arange(t, dtype=offsets.dtype), right=True)
    pos = ops.arange(t).astype(ms.float32)
    diff = pos[:, None] - pos[None, :]
    keep = ops.logical_and(diff >= 0, seg[:, None] == seg[None, :])
    keep = ops.logical_and(keep, (seg < num_rows)[:, None])
    w = ops.exp(log_decay.reshape(h, 1, 1) * ops.maximum(diff, 0.0)[None]) * keep.astype(ms.float32)[None]
    scores = ops.matmul(q.transpose(1, 0, 2), k.transpose(1, 2, 0)) * w                 # [H, T, T]
    return ops.matmul(scores, v.transpose(1, 0, 2)).transpose(1, 0, 2)


def kernel_attention():
    """The cpu backend's linear_attention (the fused recurrent kernel), or None where it does not build."""
    from mindgr.ops import cpu
    return None if cpu.unavailable_reason() else cpu.linear_attention


class AttentionLoss(nn.Cell):
    """impl: "chunked" (the reference backend's form), "dense" (the O(T^2) form above), "kernel" (cpu)."""

    def __init__(self, h, chunk, impl="chunked"):
        super().__init__()
        self.dense = impl == "dense"
        self.fn = kernel_attention() if impl == "kernel" else reference.linear_attention
        self.log_decay = Tensor(np.log(decay_rates(h).astype(np.float64)).astype(np.float32))
        self.tables = tuple(Tensor(a) for a in decay_tables(decay_rates(h), chunk))

    def construct(self, q, k, v, offsets, c):
        if self.dense:
            o = dense_linear_attention(q, k, v, offsets, self.log_decay)
        else:
            o = self.fn(q, k, v, offsets, self.log_decay, *self.tables)
        return (o * c).sum(), o


class AttentionGrad(nn.Cell):
    def __init__(self, loss):
        super().__init__()
        self.fn = ms.value_and_grad(loss, grad_position=(0, 1, 2), has_aux=True)

    def construct(self, q, k, v, offsets, c):
        return self.fn(q, k, v, offsets, c)


def jagged(lengths, t_cap):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    assert offsets[-1] <= t_cap
    return offsets


# rows of length 0, 1, N and a long tail, all in one shape (T_cap 67, 9 rows: one compiled graph per cell;
# CI time): with chunk 8 the 37-token rows span 5 chunks and the last chunk is partly filled; 61 and 49
# tokens leave a tail past offsets[-1]; one token; no token; the last layout fills T_cap exactly, its first
# two rows ending on chunk boundaries.
T_CAP, ROWS = 67, 9
LAYOUTS = [(lengths + [0] * (ROWS - len(lengths)), T_CAP)
           for lengths in ([0, 3, 1, 37, 0, 5, 8, 7], [37, 1, 0, 9, 2], [1], [], [16, 16, 35])]


@pytest.mark.parametrize("h,chunk", [(1, 5), (1, 8), (1, 64), (3, 5), (3, 8), (3, 64)])
def test_chunked_attention_matches_recurrent_reference_and_dense_gradients(h, chunk):
    rng = np.random.default_rng([h, chunk])
    decay = decay_rates(h).astype(np.float64)
    chunked = AttentionGrad(AttentionLoss(h, chunk))
    dense = AttentionGrad(AttentionLoss(h, chunk, "dense"))
    for lengths, t_cap in LAYOUTS:
        offsets = jagged(lengths, t_cap)
        q = rng.standard_normal((t_cap, h, DQK)).astype(np.float32)
        k = rng.standard_normal((t_cap, h, DQK)).astype(np.float32)
        v = rng.standard_normal((t_cap, h, DV)).astype(np.float32)
        c = rng.standard_normal((t_cap, h, DV)).astype(np.float32)
        args = [Tensor(a) for a in (q, k, v, offsets, c)]
        ref, _ = recurrent_attention(q, k, v, offsets, decay)
        (f, o), grads = chunked(*args)
        (fd, od), grads_d = dense(*args)
        np.testing.assert_allclose(o.asnumpy(), ref, rtol=1e-4, atol=1e-4, err_msg=str(lengths))
        np.testing.assert_allclose(od.asnumpy(), ref, rtol=1e-4, atol=1e-4, err_msg=str(lengths))
        assert abs(float(f.asnumpy()) - float((ref * c).sum())) <= 1e-4 * (1 + abs(float((ref * c).sum())))
        for name, g, gd in zip("qkv", grads, grads_d):
            np.testing.assert_allclose(g.asnumpy(), gd.asnumpy(), rtol=1e-4, atol=1e-4, err_msg=f"d{name} {lengths}")
        # the tail past offsets[-1] is inert: no output, no gradient
        end = int(offsets[-1])
        assert not o.asnumpy()[end:].any() and not any(g.asnumpy()[end:].any() for g in grads)


def test_cpu_kernel_matches_the_chunked_form():
    """The cpu backend's fused recurrent kernel: forward and gradients equal the chunked reference's (and
    the recurrent numpy reference), tokens outside the rows (before offsets[0] too) inert. Value widths
    4, 40 and 136: one vector, an odd count in one block (3 vectors of AVX-512, 5 of AVX2) and more
    than one column block (8 + 1 vectors of AVX-512, 8 + 8 + 1 of AVX2)."""
    if kernel_attention() is None:
        pytest.skip("the C++ kernels do not build here")
    for h, dv in [(1, DV), (3, DV), (2, 40), (2, 136)]:
        rng = np.random.default_rng([21, h, dv])
        decay = decay_rates(h).astype(np.float64)
        kernel = AttentionGrad(AttentionLoss(h, 8, "kernel"))
        chunked = AttentionGrad(AttentionLoss(h, 8))
        for lengths, t_cap in LAYOUTS:
            offsets = jagged(lengths, t_cap)
            q, k = (rng.standard_normal((t_cap, h, DQK)).astype(np.float32) for _ in range(2))
            v, c = (rng.standard_normal((t_cap, h, dv)).astype(np.float32) for _ in range(2))
            args = [Tensor(a) for a in (q, k, v, offsets, c)]
            (_, o), grads = kernel(*args)
            (_, oc), grads_c = chunked(*args)
            ref, _ = recurrent_attention(q, k, v, offsets, decay)
            np.testing.assert_allclose(o.asnumpy(), ref, rtol=1e-4, atol=1e-4, err_msg=str(lengths))
            np.testing.assert_allclose(o.asnumpy(), oc.asnumpy(), rtol=1e-4, atol=1e-4, err_msg=str(lengths))
            for name, g, gc in zip("qkv", grads, grads_c):
                np.testing.assert_allclose(g.asnumpy(), gc.asnumpy(), rtol=1e-4, atol=1e-4,
                                           err_msg=f"d{name} {lengths}")
    # rows starting past token 0: the tokens before them give zeros too
    h, decay = 3, decay_rates(3).astype(np.float64)
    kernel = AttentionGrad(AttentionLoss(h, 8, "kernel"))
    offsets = np.asarray([3, 5, 9], np.int32)
    q, k = (rng.standard_normal((12, 3, DQK)).astype(np.float32) for _ in range(2))
    v, c = (rng.standard_normal((12, 3, DV)).astype(np.float32) for _ in range(2))
    (_, o), grads = kernel(*[Tensor(a) for a in (q, k, v, offsets, c)])
    ref, _ = recurrent_attention(q, k, v, offsets, decay)
    np.testing.assert_allclose(o.asnumpy(), ref, rtol=1e-4, atol=1e-4)
    assert not o.asnumpy()[:3].any() and not any(g.asnumpy()[:3].any() for g in grads)


def test_decays_are_retnets_and_cross_chunk_state_matters():
    np.testing.assert_allclose(decay_rates(3), [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128], rtol=1e-7)
    # a row over many chunks: the chunked output differs from the intra-chunk part alone (so the carried
    # state is what makes it match the reference)
    rng = np.random.default_rng(3)
    h, t = 2, 40
    offsets = jagged([t], t)
    q, k = (rng.standard_normal((t, h, DQK)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((t, h, DV)).astype(np.float32)
    c = np.zeros((t, h, DV), np.float32)
    args = [Tensor(a) for a in (q, k, v, offsets, c)]
    (_, o8), _ = AttentionGrad(AttentionLoss(h, 8))(*args)
    ref, _ = recurrent_attention(q, k, v, offsets, decay_rates(h).astype(np.float64))
    local = ref.copy()
    for s in range(0, t, 8):     # attention within each chunk only
        local[s:s + 8], _ = recurrent_attention(q[s:s + 8], k[s:s + 8], v[s:s + 8], jagged([8], 8),
                                                decay_rates(h).astype(np.float64))
    assert np.abs(ref[8:] - local[8:]).max() > 1e-2
    np.testing.assert_allclose(o8.asnumpy(), ref, rtol=1e-4, atol=1e-4)


def block_params(block):
    return {p.name.split(".")[-1]: p for p in block.trainable_params()}


def randomize(block, rng):
    scales = {"w_uvqk": 0.6, "w_out": 0.4, "b_out": 0.1}
    values = {}
    for name, p in block_params(block).items():
        v = (rng.standard_normal(p.shape) * scales[name]).astype(np.float32)
        p.set_data(Tensor(v))
        values[name] = v.astype(np.float64)
    return values


@pytest.mark.parametrize("h,backend", [(1, "reference"), (2, "reference"), (1, "fast"), (2, "fast")])
def test_block_forward_and_gradients_match_numpy(h, backend):
    """The block on the reference backend (the chunked form) and on the kernels where they build."""
    from gr_fixtures import fast_backend
    from mindgr.ops import set_backend
    if backend == "reference":
        set_backend("reference")
    try:
        _block_forward_and_gradients(h)
    finally:
        fast_backend()


def _block_forward_and_gradients(h):
    rng = np.random.default_rng([11, h])
    block = LinearAttentionBlock(rng, D, h, DQK, DV, "blk", chunk=8)
    assert sorted(p.name for p in block.trainable_params()) == ["blk.b_out", "blk.w_out", "blk.w_uvqk"]
    grad_cell = BlockGrad(block)
    names = [p.name.split(".")[-1] for p in grad_cell.weights]
    decay = block.decay.astype(np.float64)
    for lengths, t_cap in LAYOUTS[:2]:
        values = randomize(block, rng)
        offsets = jagged(lengths, t_cap)
        ts = np.zeros(t_cap, np.int64)                     # ignored by the block
        x = rng.standard_normal((t_cap, D)).astype(np.float32)
        c = rng.standard_normal((t_cap, D)).astype(np.float32)
        (f, y), (gx, gw) = grad_cell(Tensor(x), Tensor(offsets), Tensor(ts), Tensor(c))
        grads = {"x": gx.asnumpy(), **{n: g.asnumpy() for n, g in zip(names, gw)}}
        p = dict(values, x=x.astype(np.float64))
        y_np = numpy_block(p, offsets, h, decay)
        np.testing.assert_allclose(y.asnumpy(), y_np, rtol=1e-4, atol=1e-5)
        c64 = c.astype(np.float64)

        def objective(qp):
            return float((numpy_block(qp, offsets, h, decay) * c64).sum())

        check_directional_grads(objective, p, grads, rng, directions=2, context=(lengths,))
        # tail tokens: only the residual path reaches them
        end = int(offsets[-1])
        np.testing.assert_array_equal(grads["x"][end:], c[end:])


class PromptForward(nn.Cell):
    def __init__(self, block, rows, row_len):
        super().__init__()
        self.block, self.rows, self.row_len = block, rows, row_len

    def construct(self, x, offsets):
        return self.block.prompt_forward(x, offsets, self.rows, self.row_len)


class PromptLast(nn.Cell):
    def __init__(self, block, rows, row_len):
        super().__init__()
        self.block, self.rows, self.row_len = block, rows, row_len

    def construct(self, x, offsets, last):
        return self.block.prompt_last(x, offsets, self.rows, self.row_len, last)


class Parts(nn.Cell):
    """project -> the dense attention -> finish: the pieces a cached decoder composes."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def construct(self, x, offsets):
        u, q, k, v = self.block.project(x)
        o = dense_linear_attention(q, k, v, offsets, self.block.log_decay)
        return self.block.finish(x, u, o.reshape(x.shape[0], -1)), self.block(x, offsets)


def test_prompt_forward_states_and_the_decoding_pieces():
    """Prompts one per row_len tokens with a filler row after each (mindgr.models.kv_cache.prompt_batch's
    layout, a full-stride prompt included): S = each prompt's final recurrent state; prompt_last gives the
    same S and the outputs at the prompts' last tokens."""
    from mindgr.models.kv_cache import prompt_batch
    rng = np.random.default_rng(5)
    h, rows, row_len = 2, 4, 11
    block = LinearAttentionBlock(rng, D, h, DQK, DV, "blk", chunk=4)
    randomize(block, rng)

    class Dec:     # what prompt_batch reads of a decoder
        group, pad_id = 1, 0
    lengths = [3, 11, 1, 7]
    prompts = [(np.ones((n, 1), np.int32), np.zeros(n, np.float32)) for n in lengths]
    _, _, offsets, last, got_lengths = prompt_batch(Dec, prompts, rows, row_len)
    assert list(got_lengths) == lengths
    x = rng.standard_normal((rows * row_len, D)).astype(np.float32)
    y, s = PromptForward(block, rows, row_len)(Tensor(x), Tensor(offsets))
    p = {n: q.asnumpy().astype(np.float64) for n, q in block_params(block).items()}
    y_np = numpy_block(dict(p, x=x.astype(np.float64)), offsets, h, block.decay.astype(np.float64))
    np.testing.assert_allclose(y.asnumpy(), y_np, rtol=1e-4, atol=1e-5)
    # the reference's final states of the prompts' rows (every other jagged row is a filler)
    z = silu(layer_norm(x.astype(np.float64)) @ p["w_uvqk"])
    _, v, q, k = np.split(z, np.cumsum([h * DV, h * DV, h * DQK]), axis=1)
    t = x.shape[0]
    _, states = recurrent_attention(q.reshape(t, h, DQK), k.reshape(t, h, DQK), v.reshape(t, h, DV), offsets,
                                    block.decay.astype(np.float64))
    np.testing.assert_allclose(s.asnumpy(), states[0::2], rtol=1e-4, atol=1e-5)
    assert s.shape == (rows, h, DQK, DV)
    # a prefill's last block: the same states, the outputs at each prompt's last token only
    y_last, s_last = PromptLast(block, rows, row_len)(Tensor(x), Tensor(offsets), Tensor(last))
    np.testing.assert_allclose(y_last.asnumpy(), y_np[last], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s_last.asnumpy(), states[0::2], rtol=1e-4, atol=1e-5)

    # project / finish with the plain attention give construct's output
    offsets2 = jagged([0, 3, 1, 9, 5], 20)
    x2 = rng.standard_normal((20, D)).astype(np.float32)
    y_parts, y_block = Parts(block)(Tensor(x2), Tensor(offsets2))
    np.testing.assert_allclose(y_parts.asnumpy(), y_block.asnumpy(), rtol=1e-4, atol=1e-5)


def test_gr_decoder_with_the_linear_backbone_trains():
    """model.backbone linear: the GR decoder's blocks are linear-attention blocks, called as HSTU's, and the
    NTP loss of a learnable successor chain falls well below its start (one compiled graph)."""
    from gr_fixtures import random_codes
    from mindgr.models.generative import GRDecoder
    from mindgr.models.ntp import NTPLoss, batch_tensors, pack_rows, user_rows
    rng = np.random.default_rng(9)
    num_items, sizes = 24, [4, 4, 2]
    codes = random_codes(rng, num_items, sizes)
    succ = rng.permutation(num_items) + 1
    hist = []
    for _ in range(16):
        s = [int(rng.integers(1, num_items + 1))]
        for _ in range(4):
            s.append(int(succ[s[-1] - 1]) if rng.random() < 0.9 else int(rng.integers(1, num_items + 1)))
        hist.append(np.asarray(s))
    dec = GRDecoder(sizes, 16, 1, 2, 8, 8, max_len=16, seed=0, backbone="linear", linear_chunk=16)
    assert isinstance(dec.blocks[0], LinearAttentionBlock) and dec.blocks[0].chunk == 16
    assert not any("w_pos" in p.name for p in dec.trainable_params())
    loss = NTPLoss(dec)
    rows = [r for h in hist for r in user_rows(h, codes, dec.level_offsets, "ntp", "none")]
    batches = pack_rows(rows, 320, 64, dec.group, dec.pad_id)
    assert len(batches) == 1
    args = batch_tensors(batches[0])
    step = nn.TrainOneStepCell(loss, nn.Adam(dec.trainable_params(), learning_rate=0.02))
    losses = [float(step(*args).asnumpy()) for _ in range(60)]     # the loss before each update
    first, last = losses[0], losses[-1]
    assert first > 3.0 and last < 0.5 * first, (first, last)     # initial ~ log(32) = 3.47
    with pytest.raises(ValueError, match="backbone"):
        GRDecoder(sizes, 16, 1, 2, 8, 8, max_len=16, backbone="mamba")


def test_backbone_config_and_flops():
    from mindgr.config import ConfigError, load_config
    from mindgr.models.generative import encoder_flops
    from mindgr.models.hstu import encoder_flops as hstu_flops
    from mindgr.models.linear_attention import encoder_flops as linear_flops
    from mindgr.models.objectives import check_objective_arch
    base = ["model.arch=gr", "loss.objective=ntp", "ids.codes=x.parquet"]
    with pytest.raises(ConfigError, match="model.backbone = linear is a backbone of the generative decoder"):
        check_objective_arch(load_config(None, ["model.backbone=linear"]))
    with pytest.raises(ConfigError, match="data.gr_layout = tree needs model.backbone = hstu"):
        load_config(None, base + ["model.backbone=linear", "data.gr_layout=tree"])
    with pytest.raises(ConfigError, match="model.backbone"):
        load_config(None, base + ["model.backbone=rnn"])
    cfg = load_config(None, base + ["model.backbone=linear", "model.linear_chunk=4", "model.dim=8",
                                     "model.num_heads=2", "model.num_blocks=3"])
    m = cfg.model
    assert encoder_flops(m, [5, 9]) == linear_flops(m, [5, 9], 4)
    # by hand, per block: projections 2*8*2*(2*4+2*4) + 2*2*4*8 = 640 per token; per head: intra-chunk pairs
    # (rows chunked 4+1, 4+4+1: 10+1 + 10+10+1 = 32) x 16, 2 x 2*16 per token, 2*16 per pair of the row's
    # chunks (1 + 3)
    per_block = 640 * 14 + 2 * (32 * 16 + 64 * 14 + 32 * 4)
    assert encoder_flops(m, [5, 9]) == 3 * per_block
    m.backbone = "hstu"
    assert encoder_flops(m, [5, 9]) == hstu_flops(m, [5, 9])
