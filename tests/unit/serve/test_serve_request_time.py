"""Serving ranks with the request's request_time as the model says (model.request_time, HSTU).

An untrained HSTU with O(1)-scale weights and the switch on, behind the Recommender: the ranking of a
query equals the exact top-k of EncodeLast's user vector at that request time, a later request time
changes it, and an absent request_time is the last history timestamp. No trained run is needed.
"""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.models.hstu import HSTU
from mindgr.serve.requests import Catalogue
from mindgr.serve.retrieval import Recommender
from mindgr.train.step import EncodeLast

pytestmark = pytest.mark.graph_mode("reference")

ITEMS, D, N = 40, 8, 6


@pytest.fixture(scope="module")
def recommender():
    enc = HSTU(ITEMS, D, 1, 2, 4, 4, N, dropout=0.0, time_bias=True, num_time_buckets=32, seed=1,
               request_time=True)
    rng = np.random.default_rng(0)
    for p in enc.trainable_params():
        if p.name.endswith(("w_ts", "w_uvqk")):
            p.set_data(Tensor((rng.standard_normal(p.shape) * 2.0).astype(np.float32)))
    table = enc.item_table().asnumpy()
    raw = np.concatenate([[-1], np.arange(1, ITEMS + 1) * 10]).astype(np.int64)
    return Recommender(EncodeLast(enc), table, Catalogue(raw), N, shapes=(2,)), table


def test_request_time_changes_the_ranking_as_the_model_says(recommender):
    rec, table = recommender
    history, times = [30, 70, 120, 50], [1000, 1010, 1500, 1600]
    now = rec.parse(history, times, k=10)
    soon = rec.parse(history, times, request_time=1603, k=10)
    late = rec.parse(history, times, request_time=1600 + 10 ** 6, k=10)
    assert now.when() == 1600
    queries = [now, soon, late]
    users = np.concatenate([rec.encode(queries[:2], 2), rec.encode(queries[2:], 2)])
    ranked = rec.recommend(queries[:2]) + rec.recommend(queries[2:])
    for q, (ids, _), user in zip(queries, ranked, users):
        scores = table @ user
        scores[0] = -np.inf
        scores[q.items] = -np.inf                    # the history is excluded
        assert ids.tolist() == np.argsort(-scores, kind="stable")[:10].tolist()
    assert not np.allclose(users[0], users[2], atol=1e-4)      # a later request: another user vector
    assert ranked[0][0].tolist() != ranked[2][0].tolist()      # ... and another ranking
    # absent request_time = the last timestamp: bitwise the same vector as giving it
    same = rec.parse(history, times, request_time=1600, k=10)
    assert np.array_equal(rec.encode([same], 2), rec.encode([now], 2))
