"""Semantic-ID table on disk, item vectors from files and runs, and `mindgr ids build` with one-line errors."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mindgr.cli import main
from mindgr.ids import TokenizerError, load_codes, save_codes, tokenize
from mindgr.ids.vectors import file_item_vectors
from mindgr.train.item_table import run_item_vectors


def one_line_error(capsys, argv, code, *words):
    assert main(argv) == code
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("mindgr: error:"), lines
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_save_then_load_round_trips(tmp_path):
    x = np.random.default_rng(0).normal(size=(60, 5))
    t = tokenize(x, levels=2, codes=4)
    raw = np.concatenate([[-1], np.arange(60) * 7 + 3])
    path = save_codes(tmp_path / "ids" / "codes.parquet", t.codes, t.level_sizes, raw, t.stats)
    codes, sizes, raw_ids = load_codes(path)
    assert np.array_equal(codes, t.codes) and codes.dtype == np.int32 and not codes[0].any()
    assert np.array_equal(sizes, t.level_sizes) and np.array_equal(raw_ids, raw)
    table = pq.read_table(path)
    assert table.column_names == ["item", "raw_item", "c0", "c1", "c2"]
    stats = json.loads((tmp_path / "ids" / "codes.json").read_text())
    assert stats["distinct_tuples"] == t.stats["distinct_tuples"] and stats["level_sizes"] == list(t.level_sizes)


def write_table(path, columns, sizes):
    pq.write_table(pa.table(columns).replace_schema_metadata({"mindgr.level_sizes": json.dumps(sizes)}), path)


def test_load_rejects_bad_tables(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such semantic-ID table"):
        load_codes(tmp_path / "none.parquet")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(TokenizerError, match="not a readable Parquet"):
        load_codes(tmp_path / "junk.parquet")
    good = {"item": [1, 2, 3], "raw_item": [5, 6, 7], "c0": [0, 1, 1], "c1": [0, 0, 1]}
    cases = [({**good, "c0": [0, 1, 2]}, "item 3 has code c0 = 2, outside 0..1"),
             ({**good, "c1": [0, 1, 1]}, "two items share one code tuple"),
             ({**good, "item": [1, 2, 4]}, "exactly 1..3"),
             ({k: v for k, v in good.items() if k != "c1"}, "missing column(s) c1")]
    for n, (cols, words) in enumerate(cases):
        write_table(tmp_path / f"bad{n}.parquet", cols, [2, 2])
        with pytest.raises(TokenizerError) as e:
            load_codes(tmp_path / f"bad{n}.parquet")
        assert words in str(e.value) and "\n" not in str(e.value)
    pq.write_table(pa.table(good), tmp_path / "nometa.parquet")
    with pytest.raises(TokenizerError, match="no level_sizes"):
        load_codes(tmp_path / "nometa.parquet")
    write_table(tmp_path / "shuffled.parquet", {**good, "item": [3, 1, 2]}, [2, 2])
    codes, _, raw = load_codes(tmp_path / "shuffled.parquet")   # rows come back in item order
    assert codes[3].tolist() == [0, 0] and raw.tolist() == [-1, 6, 7, 5]


def test_vector_files_agree_and_are_ordered_by_raw_id(tmp_path):
    rng = np.random.default_rng(1)
    ids = np.array([30, 10, 20, 40])
    vec = rng.normal(size=(4, 3))
    (tmp_path / "v.csv").write_text("item_id,a,b,c\n" + "".join(
        f"{i},{','.join(repr(float(v)) for v in row)}\n" for i, row in zip(ids, vec)))
    pq.write_table(pa.table({"item": ids, "vector": [list(r) for r in vec]}), tmp_path / "list.parquet")
    pq.write_table(pa.table({"item_id": ids, "x": vec[:, 0], "y": vec[:, 1], "z": vec[:, 2]}),
                   tmp_path / "cols.parquet")
    order = np.argsort(ids)
    for name in ("v.csv", "list.parquet", "cols.parquet"):
        v, raw = file_item_vectors(tmp_path / name)
        assert raw.tolist() == [-1, 10, 20, 30, 40], name
        np.testing.assert_array_equal(v, vec[order])
    np.save(tmp_path / "v.npy", vec)
    v, raw = file_item_vectors(tmp_path / "v.npy")
    assert raw.tolist() == [-1, 1, 2, 3, 4] and np.array_equal(v, vec)


@pytest.mark.parametrize("name, text, words", [
    ("empty.csv", "", "empty file"),
    ("header.csv", "item,v0\n", "empty file"),
    ("dup.csv", "1,0.5\n2,0.1\n1,0.3\n", "item id 1 appears more than once"),
    ("ragged.csv", "1,0.5,0.2\n2,0.1\n", "data line 2: 1 values, expected 2"),
    ("text.csv", "1,0.5\n2,abc\n", "data line 2"),
    ("v.txt", "1 2 3\n", "unknown vectors format .txt"),
])
def test_bad_vector_files_are_one_line_errors(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(TokenizerError) as e:
        file_item_vectors(tmp_path / name)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_ids_build_from_a_file_prints_statistics(tmp_path, capsys):
    rng = np.random.default_rng(2)
    np.save(tmp_path / "v.npy", rng.normal(size=(300, 8)))
    out = tmp_path / "codes.parquet"
    assert main(["ids", "build", "--vectors", str(tmp_path / "v.npy"), "--out", str(out), "--levels", "2",
                 "--codes", "8", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    codes, sizes, _ = load_codes(out)
    stats = json.loads(out.with_suffix(".json").read_text())
    assert codes.shape == (301, 3) and sizes[:2].tolist() == [8, 8]
    assert f"distinct tuples before the digit {stats['distinct_tuples']} of 300" in printed
    assert f"largest bucket {stats['largest_bucket']}" in printed and "codebook usage per level" in printed
    assert stats["seed"] == 3 and stats["source"] == {"vectors": str(tmp_path / "v.npy")}


def test_ids_build_errors_are_one_line(tmp_path, capsys):
    nan = np.ones((20, 3))
    nan[4, 1] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    np.save(tmp_path / "few.npy", np.random.default_rng(0).normal(size=(5, 3)))
    dup = np.random.default_rng(0).normal(size=(30, 3))
    dup[:6] = dup[0]
    np.save(tmp_path / "dup.npy", dup)
    (tmp_path / "empty.npy").write_bytes(b"")
    out = ["--out", str(tmp_path / "o.parquet")]
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "nan.npy")] + out, 1, "NaN", "row 4")
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "few.npy")] + out, 1,
                   "256 codes per level but only 5 items")
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "empty.npy")] + out, 1, "empty file")
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "dup.npy"), "--codes", "2",
                            "--levels", "1", "--dedup-range", "3"] + out, 1, "raise --dedup-range")
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "few.npy")], 1, "needs --out")
    one_line_error(capsys, ["ids", "build", "--vectors", str(tmp_path / "none.npy")] + out, 1, "none.npy")
    one_line_error(capsys, ["ids", "build", "--run", str(tmp_path)], 1, "not a run directory")
    assert not (tmp_path / "o.parquet").exists()


def fake_run(tmp_path, tiny_overrides, tensors_for):
    """A run directory as the trainer leaves it (config.yaml + a best checkpoint), without training:
    tensors_for(num_items) gives the checkpoint's tensors."""
    import yaml
    from mindgr.config import load_config
    from mindgr.train.checkpoint import CheckpointManager
    from mindgr.train.data import load_store
    cfg = load_config(None, tiny_overrides)
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    store = load_store(cfg.data, cfg.run.seed)
    CheckpointManager(run, 1).save_best(tensors_for(store.num_items), {"step": 1})
    return run, store


