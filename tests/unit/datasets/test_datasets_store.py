"""SequenceStore: id remapping, stats, parquet round trip and validation on read."""
import json

import numpy as np
import pytest

from mindgr.datasets import DataError, SequenceStore, read_store, remap_items, write_store  # noqa: E402


def _store(times=True, unit="s"):
    raw = [np.array([50, 7, 50]), np.array([9]), np.array([7, 9, 1000, 7])]
    seqs, raw_ids = remap_items(raw)
    tseq = [np.array([1, 2, 2]), np.array([5]), np.array([0, 3, 3, 8])] if times else None
    return SequenceStore("toy", np.array([10, 20, 30]), seqs, tseq, raw_ids, unit)


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_remap_items_dense_in_raw_order():
    seqs, raw_ids = remap_items([np.array([50, 7, 50]), np.array([9])])
    assert raw_ids.tolist() == [-1, 7, 9, 50] and raw_ids.dtype == np.int64
    assert [s.tolist() for s in seqs] == [[3, 1, 3], [2]] and seqs[0].dtype == np.int32


def test_properties_and_stats():
    s = _store()
    assert (s.num_users, s.num_items, s.num_interactions, s.has_timestamps) == (3, 4, 8, True)
    assert s.lengths().tolist() == [3, 1, 4]
    st = s.stats()
    assert st["users"] == 3 and st["items"] == 4 and st["interactions"] == 8
    assert st["length_min"] == 1 and st["length_max"] == 4 and st["length_p50"] == 3
    assert {"length_mean", "length_p90", "length_p99", "time_unit", "has_timestamps"} <= set(st)


@pytest.mark.parametrize("times", [True, False])
def test_round_trip(tmp_path, times):
    s = _store(times=times, unit="ms")
    write_store(s, tmp_path / "out")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["items.parquet", "sequences.parquet", "stats.json"]  # no temp files left
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["interactions"] == 8
    r = read_store(tmp_path / "out")
    assert r.name == "toy" and r.time_unit == "ms"
    assert r.user_ids.tolist() == [10, 20, 30] and r.item_raw_ids.tolist() == s.item_raw_ids.tolist()
    assert _same(r.item_seqs, s.item_seqs) and all(q.dtype == np.int32 for q in r.item_seqs)
    if times:
        assert _same(r.time_seqs, s.time_seqs)
    else:
        assert r.time_seqs is None


def test_overwrite_existing_store(tmp_path):
    write_store(_store(), tmp_path)
    small = SequenceStore("small", np.array([1]), [np.array([1], np.int32)], None, np.array([-1, 5]))
    write_store(small, tmp_path)
    assert read_store(tmp_path).num_items == 1


def test_time_going_backwards_is_rejected(tmp_path):
    s = _store()
    s.time_seqs[2] = np.array([0, 3, 2, 8])
    write_store(s, tmp_path)
    with pytest.raises(DataError, match=r"sequences.parquet: row 2 \(user 30\): time goes backwards at position 2"):
        read_store(tmp_path)


def test_time_may_drop_across_users(tmp_path):
    s = _store()
    s.time_seqs[1] = np.array([0])  # lower than the previous user's last time: fine
    write_store(s, tmp_path)
    assert read_store(tmp_path).time_seqs[1].tolist() == [0]


@pytest.mark.parametrize("bad_id", [0, 5, -3])
def test_out_of_range_item_id_is_rejected(tmp_path, bad_id):
    s = _store()
    s.item_seqs[1] = np.array([bad_id], np.int32)
    write_store(s, tmp_path)
    with pytest.raises(DataError, match=rf"row 1 \(user 20\): item id {bad_id} outside 1..4"):
        read_store(tmp_path)


def test_length_mismatch_is_rejected(tmp_path):
    s = _store()
    s.time_seqs[0] = np.array([1, 2])
    write_store(s, tmp_path)
    with pytest.raises(DataError, match=r"row 0 \(user 10\): 2 timestamps for 3 items"):
        read_store(tmp_path)


def test_missing_files_and_columns(tmp_path):
    with pytest.raises(DataError, match="store directory not found"):
        read_store(tmp_path / "nope")
    write_store(_store(), tmp_path)
    (tmp_path / "items.parquet").unlink()
    with pytest.raises(DataError, match=r"items.parquet: file not found"):
        read_store(tmp_path)
    import pyarrow as pa
    import pyarrow.parquet as pq
    write_store(_store(), tmp_path)
    pq.write_table(pa.table({"user_id": [1]}), tmp_path / "sequences.parquet")
    with pytest.raises(DataError, match=r"missing column 'item_ids' \(found: user_id\)"):
        read_store(tmp_path)
    (tmp_path / "sequences.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="cannot read parquet"):
        read_store(tmp_path)
