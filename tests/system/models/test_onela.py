"""Decoding a linear-attention GR decoder (mindgr.models.linear_decode): OneLA (one prompt state per user,
per-beam records, ancestry index) and its two baselines (a full state per beam; every beam's state replayed
from its records) against the plain recompute search and a numpy recurrent reference, on random models.

Tolerance: items equal; scores |mode - recompute| <= 2e-5 + 1e-5 |recompute| (float32: the states sum the
prompt and the decoded part separately, the recompute's chunked form in another order).
"""
import numpy as np
import pytest
from mindspore import Tensor

from mindgr.generate.engine import DecodingEngine
from mindgr.ids.trie import PrefixTrie
from mindgr.models.generative import GRDecoder
from mindgr.models.linear_decode import ancestry_index, decay_weights
from gr_fixtures import random_codes

pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]

LAYOUTS = ("onela", "per_beam_state", "replay")


def linear_case(seed, sizes, num_items, users, merger="none", dim=8, blocks=2, heads=2, d=4, trie_softmax=False):
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, num_items, sizes)
    dec = GRDecoder(sizes, dim, blocks, heads, d, d, max_len=24, token_merger=merger, seed=seed,
                    num_items=num_items, backbone="linear", trie_softmax=trie_softmax)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.3).astype(np.float32)))
    hist = [rng.integers(1, num_items + 1, int(rng.integers(1, 5))) for _ in range(users)]
    return codes, dec, hist


@pytest.mark.parametrize("seed,merger,trie_softmax,beam", [(10, "item", True, 6), (11, "none", False, 9),
                                                           (12, "pairs", False, 40)])
def test_children_scoring_equals_full_scoring_on_every_layout(seed, merger, trie_softmax, beam):
    """The engine's default scoring on the linear states (their step cells without the code head, the head
    on the host for the trie's allowed codes only) returns the lists and scores of the whole-level scoring
    and of the plain recompute search, for OneLA, replay and the per-beam states: with and without the trie
    softmax, fewer users than the capacity, a beam wider than the first level (dead beams); the recompute
    search sorts every candidate and rebuilds its masks (the plainest reference)."""
    sizes = [5, 3, 3, 2] if seed % 2 else [4, 4, 3]
    codes, dec, hist = linear_case(seed, sizes, 40, users=3, merger=merger, trie_softmax=trie_softmax)
    trie = PrefixTrie(codes, sizes)
    k = 4
    want_items, want_scores = DecodingEngine(dec, trie, codes, beam, 12, num_users=4, cache="recompute",
                                             selection="full_sort", masks="rebuild").search(hist, k)
    assert (want_items > 0).all()
    for cache in ("shared", "per_beam", "replay"):          # onela, per_beam_state, replay
        children = DecodingEngine(dec, trie, codes, beam, 12, num_users=4, cache=cache)
        full = DecodingEngine(dec, trie, codes, beam, 12, num_users=4, cache=cache, head="full")
        full.state.share_graphs(children.state)             # one prefill graph (CI time); each head its step
        assert children.state.gives_hidden, cache
        items, scores = children.search(hist, k)
        assert children.state.timings["step"] > 0 and children.timings["model"] > 0   # the hidden path ran
        f_items, f_scores = full.search(hist, k)
        for other_items, other_scores in ((want_items, want_scores), (f_items, f_scores)):
            np.testing.assert_array_equal(items, other_items, err_msg=cache)
            np.testing.assert_allclose(scores, other_scores, rtol=1e-5, atol=2e-5, err_msg=cache)
        if beam > trie.masks[0][0].sum():          # more beams than first codes: the dead slots agree too
            np.testing.assert_array_equal(children.search(hist, beam)[0], full.search(hist, beam)[0], err_msg=cache)
        np.testing.assert_array_equal(children.search(hist[::-1], k)[0], items[::-1], err_msg=cache)


def test_ancestry_index_follows_reorders():
    """Records laid out [S, U, Bm]: after random reorders, each beam's slot j names the row of its
    level-(j+1) ancestor, found by walking the parents one beam at a time."""
    rng = np.random.default_rng(5)
    u, beam, steps = 3, 6, 4
    parents = [np.zeros((u, beam), np.int64)] + [rng.integers(0, beam, (u, beam)) for _ in range(steps - 1)]
    for level in range(1, steps + 1):
        anc = ancestry_index(parents, level, u, beam, steps)
        for i in range(u):
            for b in range(beam):
                cur = b
                for slot in range(level - 1, -1, -1):
                    assert anc[i, b, slot] == (slot * u + i) * beam + cur
                    cur = parents[slot][i, cur] if slot > 0 else cur
                for slot in range(level, steps):           # not written yet: weight 0 (decay_weights)
                    assert anc[i, b, slot] == (slot * u + i) * beam + b
    pw, rw = decay_weights(np.array([[0.5, 0.9]], np.float32), 2, 3)
    np.testing.assert_allclose(pw, [[0.25, 0.81]])
    np.testing.assert_allclose(rw[0], [[0.5, 0.9], [1.0, 1.0], [0.0, 0.0]])


def _np_layer_norm(x, eps=1e-6):
    m = x.mean(-1, keepdims=True)
    c = x - m
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)


def _silu(z):
    return z / (1.0 + np.exp(-z))


