"""Token merger: prompt shapes and lengths (Lt = 4: item -> a quarter, pairs -> a half), decoded codes
never merged, the merged token = W_merge . concat(slot embeddings) + b. Its gradients are checked
against float64 numpy in test_gr_decoder.py (parametrised over none | item | item_id | pairs) and beam search with
the merger on equals exhaustive scoring in test_gr_beam.py."""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.models.generative import GRDecoder
from mindgr.models.ntp import drop_item_slots, group_width, prompt_tokens, tokens_per_prompt_item, user_rows
from gr_fixtures import random_codes

SIZES = [4, 4, 3, 2]


pytestmark = pytest.mark.graph_mode("reference")




@pytest.mark.parametrize("merger,factor", [("none", 1), ("item", 4), ("item_id", 4), ("pairs", 2)])
def test_prompt_lengths_and_rows(merger, factor):
    rng = np.random.default_rng(1)
    codes = random_codes(rng, 30, SIZES)
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    items = rng.integers(1, 31, 7)
    slots, merged = prompt_tokens(codes[items], lo, merger, int(lo[-1]), items)
    assert slots.shape == (7 * 4 // factor, group_width(merger, 4))
    assert tokens_per_prompt_item(4, merger) * 7 == slots.shape[0]
    assert (merged == (merger != "none")).all()
    # every code of every item sits in exactly one slot, in order
    real = slots[slots < lo[-1]]
    np.testing.assert_array_equal(real, (codes[items] + lo[:-1]).reshape(-1))
    if merger == "item_id":                                           # the last slot: the item itself
        np.testing.assert_array_equal(slots[:, -1], lo[-1] + 1 + items)
    if merger != "none":
        rows = user_rows(items, codes, lo, "ntp", merger)
        assert len(rows) == 6
        for j, r in enumerate(rows, start=1):
            n_prompt = j * 4 // factor
            assert r["slots"].shape[0] == n_prompt + 3                   # + codes 0..Lt-2, unmerged
            assert (r["merged"][:n_prompt] == 1).all() and (r["merged"][n_prompt:] == 0).all()
            assert (r["slots"][n_prompt:, 1:] == lo[-1]).all()           # decoded tokens: one code each
            if merger == "item_id":
                np.testing.assert_array_equal(r["slots"][:n_prompt, -1], lo[-1] + 1 + items[:j])
            assert (r["weight"][n_prompt - 1:] == 1).all() and (r["weight"][:n_prompt - 1] == 0).all()


def test_pairs_with_odd_levels_pads_the_last_slot():
    lo = np.array([0, 3, 6, 8])
    slots, _ = prompt_tokens(np.array([[1, 2, 0], [2, 0, 1]]), lo, "pairs", 8)
    assert slots.tolist() == [[1, 5], [6, 8], [2, 3], [7, 8]]


def test_merged_token_is_the_linear_map():
    rng = np.random.default_rng(2)
    dec = GRDecoder(SIZES, 6, 1, 1, 3, 3, max_len=8, token_merger="item", seed=0)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.5).astype(np.float32)))
    slots = np.array([[0, 5, 9, 12], [3, 13, 13, 13]], np.int32)      # a merged item; a single code 3
    merged = np.array([1, 0], np.float32)
    x = dec.embed(Tensor(slots), Tensor(merged)).asnumpy()
    p = {q.name: q.asnumpy().astype(np.float64) for q in dec.trainable_params()}
    lvl = np.array([0, 1, 2, 3])
    emb = p["code_emb"][slots[0]] + p["level_emb"][lvl]
    want0 = (emb.reshape(-1) @ p["w_merge"] + p["b_merge"]) * np.sqrt(6)
    want1 = (p["code_emb"][3] + p["level_emb"][0]) * np.sqrt(6)
    np.testing.assert_allclose(x[0], want0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x[1], want1, rtol=1e-5, atol=1e-5)
    assert dec.pad_id == 13 and x.shape == (2, 6)


def test_unknown_merger_is_one_line():
    with pytest.raises(ValueError, match="model.token_merger = 'tokens': expected one of none, item, item_id, pairs"):
        GRDecoder(SIZES, 6, 1, 1, 3, 3, max_len=8, token_merger="tokens")


def test_item_id_merger_needs_ids_and_catalogue():
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    with pytest.raises(ValueError, match="item_id: prompt_tokens needs the 2 items' ids"):
        prompt_tokens(np.zeros((2, 4), np.int64), lo, "item_id", int(lo[-1]))
    with pytest.raises(ValueError, match="item_id needs the catalogue size"):
        GRDecoder(SIZES, 6, 1, 1, 3, 3, max_len=8, token_merger="item_id")


def test_item_id_token_adds_the_item_embedding():
    """The item_id merged token = W_merge . concat(code slots, item slot) + b, the item slot's embedding its own
    row (pad_id + 1 + item) plus the extra level's; an item's code slots alone give the item merger's map."""
    rng = np.random.default_rng(3)
    dec = GRDecoder(SIZES, 6, 1, 1, 3, 3, max_len=8, token_merger="item_id", seed=0, num_items=9)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.5).astype(np.float32)))
    slots = np.array([[0, 5, 9, 12, 13 + 1 + 7]], np.int32)            # item 7's codes and its id slot
    x = dec.embed(Tensor(slots), Tensor(np.ones(1, np.float32))).asnumpy()
    p = {q.name: q.asnumpy().astype(np.float64) for q in dec.trainable_params()}
    assert p["code_emb"].shape == (13 + 1 + 10, 6) and p["level_emb"].shape == (5, 6)
    emb = p["code_emb"][slots[0]] + p["level_emb"][[0, 1, 2, 3, 4]]
    want = (emb.reshape(-1) @ p["w_merge"] + p["b_merge"]) * np.sqrt(6)
    np.testing.assert_allclose(x[0], want, rtol=1e-5, atol=1e-5)


def test_item_id_dropout_blanks_only_item_slots():
    """drop_item_slots: an item slot (> pad_id) becomes pad_id at rate ~p, seeded; code and pad slots stay."""
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    pad = int(lo[-1])
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 50, SIZES)
    items = rng.integers(1, 51, 4000)
    slots, _ = prompt_tokens(codes[items], lo, "item_id", pad, items)
    slots[::7, 2] = pad                                               # some pad slots among the codes
    out = drop_item_slots(slots, pad, 0.4, np.random.default_rng(1))
    assert np.array_equal(out[:, :-1], slots[:, :-1]) and out.dtype == slots.dtype
    dropped = out[:, -1] == pad
    assert np.array_equal(out[~dropped, -1], slots[~dropped, -1])
    assert abs(dropped.mean() - 0.4) < 0.03
    assert np.array_equal(out, drop_item_slots(slots, pad, 0.4, np.random.default_rng(1)))
    assert not np.array_equal(out, drop_item_slots(slots, pad, 0.4, np.random.default_rng(2)))
    assert np.array_equal(drop_item_slots(slots, pad, 0.0, np.random.default_rng(1)), slots)
    before = slots.copy()
    drop_item_slots(slots, pad, 0.9, np.random.default_rng(1))
    assert np.array_equal(slots, before)                              # the input is not modified
