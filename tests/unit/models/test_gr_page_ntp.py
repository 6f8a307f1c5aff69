"""Page-wise NTP against a hand-computed value, and point-wise as the default for page-less data.

History a b c d with pages [0, 1, 1, 2]; nll(x | prompt) = -log p(x | prompt) by teacher forcing
(the exhaustive reference item_log_probs, computed outside the loss graph):
    page_ntp = ( (nll(b|a) + nll(c|a)) / 2 + nll(d|abc) ) / 2        (b and c: same prompt, no order)
    ntp      = ( nll(b|a) + nll(c|ab) + nll(d|abc) ) / 3
Tolerance: 1e-5 relative (float32 sums of a few log-probs).
"""
import numpy as np
import pytest

from mindspore import Tensor

from mindgr.models.generative import GRDecoder, item_log_probs
from mindgr.models.ntp import NTPLoss, RowError, batch_tensors, pack_rows, user_rows
from gr_fixtures import fast_backend, random_codes  # noqa: F401

pytestmark = pytest.mark.graph_mode("auto")

SIZES = [3, 3, 2]




def test_page_ntp_equals_hand_computed():
    rng = np.random.default_rng(21)
    codes = random_codes(rng, 10, SIZES)
    dec = GRDecoder(SIZES, 8, 2, 2, 4, 4, max_len=12, seed=3)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.3).astype(np.float32)))
    a, b, c, d = 4, 7, 2, 9
    items, pages = np.array([a, b, c, d]), np.array([5, 8, 8, 3])   # any ids, equal within a page
    lp = item_log_probs(dec, [[a], [a, b], [a, b, c]], codes, 9)
    nll = lambda u, x: -float(lp[u, x])  # noqa: E731
    want_page = ((nll(0, b) + nll(0, c)) / 2 + nll(2, d)) / 2
    want_point = (nll(0, b) + nll(1, c) + nll(2, d)) / 3

    loss = NTPLoss(dec)

    def value(rows):
        batches = pack_rows(rows, 40, 4, dec.group, dec.pad_id)
        assert len(batches) == 1
        return float(loss(*batch_tensors(batches[0])).asnumpy())

    page_rows = user_rows(items, codes, dec.level_offsets, "page_ntp", pages=pages)
    assert len(page_rows) == 3                              # b and c share the prompt [a]: a row each
    got_page = value(page_rows)
    got_point = value(user_rows(items, codes, dec.level_offsets))          # the default: ntp
    assert abs(got_page - want_page) <= 1e-5 * abs(want_page), (got_page, want_page)
    assert abs(got_point - want_point) <= 1e-5 * abs(want_point), (got_point, want_point)
    assert abs(got_page - got_point) > 1e-3                 # the objectives really differ here
    # one item per page: page-wise is point-wise
    single = value(user_rows(items, codes, dec.level_offsets, "page_ntp", pages=np.arange(4)))
    assert abs(single - got_point) <= 1e-5 * abs(got_point)


def test_page_rows_errors():
    codes = random_codes(np.random.default_rng(0), 6, SIZES)
    lo = np.array([0, 3, 6, 8])
    with pytest.raises(RowError, match="page_ntp needs pages"):
        user_rows([1, 2, 3], codes, lo, "page_ntp")
    with pytest.raises(RowError, match="page id 1 appears in two separate runs"):
        user_rows([1, 2, 3], codes, lo, "page_ntp", pages=[1, 2, 1])
    with pytest.raises(RowError, match="pages has 2 ids for 3 items"):
        user_rows([1, 2, 3], codes, lo, "page_ntp", pages=[1, 2])
    with pytest.raises(RowError, match="loss.objective = 'listwise'"):
        user_rows([1, 2, 3], codes, lo, "listwise")
    with pytest.raises(RowError, match="model.token_merger = 'all': expected one of none, item, item_id, pairs"):
        user_rows([1, 2, 3], codes, lo, "ntp", "all")
    with pytest.raises(RowError, match="target_weights has 2 weights for 3 items"):
        user_rows([1, 2, 3], codes, lo, target_weights=[1.0, 0.0])
    with pytest.raises(RowError, match="more than the token capacity 4"):
        pack_rows(user_rows([1, 2, 3], codes, lo), 4, 2, 1, 8)
