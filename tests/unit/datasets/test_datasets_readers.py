"""Readers: good input, every kind of malformed input, lenient skip counting."""
import gzip

import numpy as np
import pytest

from mindgr.datasets import (DataError, SkipCounter, read_kuairand, read_movielens_1m,  # noqa: E402
                             read_movielens_100k)


def _write(path, text):
    path.write_text(text)
    return path


def _raw(store, u):
    return store.item_raw_ids[store.item_seqs[u]].tolist()


# ------------------------------------------------------------------ errors.py

def test_data_error_is_one_line():
    e = DataError("a/b.dat", 3, "bad\nthing")
    assert str(e) == "a/b.dat:3: bad thing" and isinstance(e, ValueError)
    assert str(DataError("x", None, "gone")) == "x: gone"


def test_skip_counter_summary():
    c = SkipCounter()
    c.count("non-numeric field")
    c.count("negative id")
    c.count("non-numeric field")
    assert c.total == 3 and c["non-numeric field"] == 2 and c["other"] == 0
    assert c.summary() == "skipped 3 lines: 2 non-numeric field, 1 negative id"


# ------------------------------------------------------------ MovieLens-1M

RATINGS = """3::30::4::200
3::10::5::100
1::20::3::50
1::10::4::50
1::30::2::40
3::20::1::100
"""


def test_ml1m_ratings_sorted_stably_by_time(tmp_path):
    s = read_movielens_1m(_write(tmp_path / "ratings.dat", RATINGS))
    assert s.user_ids.tolist() == [1, 3]
    assert s.item_raw_ids.tolist() == [-1, 10, 20, 30]
    # user 1: 30@40, then the tie at 50 keeps file order 20, 10
    assert _raw(s, 0) == [30, 20, 10] and s.time_seqs[0].tolist() == [40, 50, 50]
    assert _raw(s, 1) == [10, 20, 30] and s.time_seqs[1].tolist() == [100, 100, 200]
    assert s.time_unit == "s" and s.name == "movielens-1m"
    assert all(q.dtype == np.int32 for q in s.item_seqs)


def test_ml1m_directory_prefers_ratings_then_gz_then_sequences(tmp_path):
    _write(tmp_path / "sequences.txt", "1 5 6\n")
    assert not read_movielens_1m(tmp_path).has_timestamps
    with gzip.open(tmp_path / "ratings.dat.gz", "wt") as f:
        f.write(RATINGS)
    assert read_movielens_1m(tmp_path).num_interactions == 6
    _write(tmp_path / "ratings.dat", "7::8::5::1\n")
    assert read_movielens_1m(tmp_path).num_interactions == 1
    (tmp_path / "sub").mkdir()
    with pytest.raises(DataError, match="no ratings.dat"):
        read_movielens_1m(tmp_path / "sub")


def test_ml1m_sequences_file_keeps_file_order(tmp_path):
    s = read_movielens_1m(_write(tmp_path / "sequences.txt", "2 9 3 9\n1 5\n"))
    assert s.user_ids.tolist() == [1, 2] and _raw(s, 1) == [9, 3, 9] and s.time_seqs is None


def test_ml1m_sequences_take_timestamps_for_the_users_a_ratings_file_covers(tmp_path, capsys):
    seqs = _write(tmp_path / "sequences.txt", "1 30 10 20\n2 10 30\n")
    ratings = _write(tmp_path / "ratings.dat", "1::10::5::200\n1::20::4::200\n1::30::3::100\n")
    store = read_movielens_1m(seqs, timestamps=ratings)
    assert _raw(store, 0) == [30, 10, 20] and store.time_seqs[0].tolist() == [100, 200, 200]
    assert store.time_seqs[1].tolist() == [0, 0]              # user 2 is not covered: no time information
    assert "for 1 of 2 users" in capsys.readouterr().err        # stderr: stdout carries results (mindgr eval)


