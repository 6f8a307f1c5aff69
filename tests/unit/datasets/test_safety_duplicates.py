"""Duplicate events in a csv log: counted and reported by `data prepare` (summary and stats.json), kept by
default, dropped with `--option dedupe=true` (the first of each kept)."""
import json

import numpy as np
import pytest

from mindgr.datasets.csvlog import duplicate_events, read_csv_log

LOG = """user_id,item_id,timestamp
1,10,100
1,11,200
1,11,200
2,10,50
1,11,300
2,12,60
2,10,50
2,10,50
"""


def _brute(rows, timed):
    """Reference: a row is a duplicate if an earlier row has the same key (timed), or if it repeats its
    user's previous row (untimed)."""
    out, seen, last = [], set(), {}
    for r in rows:
        if timed:
            out.append(r in seen)
            seen.add(r)
        else:
            out.append(last.get(r[0]) == r)
            last[r[0]] = r
    return np.array(out)


@pytest.mark.parametrize("timed", [True, False])
def test_duplicate_mask_equals_a_plain_reference_on_random_logs(timed):
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        cols = {"user": rng.integers(0, 4, n), "item": rng.integers(0, 5, n), "page": rng.integers(0, 2, n)}
        if timed:
            cols["time"] = rng.integers(0, 4, n)
        roles = [r for r in ("user", "item", "time", "page") if r in cols]
        rows = [tuple(int(cols[r][i]) for r in roles) for i in range(n)]
        got = duplicate_events({r: list(cols[r]) for r in roles})
        np.testing.assert_array_equal(got, _brute(rows, timed))


def test_prepare_reports_duplicates_and_dedupe_drops_them(tmp_path, capsys):
    from mindgr.cli import main
    src = tmp_path / "log.csv"
    src.write_text(LOG)
    store = read_csv_log(src)
    assert store.stats()["duplicate_events"] == 3 and store.num_interactions == 8
    assert main(["data", "prepare", "csv", "--src", str(src), "--out", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    assert "duplicates     3 events repeated an earlier one (kept; --option dedupe=true drops them)" in out
    stats = json.loads((tmp_path / "kept" / "stats.json").read_text())
    assert stats["duplicate_events"] == 3 and stats["duplicates_dropped"] is False and stats["interactions"] == 8
    assert main(["data", "prepare", "csv", "--src", str(src), "--out", str(tmp_path / "dd"),
                 "--option", "dedupe=true"]) == 0
    assert "(dropped)" in capsys.readouterr().out
    stats = json.loads((tmp_path / "dd" / "stats.json").read_text())
    assert stats["duplicate_events"] == 3 and stats["duplicates_dropped"] is True and stats["interactions"] == 5
    deduped = read_csv_log(src, dedupe=True)
    raw = deduped.item_raw_ids
    assert [list(raw[s]) for s in deduped.item_seqs] == [[10, 11, 11], [10, 12]]   # user 1's later 11 is kept
    # without a time column only back-to-back repeats of a user's row count (re-consumption is not a duplicate)
    src.write_text("u,i\n1,5\n1,5\n1,6\n1,5\n")
    store = read_csv_log(src, user_column="u", item_column="i", time_column="")
    assert store.stats()["duplicate_events"] == 1


def test_a_run_config_reads_with_dedupe(tmp_path):
    from mindgr.config import load_config
    from mindgr.train.data import load_store
    src = tmp_path / "log.csv"
    src.write_text(LOG)
    for dedupe, n in (("false", 8), ("true", 5)):
        cfg = load_config(None, ["data.kind=csv", f"data.path={src}", f"data.csv.dedupe={dedupe}"])
        assert load_store(cfg.data).num_interactions == n
