"""SASRec: the reference causal softmax attention against numpy, and causality of the whole encoder.

Batches are jagged with fixed capacities (T_cap = 12, B_cap = 4, N = 4), each with an empty row, a
length-1 row, a length-N row and a non-empty unused tail.
Tolerances: attention float32 vs float64 numpy, |out - ref| <= 1e-5 + 1e-5 |ref| (observed ~1e-7);
tail outputs exactly 0. Causality: outputs that must not change agree to 1e-6 while the changed
positions move by more than 1e-3.
"""

import numpy as np
import pytest

from mindspore import Tensor, nn, ops  # noqa: E402

from mindgr.models.sasrec import SASRec  # noqa: E402
from mindgr.ops import reference  # noqa: E402

N, T_CAP, H, DQK, DV = 4, 12, 2, 3, 4
LAYOUTS = [[0, 4, 1, 3], [2, 1, 0, 4], [4, 1, 3, 0]]


pytestmark = pytest.mark.graph_mode("reference")




def offsets_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class SoftmaxAttention(nn.Cell):
    def construct(self, q, k, v, offsets):
        return reference.softmax_attention(q, k, v, offsets, N)


def numpy_causal_softmax(q, k, v, offsets):
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    for b in range(len(offsets) - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        for hh in range(q.shape[1]):
            for i in range(s, e):
                scores = np.array([q[i, hh] @ k[j, hh] for j in range(s, i + 1)]) / np.sqrt(q.shape[2])
                p = np.exp(scores - scores.max())
                out[i, hh] = (p / p.sum()) @ v[s:i + 1, hh]
    return out


def test_softmax_attention_matches_numpy():
    rng = np.random.default_rng(3)
    attn = SoftmaxAttention()
    for lengths in LAYOUTS:
        offsets = offsets_of(lengths)
        total = int(offsets[-1])
        q = (rng.standard_normal((T_CAP, H, DQK)) * 2).astype(np.float32)
        k = (rng.standard_normal((T_CAP, H, DQK)) * 2).astype(np.float32)
        v = rng.standard_normal((T_CAP, H, DV)).astype(np.float32)
        out = attn(Tensor(q), Tensor(k), Tensor(v), Tensor(offsets)).asnumpy()
        assert out.shape == (T_CAP, H, DV)
        ref = numpy_causal_softmax(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), offsets)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out[total:], 0.0)
        # A length-1 row attends only to itself.
        one = int(offsets[lengths.index(1)])
        np.testing.assert_allclose(out[one], v[one], rtol=1e-6, atol=1e-6)


def test_sasrec_forward_is_causal_per_row():
    rng = np.random.default_rng(4)
    num_items, dim = 15, 8
    model = SASRec(num_items, dim, num_blocks=2, num_heads=2, max_len=N, dropout=0.2, seed=1)
    # Larger embeddings than the training init so that changing one item moves every later output.
    model.item_emb.set_data(Tensor((rng.standard_normal((num_items + 1, dim)) * 0.5).astype(np.float32)))
    lengths = [0, 4, 1, 3]
    offsets = offsets_of(lengths)  # rows: [] [0..3] [4] [5..7], tail 8..11
    total = int(offsets[-1])
    ids = np.zeros(T_CAP, np.int32)
    ids[:total] = rng.integers(1, num_items + 1, total)
    positions = np.zeros(T_CAP, np.int32)
    positions[:total] = [0, 1, 2, 3, 0, 0, 1, 2]
    ts = Tensor(np.arange(T_CAP, dtype=np.int64))

    def run(token_ids):
        return model(Tensor(token_ids), Tensor(positions), Tensor(offsets), ts).asnumpy()

    base = run(ids)
    assert base.shape == (T_CAP, dim) and np.isfinite(base).all()
    np.testing.assert_allclose(np.linalg.norm(base[:total], axis=1), 1.0, atol=1e-5)

    def changed(index):
        other = ids.copy()
        other[index] = ids[index] % num_items + 1  # a different real item
        return run(other)

    # Position 2 of row 1 (token 2): tokens 0, 1 and the other rows are unchanged; tokens 2, 3 change.
    out = changed(2)
    np.testing.assert_allclose(out[[0, 1, 4, 5, 6, 7]], base[[0, 1, 4, 5, 6, 7]], rtol=0, atol=1e-6)
    assert np.abs(out[2] - base[2]).max() > 1e-3 and np.abs(out[3] - base[3]).max() > 1e-3
    # Last token of row 3 (token 7): nothing before it and no other row changes.
    out = changed(7)
    np.testing.assert_allclose(out[:7], base[:7], rtol=0, atol=1e-6)
    assert np.abs(out[7] - base[7]).max() > 1e-3
    # First token of row 3 (token 5) reaches every token of its own row only.
    out = changed(5)
    np.testing.assert_allclose(out[:5], base[:5], rtol=0, atol=1e-6)
    assert all(np.abs(out[i] - base[i]).max() > 1e-3 for i in (5, 6, 7))
    # The unused tail does not reach any real token.
    other = ids.copy()
    other[total:] = rng.integers(1, num_items + 1, T_CAP - total)
    np.testing.assert_allclose(run(other)[:total], base[:total], rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", pytest.param("cpu", marks=pytest.mark.skipif(
    __import__("shutil").which("g++") is None, reason="g++ not found"))])