def test_ids_build_from_a_run_reads_its_best_item_table(tmp_path, tiny_overrides, capsys):
    rng = np.random.default_rng(4)
    tables = {}

    def tensors(v):
        tables["item"] = rng.normal(size=(v + 1, 6)).astype(np.float32)
        return {"loss_net.encoder.item_emb": tables["item"], "optimizer.adam_m.encoder.item_emb": tables["item"] * 0,
                "loss_net.encoder.pos_emb": np.ones((3, 6), np.float32)}

    run, store = fake_run(tmp_path, tiny_overrides, tensors)
    assert main(["ids", "build", "--run", str(run), "--codes", "4", "--levels", "2"]) == 0
    assert "distinct tuples before the digit" in capsys.readouterr().out
    codes, sizes, raw = load_codes(run / "ids" / "codes.parquet")
    assert np.array_equal(raw, store.item_raw_ids) and codes.shape == (store.num_items + 1, 3)
    assert np.array_equal(codes, tokenize(tables["item"][1:], levels=2, codes=4).codes)   # rows 1..V


def test_a_run_without_one_item_table_is_a_one_line_error(tmp_path, tiny_overrides, capsys):
    run, _ = fake_run(tmp_path, tiny_overrides, lambda v: {"loss_net.encoder.pos_emb": np.ones((3, 6), np.float32)})
    one_line_error(capsys, ["ids", "build", "--run", str(run)], 1, "0 item tables")
    (run / "checkpoints" / "best.json").unlink()
    one_line_error(capsys, ["ids", "build", "--run", str(run)], 1, "no checkpoint")


def test_a_run_whose_table_does_not_fit_its_data_is_a_one_line_error(tmp_path, tiny_overrides, capsys):
    run, _ = fake_run(tmp_path, tiny_overrides,
                      lambda v: {"loss_net.encoder.item_emb": np.ones((v + 3, 4), np.float32)})
    one_line_error(capsys, ["ids", "build", "--run", str(run)], 1, "was the data changed?")