def recurrent_logits(dec, gids):
    """numpy reference: logits [sum K] after the token sequence `gids` (merger none: one code per token),
    every block run token by token as S = gamma S + k v^T, o = q^T S."""
    f64 = lambda t: t.asnumpy().astype(np.float64)                      # noqa: E731
    level = dec.slot_level.asnumpy()
    x = (f64(dec.code_emb)[gids] + f64(dec.level_emb)[level[gids]]) * np.sqrt(dec.dim)
    for blk in dec.blocks:
        h, dqk, dv = blk.h, blk.dqk, blk.dv
        z = _silu(_np_layer_norm(x) @ f64(blk.w_uvqk))
        uu, v, q, k = np.split(z, np.cumsum([h * dv, h * dv, h * dqk]), 1)
        q = q.reshape(-1, h, dqk) / np.sqrt(dqk)
        k, v = k.reshape(-1, h, dqk), v.reshape(-1, h, dv)
        s = np.zeros((h, dqk, dv))
        o = np.zeros((x.shape[0], h * dv))
        g = np.asarray(blk.decay, np.float64)[:, None, None]
        for t in range(x.shape[0]):
            s = g * s + k[t][:, :, None] * v[t][:, None, :]
            o[t] = np.einsum("hd,hde->he", q[t], s).reshape(-1)
        x = x + (uu * _np_layer_norm(o)) @ f64(blk.w_out) + f64(blk.b_out)
    return _np_layer_norm(x[-1]) @ f64(dec.w_head) + f64(dec.b_head)


def test_each_step_equals_numpy_recurrence():
    """Prefill, then steps with random codes and random parents: every layout's logits equal the numpy
    recurrence over each beam's own sequence (its prompt, then its ancestry's codes), and its hidden path
    (prefill_records, step_hidden: a second state fed the same codes and parents), with the decoder's head
    applied, equals its logits."""
    sizes = [4, 3, 3, 2]
    codes, dec, hist = linear_case(8, sizes, 40, users=2)
    rng = np.random.default_rng(9)
    u, beam, p_cap = 2, 3, 10
    prompts = dec.prompts(hist, codes, p_cap)
    states = {name: dec.decode_state(u, beam, p_cap, layout=name) for name in LAYOUTS}
    hidden_states = {name: dec.decode_state(u, beam, p_cap, layout=name) for name in LAYOUTS}
    for name, st in hidden_states.items():
        st.share_graphs(states[name])                      # the same cells, compiled once (CI time)
    level0 = {name: st.prefill(prompts) for name, st in states.items()}
    for name, st in hidden_states.items():
        np.testing.assert_allclose(st.prefill_records(prompts), level0[name], rtol=1e-6, atol=1e-6, err_msg=name)
    w_t, bias = hidden_states["onela"].head_weights()
    seqs = [[list(prompts[i][0][:, 0]) for _ in range(beam)] for i in range(u)]
    for i in range(u):
        want = recurrent_logits(dec, np.asarray(seqs[i][0]))
        for name in LAYOUTS:
            np.testing.assert_allclose(level0[name][i], want, rtol=1e-4, atol=1e-4, err_msg=name)
    parents = [np.zeros((u, beam), np.int64)]
    for level in range(1, len(sizes)):
        step_codes = rng.integers(0, sizes[level - 1], (u, beam))
        if level > 1:                                  # the beams fork: each takes its parent's sequence
            seqs = [[list(seqs[i][parents[level - 1][i, b]]) for b in range(beam)] for i in range(u)]
        for i in range(u):
            for b in range(beam):
                seqs[i][b].append(int(dec.level_offsets[level - 1] + step_codes[i, b]))
        got = {name: st.step(level, step_codes, parents) for name, st in states.items()}
        for name, st in hidden_states.items():
            hidden = st.step_hidden(level, step_codes, parents)
            assert hidden.shape == (u, beam, dec.dim), name
            np.testing.assert_allclose(hidden @ w_t.T + bias, got[name], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} hidden, level {level}")
        for i in range(u):
            for b in range(beam):
                want = recurrent_logits(dec, np.asarray(seqs[i][b]))
                for name in LAYOUTS:
                    np.testing.assert_allclose(got[name][i, b], want, rtol=1e-4, atol=1e-4,
                                               err_msg=f"{name} level {level}")
        parents.append(rng.integers(0, beam, (u, beam)))


def test_state_bytes_by_layout():
    sizes = [4, 3, 3]
    codes, dec, hist = linear_case(3, sizes, 25, users=2)
    u, beam, p_cap, steps = 2, 8, 6, len(sizes) - 1
    blk = dec.blocks[0]
    state = dec.num_blocks * blk.h * blk.dqk * blk.dv * 4              # one full state, every block
    record = dec.num_blocks * blk.h * (blk.dqk + blk.dv) * 4           # one decoded token's k and v
    prompts = dec.prompts(hist, codes, p_cap)
    got = {}
    for name in LAYOUTS:
        st = dec.decode_state(u, beam, p_cap, layout=name)
        st.prefill(prompts)
        got[name] = st.nbytes()
    assert got["onela"] == {"prompt": u * state, "beams": u * beam * steps * record}
    assert got["per_beam_state"] == {"prompt": 0, "beams": u * beam * state}
    assert got["replay"] == dict(got["onela"], rebuilt=u * beam * state // dec.num_blocks)


def test_unknown_layouts_are_one_line():
    codes, dec, _ = linear_case(0, [3, 3], 6, users=1)
    with pytest.raises(ValueError, match="decode layout 'tree': the linear backbone has onela, per_beam_state, "
                                         "replay"):
        dec.decode_state(1, 4, 6, layout="tree")
    hstu = GRDecoder([3, 3], 8, 1, 2, 4, 4, max_len=16)
    with pytest.raises(ValueError, match="decode layout 'replay': the hstu backbone has shared, per_beam"):
        DecodingEngine(hstu, PrefixTrie(codes, [3, 3]), codes, 4, 6, 1, cache="replay")