def test_affine_layer_norm_equals_mindspore_layernorm(backend):
    """SASRec's AffineLayerNorm (normalisation through the ops backend) against nn.LayerNorm with the
    same gamma / beta: output and the gradients of x, gamma and beta; parameter names kept."""
    import mindspore as ms
    from mindgr.models.sasrec import AffineLayerNorm
    from mindgr.ops.backend import get_backend, set_backend
    previous = get_backend()
    set_backend(backend)
    try:
        rng = np.random.default_rng(6)
        x = (rng.standard_normal((9, 8)) * 3 + 1).astype(np.float32)
        cot = rng.standard_normal((9, 8)).astype(np.float32)
        gamma, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        results = []
        for cell in (AffineLayerNorm(8, 1e-8), nn.LayerNorm((8,), epsilon=1e-8)):
            cell.gamma.set_data(Tensor(gamma))
            cell.beta.set_data(Tensor(beta))

            class Loss(nn.Cell):
                def __init__(self, inner):
                    super().__init__()
                    self.inner = inner

                def construct(self, a, c):
                    return (self.inner(a) * c).sum()

            fn = ms.value_and_grad(Loss(cell), grad_position=0, weights=[cell.gamma, cell.beta])
            loss, (gx, (gg, gb)) = fn(Tensor(x), Tensor(cot))
            results.append([loss.asnumpy(), gx.asnumpy(), gg.asnumpy(), gb.asnumpy()])
        for got, want in zip(*results):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        set_backend(previous)
    names = {p.name for p in SASRec(15, 8, num_blocks=1, num_heads=1, max_len=N).trainable_params()}
    assert {"blocks.0.ln_attn.gamma", "blocks.0.ln_ffn.beta", "ln_out.gamma", "ln_out.beta"} <= names


def test_folded_layer_norm_projection_equals_the_plain_one():
    """AffineLayerNorm.project (scale and shift folded into the weights; whole, and in 3 column parts) against
    LayerNorm, then x @ w + b, on MindSpore's nn.LayerNorm: output and the gradients of x, gamma, beta, w, b."""
    import mindspore as ms
    from mindgr.models.sasrec import AffineLayerNorm
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((9, 8)) * 3 + 1).astype(np.float32)
    cot = rng.standard_normal((9, 6)).astype(np.float32)
    gamma, beta, b = (rng.standard_normal(n).astype(np.float32) for n in (8, 8, 6))
    w = rng.standard_normal((8, 6)).astype(np.float32)

    class Loss(nn.Cell):
        def __init__(self, folded, parts=1):
            super().__init__()
            self.folded, self.parts = folded, parts
            self.ln = AffineLayerNorm(8, 1e-8) if folded else nn.LayerNorm((8,), epsilon=1e-8)
            self.ln.gamma.set_data(Tensor(gamma))
            self.ln.beta.set_data(Tensor(beta))
            self.w = ms.Parameter(Tensor(w), name="w")
            self.b = ms.Parameter(Tensor(b), name="b")

        def construct(self, a, c):
            if not self.folded:
                return ((ops.matmul(self.ln(a), self.w) + self.b) * c).sum()
            if self.parts == 1:
                return (self.ln.project(a, self.w, self.b) * c).sum()
            y = ops.concat(self.ln.project(a, self.w, self.b, parts=self.parts), 1)
            return (y * c).sum()

    results = []
    for folded, parts in ((False, 1), (True, 1), (True, 3)):
        loss = Loss(folded, parts)
        fn = ms.value_and_grad(loss, grad_position=0, weights=[loss.ln.gamma, loss.ln.beta, loss.w, loss.b])
        value, (gx, grads) = fn(Tensor(x), Tensor(cot))
        results.append([value.asnumpy(), gx.asnumpy()] + [g.asnumpy() for g in grads])
    assert np.abs(results[0][4]).max() > 0.1          # w's gradient is not trivially zero
    for folded in results[1:]:
        for got, want in zip(folded, results[0]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
