"""The GR recommender in-process: request validation, and overlap (two workers, one model thread) and the
naive baseline giving the engine's lists when batches run concurrently."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mindgr.bench import fixtures as fx
from mindgr.serve import generative as gr
from mindgr.serve.requests import RequestError

pytestmark = pytest.mark.graph_mode("auto")


@pytest.fixture(scope="module")
def bundle():
    return fx.random_bundle(num_items=80, prompt_tokens=16, dim=8, blocks=1, heads=2, level_sizes=(4, 4, 4, 2),
                            seed=3)


def test_gr_parse_refuses_bad_requests_in_one_line(bundle):
    rec = gr.GenerativeRecommender(bundle, beam=4, shapes=(1,))
    raw = fx.RAW_ID_BASE
    cases = [(([raw + 1, 7],), {}, "history[1]: unknown item id 7"), (([],), {}, "history: empty"),
             (([raw + 1],), {"k": 5}, "more than the beam width 4"), (([raw + 1],), {"k": 0}, "k: 0"),
             (([raw + 1] * 5000,), {}, "more than the limit")]
    for args, kw, words in cases:
        with pytest.raises(RequestError) as e:
            rec.parse(*args, **{"k": 3, **kw})
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="decode: 'fast'"):
        gr.GenerativeRecommender(bundle, beam=4, decode="fast")
    with pytest.raises(ValueError, match="--random-gr: 'width=3'"):
        fx.parse_random_spec("items=10,width=3")


def test_gr_overlap_and_naive_give_the_engine_lists_concurrently(bundle):
    rng = np.random.default_rng(0)
    qs = [[fx.RAW_ID_BASE + int(i) for i in rng.integers(1, 81, int(rng.integers(1, 9)))] for _ in range(8)]
    plain = gr.GenerativeRecommender(bundle, beam=6, shapes=(1,))          # one user per batch
    want = [plain.recommend([plain.parse(h, k=6, exclude_history=False)], 1)[0] for h in qs]
    for kind in ("overlap", "naive"):                                      # two users per batch
        rec = gr.GenerativeRecommender(bundle, beam=6, decode="naive" if kind == "naive" else "engine",
                                       shapes=(2,), overlap=True)
        try:
            rec.warm_up()
            batches = [[rec.parse(h, k=6, exclude_history=False) for h in qs[i:i + 2]] for i in range(0, 8, 2)]
            with ThreadPoolExecutor(2) as pool:             # two batches in flight at once
                got = [r for out in pool.map(lambda b: rec.recommend(b, 2), batches) for r in out]
        finally:
            rec.close()
        for (gi, gs), (wi, ws) in zip(got, want):
            np.testing.assert_array_equal(gi, wi)
            np.testing.assert_allclose(gs, ws, rtol=1e-5, atol=2e-5)


def test_gr_excluded_history_is_replaced_by_other_items(bundle):
    """exclude_history: the search skips the history's items, so a history that holds every item of the
    plain search's list still gets other items (the same beams' other children), each new to the user,
    where filtering the plain list would leave none."""
    rec = gr.GenerativeRecommender(bundle, beam=4, shapes=(1,))
    tail = [fx.RAW_ID_BASE + i for i in (5, 9, 14, 30)]          # the prompt: the last prompt_items items
    assert rec.prompt_items == len(tail)
    beam_items, _ = rec.search([rec.catalogue.to_internal(tail)])
    history = [int(x) for x in rec.catalogue.to_raw(beam_items[0][beam_items[0] > 0])] + tail
    kept = rec.parse(history, k=3, exclude_history=False)
    ids, _ = rec.recommend([kept])[0]
    np.testing.assert_array_equal(ids, beam_items[0][:3])
    q = rec.parse(history, k=2, exclude_history=True)
    ids, _ = rec.recommend([q])[0]
    assert len(ids) == 2 and not np.isin(ids, q.items).any()
    rec.check_complete(q, ids)


def test_gr_fewer_than_k_items_is_refused_like_the_hstu_server(bundle):
    """A history that holds every item the beams can reach: excluding it leaves fewer than k items, and the
    answer is a 422 reason (check_complete, the rule of both kinds of server), never a short list. With
    beam 1 the first level keeps one code; every item outside it but one is in the history, so nothing
    the beam can complete is left."""
    rec = gr.GenerativeRecommender(bundle, beam=1, shapes=(1,))
    tail = [fx.RAW_ID_BASE + i for i in (5, 9, 14, 30)]
    top, _ = rec.search([rec.catalogue.to_internal(tail)])
    codes = np.asarray(bundle.codes)
    first = codes[int(top[0][0]), 0]
    free = int(np.flatnonzero(codes[1:, 0] != first)[0]) + 1     # an item the beam cannot reach
    inside = rec.catalogue.to_internal(tail)
    rest = [i for i in range(1, codes.shape[0]) if i != free and i not in inside]
    history = [int(x) for x in rec.catalogue.to_raw(np.asarray(rest))] + tail
    q = rec.parse(history, k=1, exclude_history=True)
    ids, _ = rec.recommend([q])[0]
    assert len(ids) < 1
    with pytest.raises(RequestError) as e:
        rec.check_complete(q, ids)
    assert e.value.status == 422 and "only" in str(e.value) and "--beam" in str(e.value)


def test_linear_backbone_decode_modes_give_the_same_lists():
    """A random linear-attention decoder (`--random-gr ...,backbone=linear`) served with each --decode mode:
    OneLA (engine), the per-beam state, replay and the naive search give the same lists; replay is refused in
    one line on the HSTU backbone."""
    spec = fx.parse_random_spec("items=80,prompt=16,dim=8,blocks=1,heads=2,levels=4x4x4x2,seed=5,backbone=linear")
    lin = fx.random_bundle(**spec)
    assert lin.decoder.backbone == "linear"
    rng = np.random.default_rng(1)
    qs = [[fx.RAW_ID_BASE + int(i) for i in rng.integers(1, 81, int(rng.integers(1, 9)))] for _ in range(4)]
    got = {}
    for decode in gr.DECODES:
        rec = gr.GenerativeRecommender(lin, beam=6, decode=decode, shapes=(2,))
        got[decode] = [r for i in range(0, 4, 2)
                       for r in rec.recommend([rec.parse(h, k=6, exclude_history=False) for h in qs[i:i + 2]], 2)]
    for decode in gr.DECODES:
        for (gi, gs), (wi, ws) in zip(got[decode], got["naive"]):
            np.testing.assert_array_equal(gi, wi, err_msg=decode)
            np.testing.assert_allclose(gs, ws, rtol=1e-5, atol=2e-5, err_msg=decode)
    with pytest.raises(ValueError, match="decode layout 'replay': the hstu backbone has shared, per_beam"):
        gr.GenerativeRecommender(fx.random_bundle(num_items=80, prompt_tokens=16, dim=8, blocks=1, heads=2,
                                                  level_sizes=(4, 4, 4, 2)), beam=4, decode="replay")
    with pytest.raises(ValueError, match="expected backbone=hstu or backbone=linear"):
        fx.parse_random_spec("backbone=rnn")
