"""The peer side-by-side driver's data conversion (benchmarks/peer/tiger_side_by_side.py): the peer sees
MindGR's split and code table, and MindGR's items-per-token count matches its training rows."""
import importlib.util
import os

import numpy as np
import pytest

from conftest import REPO


def _driver():
    spec = importlib.util.spec_from_file_location("tiger_side_by_side", REPO / "benchmarks/peer/tiger_side_by_side.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _codes(num_items, levels, rng):
    codes = np.zeros((num_items + 1, levels), np.int32)
    codes[1:] = rng.integers(0, 50, (num_items, levels))
    return codes


def test_split_prompts_and_code_columns():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 31, int(rng.integers(3, 30))).astype(np.int32) for _ in range(40)]
    codes = _codes(30, 4, rng)
    z = _driver().beauty_for_peer(seqs, codes, max_len=20, holdout=2)
    train = np.split(z["train_items"], z["train_offsets"][1:-1])
    test = np.split(z["test_items"], z["test_offsets"][1:-1])
    assert len(train) == len(test) == len(seqs) and z["train_users"].tolist() == list(range(len(seqs)))
    for s, tr, te in zip(seqs, train, test):
        assert tr.tolist() == [int(x) - 1 for x in s[:-2]]            # training items: all but the last two
        assert te.tolist() == [int(x) - 1 for x in s[:-1][-20:]]       # prompt: the last 20 before the test item
    assert z["sids"].shape == (4, 30)
    for item in range(1, 31):                                          # column i holds item i+1's codes
        assert z["sids"][:, item - 1].tolist() == codes[item].tolist()


def test_items_per_token_counts_the_training_rows():
    from mindgr.models.ntp import tokens_per_prompt_item
    seqs = [np.arange(1, n + 1) for n in (5, 7, 30)]
    per = tokens_per_prompt_item(4, "item")
    rows = tokens = 0
    for s in seqs:                       # a window of the last 21 training items, a row per target after the first
        n = min(len(s) - 2, 21)
        rows += n - 1
        tokens += sum(j * per + 3 for j in range(1, n))
    got = _driver().mindgr_items_per_token(seqs, levels=4, max_len=20, token_merger="item", holdout=2)
    assert np.isclose(got, rows / tokens)


def test_real_beauty_conversion():
    path = REPO / ".." / "shared" / "data" / "amazon-beauty" / "Beauty.txt"
    if os.environ.get("MINDGR_DATA_DIR"):
        path = os.path.join(os.environ["MINDGR_DATA_DIR"], "amazon-beauty", "Beauty.txt")
    if not os.path.isfile(path):
        pytest.skip("Amazon Beauty is not in ../shared/data")
    seqs = [np.array(line.split()[1:], np.int64) for line in open(path)]
    ids = np.unique(np.concatenate(seqs))
    dense = [np.searchsorted(ids, s) + 1 for s in seqs]
    codes = _codes(len(ids), 4, np.random.default_rng(1))
    z = _driver().beauty_for_peer(dense, codes, max_len=20)
    assert len(z["train_users"]) == 22363 and z["sids"].shape == (4, 12101)
    assert z["train_items"].min() == 0 and z["train_items"].max() < 12101
    assert len(z["train_items"]) == 198502 - 2 * 22363