@pytest.mark.parametrize("ratings, pattern", [
    ("1::10::5::200\n1::30::3::100\n", r"ratings.dat: user 1 of sequences.txt has no rating for item 20"),
    ("1::10::5::50\n1::20::4::200\n1::30::3::100\n", r"sequences.txt: user 1: time goes backwards at item 2"),
])
def test_ml1m_sequence_timestamps_must_cover_and_keep_order(tmp_path, ratings, pattern):
    seqs = _write(tmp_path / "sequences.txt", "1 30 10 20\n")
    with pytest.raises(DataError, match=pattern):
        read_movielens_1m(seqs, timestamps=_write(tmp_path / "ratings.dat", ratings))


def test_ml1m_timestamps_option_is_only_for_sequences(tmp_path):
    ratings = _write(tmp_path / "ratings.dat", "1::10::5::200\n")
    with pytest.raises(DataError, match="data.timestamps is for sequences.txt"):
        read_movielens_1m(ratings, timestamps=ratings)
    with pytest.raises(DataError, match="nope.dat: file not found"):
        read_movielens_1m(_write(tmp_path / "sequences.txt", "1 10\n"), timestamps=tmp_path / "nope.dat")


def test_ml1m_sequences_user_without_items_is_reported(tmp_path, capsys):
    s = read_movielens_1m(_write(tmp_path / "sequences.txt", "1 5 6\n2\n"))
    assert s.num_users == 1
    assert "dropped 1 users with no items" in capsys.readouterr().err


