"""Token merger: prompt shapes and lengths (Lt = 4: item -> a quarter, pairs -> a half), decoded codes
never merged, the merged token = W_merge . concat(slot embeddings) + b. Its gradients are checked
against float64 numpy in test_gr_decoder.py (parametrised over none | item | pairs) and beam search with
the merger on equals exhaustive scoring in test_gr_beam.py."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindgr.models.generative import GRDecoder, group_width
from mindgr.models.ntp import prompt_tokens, tokens_per_prompt_item, user_rows
from mindgr.ops import set_backend
from gr_fixtures import random_codes

SIZES = [4, 4, 3, 2]


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    from mindgr.runtime import select_device
    select_device()  # CPU, once per process (set_device fails after kernels ran)
    set_backend("reference")


@pytest.mark.parametrize("merger,factor", [("none", 1), ("item", 4), ("pairs", 2)])
def test_prompt_lengths_and_rows(merger, factor):
    rng = np.random.default_rng(1)
    codes = random_codes(rng, 30, SIZES)
    lo = np.concatenate([[0], np.cumsum(SIZES)])
    items = rng.integers(1, 31, 7)
    slots, merged = prompt_tokens(codes[items], lo, merger, int(lo[-1]))
    assert slots.shape == (7 * 4 // factor, group_width(merger, 4))
    assert tokens_per_prompt_item(4, merger) * 7 == slots.shape[0]
    assert (merged == (merger != "none")).all()
    # every code of every item sits in exactly one slot, in order
    real = slots[slots < lo[-1]]
    np.testing.assert_array_equal(real, (codes[items] + lo[:-1]).reshape(-1))
    if merger != "none":
        rows = user_rows(items, codes, lo, "ntp", merger)
        assert len(rows) == 6
        for j, r in enumerate(rows, start=1):
            n_prompt = j * 4 // factor
            assert r["slots"].shape[0] == n_prompt + 3                   # + codes 0..Lt-2, unmerged
            assert (r["merged"][:n_prompt] == 1).all() and (r["merged"][n_prompt:] == 0).all()
            assert (r["slots"][n_prompt:, 1:] == lo[-1]).all()           # decoded tokens: one code each
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
    with pytest.raises(ValueError, match="model.token_merger = 'tokens': expected one of none, item, pairs"):
        GRDecoder(SIZES, 6, 1, 1, 3, 3, max_len=8, token_merger="tokens")
