"""A value per interaction (a rating): kept by the ML-1M and ML-100K readers, the csv value_column and the
synthetic generator; carried through the store's files, the leave-one-out split and timestamp pages;
absent (None) everywhere else, with the item streams unchanged."""
import gzip

import numpy as np
import pytest

from mindgr.datasets import (DataError, generate_synthetic, leave_one_out, read_csv_log, read_movielens_100k,
                             read_movielens_1m, read_store, write_store)

from conftest import DATA_DIR
ML1M = DATA_DIR / "ml-1m" / "ratings_users_1-2999.dat.gz"


def _by_user(store):
    """{raw user: [(raw item, value), ...]} in stored order."""
    return {int(u): [(int(store.item_raw_ids[i]), float(v)) for i, v in zip(s, vals)]
            for u, s, vals in zip(store.user_ids, store.item_seqs, store.value_seqs)}


def _round_trip(store, tmp_path):
    write_store(store, tmp_path / "store")
    back = read_store(tmp_path / "store")
    assert back.has_values == store.has_values
    if store.has_values:
        for a, b in zip(store.value_seqs, back.value_seqs):
            assert b.dtype == np.float32 and np.array_equal(a, b)
    return back


def test_ml1m_ratings_keep_the_rating(tmp_path):
    path = tmp_path / "ratings.dat.gz"
    with gzip.open(path, "wt") as f:
        f.write("1::10::5::300\n1::20::3::100\n2::10::1::50\n2::30::4::60\n")
    store = read_movielens_1m(path)
    assert _by_user(store) == {1: [(20, 3.0), (10, 5.0)], 2: [(10, 1.0), (30, 4.0)]}   # ordered by time
    _round_trip(store, tmp_path)


def test_ml1m_sequences_have_no_values(tmp_path):
    path = tmp_path / "sequences.txt"
    path.write_text("1 10 20 30\n2 20 10\n")
    store = read_movielens_1m(path)
    assert store.value_seqs is None and not store.has_values
    back = _round_trip(store, tmp_path)
    assert back.value_seqs is None and "has_values" not in back.stats()


def test_ml100k_keeps_the_rating(tmp_path):
    (tmp_path / "u.data").write_text("1\t10\t4\t5\n1\t11\t2\t3\n2\t10\t5\t1\n")
    store = read_movielens_100k(tmp_path)
    assert _by_user(store) == {1: [(11, 2.0), (10, 4.0)], 2: [(10, 5.0)]}
    _round_trip(store, tmp_path)


def test_csv_value_column_and_its_errors(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("user,item,t,rating\n1,10,5,0.5\n1,11,3,1.25\n2,10,1,-2\n")
    store = read_csv_log(path, user_column="user", item_column="item", time_column="t", value_column="rating")
    assert _by_user(store) == {1: [(11, 1.25), (10, 0.5)], 2: [(10, -2.0)]}
    _round_trip(store, tmp_path)
    plain = read_csv_log(path, user_column="user", item_column="item", time_column="t")
    assert plain.value_seqs is None
    with pytest.raises(DataError, match="missing value column 'score'"):
        read_csv_log(path, user_column="user", item_column="item", time_column="t", value_column="score")
    bad = tmp_path / "bad.csv"
    bad.write_text("user,item,t,rating\n1,10,5,good\n")
    with pytest.raises(DataError, match=r"bad.csv:2: field rating is not a number"):
        read_csv_log(bad, user_column="user", item_column="item", time_column="t", value_column="rating")


def test_csv_value_column_through_the_config(tmp_path):
    from mindgr.config import load_config
    from mindgr.train.data import load_store
    path = tmp_path / "log.csv"
    path.write_text("user_id,item_id,timestamp,stars\n1,10,5,3\n1,11,6,4\n")
    cfg = load_config(None, ["data.kind=csv", f"data.path={path}", "data.csv.value_column=stars"])
    assert _by_user(load_store(cfg.data)) == {1: [(10, 3.0), (11, 4.0)]}


def test_synthetic_values_only_for_synthetic_data(tmp_path):
    from mindgr.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="data.synthetic.values = true: only for data.kind synthetic"):
        load_config(None, ["data.kind=csv", f"data.path={tmp_path}", "data.synthetic.values=true"])


def test_synthetic_values_leave_the_items_unchanged(tmp_path):
    for page_size in (0.0, 3.0):
        plain = generate_synthetic(num_users=200, num_items=80, seed=5, page_size=page_size)
        rated = generate_synthetic(num_users=200, num_items=80, seed=5, page_size=page_size, values=True)
        assert plain.value_seqs is None
        for field in ("item_seqs", "time_seqs") + (("page_seqs",) if page_size else ()):
            assert all(np.array_equal(a, b) for a, b in zip(getattr(plain, field), getattr(rated, field)))
        v = np.concatenate(rated.value_seqs)
        assert v.dtype == np.float32 and set(np.unique(v)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
        again = generate_synthetic(num_users=200, num_items=80, seed=5, page_size=page_size, values=True)
        assert all(np.array_equal(a, b) for a, b in zip(rated.value_seqs, again.value_seqs))  # deterministic
    _round_trip(rated, tmp_path)


def test_synthetic_values_depend_on_the_user():
    """The same item is rated differently by different users (the interest term), beyond noise: the spread
    of one item's ratings across users exceeds what noise alone gives."""
    store = generate_synthetic(num_users=400, num_items=50, seed=2, values=True)
    items = np.concatenate(store.item_seqs)
    values = np.concatenate(store.value_seqs)
    users = np.repeat(np.arange(store.num_users), store.lengths())
    item = np.bincount(items).argmax()
    per_user = np.array([values[(items == item) & (users == u)].mean() for u in np.unique(users[items == item])])
    assert per_user.max() - per_user.min() >= 3


def test_split_and_pages_carry_the_values():
    from mindgr.datasets.pages import timestamp_pages
    store = generate_synthetic(num_users=50, num_items=40, seed=1, values=True)
    split = leave_one_out(store, holdout=2)
    for k, u in enumerate(split.train_users):
        assert np.array_equal(split.train_values[k], store.value_seqs[u][:-2])
    for evalset, back in ((split.valid, 2), (split.test, 1)):
        assert np.array_equal(evalset.target_values, [store.value_seqs[u][-back] for u in evalset.users])
        assert all(np.array_equal(h, store.value_seqs[u][:-back])
                   for h, u in zip(evalset.history_values, evalset.users))
    plain = leave_one_out(generate_synthetic(num_users=50, num_items=40, seed=1), holdout=2)
    assert plain.train_values is None and plain.test.target_values is None
    paged, _ = timestamp_pages(store)
    assert len(paged.value_seqs) == paged.num_users


@pytest.mark.skipif(not ML1M.is_file(), reason="the ML-1M ratings of users 1-2999 are not on this machine")
def test_ml1m_ratings_of_users_1_2999():
    store = read_movielens_1m(ML1M)
    v = np.concatenate(store.value_seqs)
    assert store.num_users == 2999 and len(v) == 487650 and set(np.unique(v)) == {1.0, 2.0, 3.0, 4.0, 5.0}