@pytest.mark.parametrize("text, line, pattern", [
    ("1::2::3::4\n1,2,3,4\n", 2, r"expected fields separated by '::'.*found ','"),
    ("1\t2\t3\t4\n", 1, r"expected fields separated by '::'.*found tab"),
    ("1::2::3::4\n1::x::3::4\n", 2, r"MovieID is not an integer: 'x'"),
    ("1::2::3::4\n1::2::3\n", 2, r"expected 4 fields .* found 3"),
    ("1::2::3::4::5\n", 1, r"expected 4 fields .* found 5"),
    ("-1::2::3::4\n", 1, r"UserID must be >= 1, got -1"),
    ("1::0::3::4\n", 1, r"MovieID must be >= 1, got 0"),
    ("1::2::3::-4\n", 1, r"Timestamp must be >= 0, got -4"),
    ("1::2::bad::4\n", 1, r"Rating is not a number"),
])
def test_ml1m_ratings_malformed(tmp_path, text, line, pattern):
    path = _write(tmp_path / "ratings.dat", text)
    with pytest.raises(DataError, match=pattern) as err:
        read_movielens_1m(path)
    assert str(err.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("text, line, pattern", [
    ("1 2 3\n2 x 4\n", 2, r"item 1 is not an integer: 'x'"),
    ("1,2,3\n", 1, r"expected space-separated.*found ','"),
    ("1 2 -3\n", 1, r"item 2 must be >= 1, got -3"),
    ("1 2 3\n1 4\n", 2, r"user 1 already appeared on line 1"),
])
def test_ml1m_sequences_malformed(tmp_path, text, line, pattern):
    path = _write(tmp_path / "sequences.txt", text)
    with pytest.raises(DataError, match=pattern) as err:
        read_movielens_1m(path)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_movielens_1m(tmp_path / "ratings.dat")
    with pytest.raises(DataError, match="file is empty"):
        read_movielens_1m(_write(tmp_path / "ratings.dat", ""))
    with pytest.raises(DataError, match="file is empty"):
        read_movielens_1m(_write(tmp_path / "ratings.dat", "\n  \n"))
    with pytest.raises(DataError, match="file not found"):
        read_movielens_100k(tmp_path)  # no u.data inside


def test_ml1m_lenient_counts_every_skip(tmp_path, capsys):
    text = "1::2::3::4\n1::x::3::4\n1,2,3,4\n-1::2::3::4\n1::2::3::-4\n1::y::3::4\n2::5::3::9\n"
    s = read_movielens_1m(_write(tmp_path / "ratings.dat", text), lenient=True)
    assert s.num_interactions == 2 and s.user_ids.tolist() == [1, 2]
    err = capsys.readouterr().err
    assert ("skipped 5 lines: 2 non-numeric field, 1 wrong delimiter, 1 negative id, 1 negative timestamp"
            in err)


def test_lenient_with_nothing_valid_still_fails(tmp_path):
    with pytest.raises(DataError, match="no valid interactions"):
        read_movielens_1m(_write(tmp_path / "ratings.dat", "a::b::c::d\n"), lenient=True)


# ------------------------------------------------------------ MovieLens-100K

def test_ml100k_file_and_directory(tmp_path):
    _write(tmp_path / "u.data", "5\t10\t3\t300\n5\t11\t4\t100\n2\t10\t1\t5\n5\t12\t4\t100\n")
    for src in (tmp_path, tmp_path / "u.data"):
        s = read_movielens_100k(src)
        assert s.user_ids.tolist() == [2, 5] and _raw(s, 1) == [11, 12, 10]
        assert s.time_seqs[1].tolist() == [100, 100, 300] and s.name == "movielens-100k"


@pytest.mark.parametrize("text, pattern", [
    ("1 2 3 4\n", r"expected fields separated by tab.*found space"),
    ("1::2::3::4\n", r"expected fields separated by tab.*found '::'"),
    ("1\t2\t3\n", r"expected 4 fields"),
    ("1\t2\t3\tnow\n", r"timestamp is not an integer"),
    ("1\t-2\t3\t4\n", r"item_id must be >= 1, got -2"),
])
def test_ml100k_malformed(tmp_path, text, pattern):
    path = _write(tmp_path / "u.data", text)
    with pytest.raises(DataError, match=pattern) as err:
        read_movielens_100k(path)
    assert str(err.value).startswith(f"{path}:1: ")


# ------------------------------------------------------------ KuaiRand

HEADER = "user_id,video_id,date,hourmin,time_ms,is_click,is_like,play_time_ms,tab\n"


def _row(user, video, time_ms, click, like=0):
    return f"{user},{video},20220408,1200,{time_ms},{click},{like},1000,1\n"


def test_kuairand_merges_files_filters_and_orders(tmp_path):
    _write(tmp_path / "log_b.csv", HEADER + _row(0, 7, 50, 1) + _row(0, 9, 10, 1) + _row(1, 3, 5, 0))
    _write(tmp_path / "log_a.csv", HEADER + _row(0, 8, 50, 1) + _row(0, 6, 20, 0) + _row(2, 3, 1, 1))
    _write(tmp_path / "other.csv", "not,a,log\n")  # ignored: not log_*
    s = read_kuairand(tmp_path)
    assert s.user_ids.tolist() == [0, 2] and s.time_unit == "ms" and s.name == "kuairand"
    # tie at 50: log_a.csv comes first (files sorted by name), so 8 before 7
    assert _raw(s, 0) == [9, 8, 7] and s.time_seqs[0].tolist() == [10, 50, 50]
    assert s.item_raw_ids.tolist() == [-1, 3, 7, 8, 9]


def test_kuairand_file_list_and_positive_column(tmp_path):
    f = _write(tmp_path / "x.csv", HEADER + _row(4, 1, 1, 1, like=0) + _row(4, 2, 2, 0, like=1))
    assert _raw(read_kuairand([f]), 0) == [1]
    assert _raw(read_kuairand([f], positive_column="is_like"), 0) == [2]


def test_kuairand_users_without_positives_are_reported(tmp_path, capsys):
    f = _write(tmp_path / "log_1.csv", HEADER + _row(1, 1, 1, 1) + _row(2, 1, 1, 0) + _row(3, 1, 1, 0))
    assert read_kuairand([f]).num_users == 1
    assert "dropped 2 users with no rows where is_click == 1" in capsys.readouterr().err
    g = _write(tmp_path / "log_2.csv", HEADER + _row(2, 1, 1, 0))
    with pytest.raises(DataError, match="no rows with is_click == 1"):
        read_kuairand([g])


def test_kuairand_missing_column_lists_found(tmp_path):
    f = _write(tmp_path / "log_1.csv", "user_id,video_id,is_click\n1,2,1\n")
    with pytest.raises(DataError, match=r"missing required column 'time_ms' \(found: user_id, video_id, is_click\)"):
        read_kuairand([f])
    with pytest.raises(DataError, match="missing required column 'is_bogus'"):
        read_kuairand([_write(tmp_path / "log_2.csv", HEADER + _row(1, 1, 1, 1))], positive_column="is_bogus")


@pytest.mark.parametrize("bad_row, pattern", [
    ("1,x,20220408,1200,30,1,0,1000,1\n", r"field video_id is not an integer: 'x'"),
    ("1,2,20220408,1200,30,1,0,1000\n", r"expected 9 fields \(as in the header\), found 8"),
    ("1,-2,20220408,1200,30,1,0,1000,1\n", r"video_id must be >= 0, got -2"),
    ("1,2,20220408,1200,-30,1,0,1000,1\n", r"time_ms must be >= 0, got -30"),
    ("1,2,20220408,1200,,1,0,1000,1\n", r"field time_ms is not an integer: ''"),
])
def test_kuairand_malformed_rows_name_the_line(tmp_path, bad_row, pattern):
    f = _write(tmp_path / "log_1.csv", HEADER + _row(1, 1, 1, 1) + _row(1, 2, 2, 0) + bad_row + _row(1, 3, 3, 1))
    with pytest.raises(DataError, match=pattern) as err:
        read_kuairand([f])
    assert str(err.value).startswith(f"{f}:4: ")


def test_kuairand_wrong_delimiter_empty_and_missing(tmp_path):
    tsv = _write(tmp_path / "log_t.csv", HEADER.replace(",", "\t") + _row(1, 1, 1, 1).replace(",", "\t"))
    with pytest.raises(DataError, match="expected comma-separated header, found tab"):
        read_kuairand([tsv])
    with pytest.raises(DataError, match="file is empty"):
        read_kuairand([_write(tmp_path / "log_e.csv", "")])
    with pytest.raises(DataError, match="file not found"):
        read_kuairand([tmp_path / "log_missing.csv"])
    empty_dir = tmp_path / "none"
    empty_dir.mkdir()
    with pytest.raises(DataError, match=r"no log_\*.csv files"):
        read_kuairand(empty_dir)


def test_kuairand_lenient_counts_skips(tmp_path, capsys):
    f = _write(tmp_path / "log_1.csv", HEADER + _row(1, 1, 1, 1) + "1,x,0,0,2,1,0,0,1\n" + "1,2,3\n"
               + _row(1, 5, 9, 1) + "1,-4,0,0,3,1,0,0,1\n")
    s = read_kuairand([f], lenient=True)
    assert _raw(s, 0) == [1, 5]
    assert "skipped 3 lines: 1 non-numeric field, 1 wrong number of fields, 1 negative id" in capsys.readouterr().err


# ------------------------------------------------------------ sequences (users' own `user item item ...`)

def test_sequences_kind_reads_any_file_name(tmp_path):
    from mindgr.datasets import read_sequences
    for name in ("seqs.txt", "my.dat", "data"):
        s = read_sequences(_write(tmp_path / name, "7 30 10 30\n2\t5 6\n\n3 6\n"))
        assert s.name == "sequences" and s.user_ids.tolist() == [2, 3, 7] and not s.has_timestamps
        assert [_raw(s, u) for u in range(3)] == [[5, 6], [6], [30, 10, 30]]


def test_ml1m_sequences_file_named_dat_is_read_as_sequences(tmp_path):
    s = read_movielens_1m(_write(tmp_path / "sequences.dat", "1 3 2\n2 1\n"))
    assert _raw(s, 0) == [3, 2] and not s.has_timestamps
    with pytest.raises(DataError, match=r"ratings\.dat:1: expected fields separated by '::'"):
        read_movielens_1m(_write(tmp_path / "ratings.dat", "1 3 2\n"))


@pytest.mark.parametrize("text, line, pattern", [
    ("1 2 3\n2 x 4\n", 2, r"item 1 is not an integer: 'x'"),
    ("1;2;3\n", 1, r"expected space-separated.*found ';'"),
    ("1 2 0\n", 1, r"item 2 must be >= 1, got 0"),
    ("5 2\n5 4\n", 2, r"user 5 already appeared on line 1"),
])
def test_sequences_malformed(tmp_path, text, line, pattern):
    from mindgr.datasets import read_sequences
    path = _write(tmp_path / "s.txt", text)
    with pytest.raises(DataError, match=pattern) as err:
        read_sequences(path)
    assert str(err.value).startswith(f"{path}:{line}: ")


def test_sequences_lenient_counts(tmp_path, capsys):
    from mindgr.datasets import read_sequences
    s = read_sequences(_write(tmp_path / "s.txt", "1 2 3\n2 x\n3,4\n4 5\n1 9\n"), lenient=True)
    assert s.user_ids.tolist() == [1, 4]
    assert "skipped 3 lines: 1 non-numeric field, 1 wrong delimiter, 1 duplicate user" in capsys.readouterr().err


# ------------------------------------------------------------ csv (an interaction log, columns configurable)

LOG = """uid,iid,ts,page
2,100,30,7
1,200,20,5
2,300,10,6
1,100,20,5
2,100,10,6
"""


def test_csv_orders_by_time_stably_and_keeps_pages(tmp_path):
    from mindgr.datasets import read_csv_log
    s = read_csv_log(_write(tmp_path / "log.csv", LOG), user_column="uid", item_column="iid", time_column="ts",
                     page_column="page")
    assert s.name == "csv" and s.user_ids.tolist() == [1, 2] and s.time_unit == "s"
    assert _raw(s, 0) == [200, 100] and s.time_seqs[0].tolist() == [20, 20]      # tie: file order
    assert _raw(s, 1) == [300, 100, 100] and s.time_seqs[1].tolist() == [10, 10, 30]
    assert [p.tolist() for p in s.page_seqs] == [[5, 5], [6, 6, 7]]


def test_csv_pages_survive_the_store_round_trip(tmp_path):
    from mindgr.datasets import read_csv_log, read_store, write_store
    s = read_csv_log(_write(tmp_path / "log.csv", LOG), user_column="uid", item_column="iid", time_column="ts",
                     page_column="page")
    write_store(s, tmp_path / "store")
    r = read_store(tmp_path / "store")
    assert [p.tolist() for p in r.page_seqs] == [p.tolist() for p in s.page_seqs]
    assert read_store(_store_without_pages(tmp_path)).page_seqs is None


def _store_without_pages(tmp_path):
    from mindgr.datasets import read_csv_log, write_store
    s = read_csv_log(_write(tmp_path / "plain.csv", "user_id,item_id,timestamp\n1,2,3\n"))
    write_store(s, tmp_path / "plain")
    return tmp_path / "plain"


@pytest.mark.parametrize("unit, stored, times", [("s", "s", [5, 9]), ("ms", "ms", [5, 9]),
                                                 ("us", "ms", [0, 0]), ("ns", "ms", [0, 0])])
def test_csv_time_units(tmp_path, unit, stored, times):
    from mindgr.datasets import read_csv_log
    s = read_csv_log(_write(tmp_path / "l.tsv", "u\ti\tt\n1\t2\t5\n1\t3\t9\n"), user_column="u", item_column="i",
                     time_column="t", separator="tab", time_unit=unit)
    assert s.time_unit == stored and s.time_seqs[0].tolist() == times


def test_csv_without_header_or_time_column(tmp_path):
    from mindgr.datasets import read_csv_log
    s = read_csv_log(_write(tmp_path / "l.txt", "9;1;x\n3;1;y\n4;2;z\n"), user_column=1, item_column=0,
                     time_column="", separator=";", header=False)
    assert s.user_ids.tolist() == [1, 2] and _raw(s, 0) == [9, 3] and not s.has_timestamps
    s = read_csv_log(_write(tmp_path / "h.csv", "user_id,item_id\n1,5\n1,4\n"), time_column="")
    assert _raw(s, 0) == [5, 4]


@pytest.mark.parametrize("text, kwargs, line, pattern", [
    ("user_id,item_id,timestamp\n1,2,3\n1,x,4\n", {}, 3, r"field item_id is not an integer: 'x'"),
    ("user_id,item_id,timestamp\n1,2,3\n1,2\n", {}, 3, r"expected 3 fields, found 2"),
    ("user_id,item_id,timestamp\n1,2,-3\n", {}, 2, r"timestamp must be >= 0, got -3"),
    ("user_id,item_id,timestamp\n-1,2,3\n", {}, 2, r"user_id must be >= 0, got -1"),
    ("user_id,item_id,timestamp\n1,,3\n", {}, 2, r"field item_id is empty"),
    ("user_id,item_id,timestamp\n1;2;3\n", {}, 2, r"separated by ','.*found ';'"),
    ("user_id,item_id,when\n1,2,3\n", {}, 1, r"missing time column 'timestamp' \(found: user_id, item_id, when\)"),
    ("user_id;item_id;timestamp\n1;2;3\n", {}, 1, r"missing user column 'user_id'.*separated by ';'"),
    ("1,2\n", {"header": False, "user_column": 0, "item_column": 1, "time_column": 5}, 1,
     r"time_column 5 does not exist: the row has 2 fields"),
])
def test_csv_malformed_names_file_and_line(tmp_path, text, kwargs, line, pattern):
    from mindgr.datasets import read_csv_log
    path = _write(tmp_path / "log.csv", text)
    with pytest.raises(DataError, match=pattern) as err:
        read_csv_log(path, **kwargs)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"time_unit": "days"}, r"time_unit 'days': expected one of s, ms, us, ns"),
    ({"separator": "::"}, r"separator '::': expected one character"),
    ({"header": False, "user_column": "uid"}, r"user_column 'uid': without a header, columns are 0-based"),
])
def test_csv_bad_options_name_the_file(tmp_path, kwargs, pattern):
    from mindgr.datasets import read_csv_log
    path = _write(tmp_path / "log.csv", "user_id,item_id,timestamp\n1,2,3\n")
    with pytest.raises(DataError, match=pattern) as err:
        read_csv_log(path, **kwargs)
    assert str(err.value).startswith(f"{path}: ")


def test_csv_lenient_counts_every_skip(tmp_path, capsys):
    from mindgr.datasets import read_csv_log
    text = "user_id,item_id,timestamp\n1,2,3\n1,x,4\n1,2\n2,,5\n2,7,8\n"
    s = read_csv_log(_write(tmp_path / "log.csv", text), lenient=True)
    assert s.user_ids.tolist() == [1, 2] and s.num_interactions == 2
    err = capsys.readouterr().err
    assert "skipped 3 lines:" in err and "1 non-numeric field" in err and "1 wrong number of fields" in err \
        and "1 missing field" in err
    with pytest.raises(DataError, match="no valid interactions"):
        read_csv_log(_write(tmp_path / "bad.csv", "user_id,item_id,timestamp\nx,1,1\n"), lenient=True)
