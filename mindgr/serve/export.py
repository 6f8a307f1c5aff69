"""`mindgr export`: a run's user encoder as MindIR at each batch shape the server uses, plus the item table.

Written into DIR:
  encoder-r{rows}.mindir  the run's EncodeLast (history -> last-position user vector, unit norm) at
                          rows rows and rows * max_len tokens; inputs ids int32 [T], positions int32 [T],
                          offsets int32 [rows + 1], timestamps int64 [T] (seconds), request_times int64
                          [rows] (seconds; used by a model trained with model.request_time); output
                          float32 [rows, D]. Format 1 exports (before request times) have no
                          request_times input; load_export calls them without it.
  item_table.npy          float32 [V+1, D] unit rows, row 0 = padding
  item_raw_ids.npy        int64 [V+1]: internal id -> raw id ([0] = -1)
  manifest.json           model config, data fingerprint (when the run records one), shapes, dtypes, files

load_export(DIR) reads it back with mindspore.load + nn.GraphCell.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mindgr.serve.recommend import DEFAULT_SHAPES, pack

MANIFEST = "manifest.json"
FORMAT_VERSION = 2   # 2: the encoders take request_times


def _encoder_name(rows: int) -> str:
    return f"encoder-r{rows}"


def _data_fingerprint(run):
    """A fingerprint the run recorded (checkpoint meta or config), or None: none is invented here."""
    sidecar = run.run_dir / "checkpoints" / Path(run.checkpoint).with_suffix(".json").name
    meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    for key in ("data_fingerprint", "fingerprint"):
        if key in meta:
            return meta[key]
    return None


def export_run(run_dir, out_dir=None, which: str = "best", shapes=DEFAULT_SHAPES) -> dict:
    """Export a run; returns the manifest. out_dir defaults to RUN/export."""
    import mindspore as ms
    from mindgr.train.trainer import load_run
    run = load_run(run_dir, which)
    out = Path(out_dir) if out_dir else run.run_dir / "export"
    out.mkdir(parents=True, exist_ok=True)
    max_len = run.cfg.data.max_len
    table = run.model.item_table().astype(np.float32)
    encoders = {}
    for rows in sorted({int(r) for r in shapes}):
        # Example inputs fix the graph's shapes; their values do not matter.
        a = pack([], rows, rows * max_len, max_len)
        name = _encoder_name(rows)
        (out / f"{name}.mindir").unlink(missing_ok=True)  # MindSpore writes it read-only: re-export replaces it
        ms.export(run.model.encode_last, ms.Tensor(a["ids"]), ms.Tensor(a["positions"]), ms.Tensor(a["offsets"]),
                  ms.Tensor(a["timestamps"]), ms.Tensor(a["request_times"]), file_name=str(out / name),
                  file_format="MINDIR")
        encoders[str(rows)] = {"file": name + ".mindir", "rows": rows, "tokens": rows * max_len}
    np.save(out / "item_table.npy", table)
    np.save(out / "item_raw_ids.npy", np.asarray(run.data.store.item_raw_ids, np.int64))
    manifest = {
        "format_version": FORMAT_VERSION,
        "run": str(run.run_dir), "checkpoint": run.checkpoint, "step": run.step,
        "model": run.cfg.to_dict()["model"], "config": run.cfg.to_dict(),
        "data": {"name": run.data.store.name, "num_items": run.data.num_items,
                 "time_unit": run.data.store.time_unit, "fingerprint": _data_fingerprint(run)},
        "max_len": max_len,
        "inputs": {"ids": ["int32", "T"], "positions": ["int32", "T"], "offsets": ["int32", "rows + 1"],
                   "timestamps": ["int64 seconds", "T"], "request_times": ["int64 seconds", "rows"]},
        "output": ["float32", "rows", int(table.shape[1])],
        "encoders": encoders,
        "item_table": {"file": "item_table.npy", "dtype": "float32", "shape": list(table.shape)},
        "item_ids": {"file": "item_raw_ids.npy", "dtype": "int64", "shape": [len(run.data.store.item_raw_ids)],
                     "meaning": "entry i is the raw id of internal item i; entry 0 (padding) is -1"},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


class ExportedEncoder:
    """The exported encoders behind one call: picks the graph by the batch's row count (len(offsets) - 1)."""

    def __init__(self, graphs: dict, request_times: bool = True):
        self.graphs = graphs  # rows -> nn.GraphCell
        self.request_times = request_times  # False: a format-1 export, whose graphs take no request times

    def __call__(self, ids, positions, offsets, timestamps, request_times=None):
        rows = offsets.shape[0] - 1
        if rows not in self.graphs:
            raise ValueError(f"no exported encoder for {rows} rows (have {sorted(self.graphs)})")
        if not self.request_times:
            return self.graphs[rows](ids, positions, offsets, timestamps)
        if request_times is None:
            raise ValueError("this export's encoders take request_times [rows] int64 (pack() makes them)")
        return self.graphs[rows](ids, positions, offsets, timestamps, request_times)


def load_export(export_dir):
    """(manifest, ExportedEncoder, item table, item raw ids) from an export directory."""
    import mindspore as ms
    from mindspore import nn
    d = Path(export_dir)
    path = d / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{d}: no {MANIFEST} (not an export directory)")
    manifest = json.loads(path.read_text())
    graphs = {int(rows): nn.GraphCell(ms.load(str(d / e["file"]))) for rows, e in manifest["encoders"].items()}
    encoder = ExportedEncoder(graphs, "request_times" in manifest.get("inputs", {}))
    return (manifest, encoder, np.load(d / manifest["item_table"]["file"]),
            np.load(d / manifest["item_ids"]["file"]))
