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
  manifest.json           model config, data fingerprint (when the run records one), shapes, dtypes, files,
                          and `sha256`: the checksum of every other file of the export

Every file is written atomically (mindgr.paths.atomic_write), the manifest last, with the sha256 of every
other file. Both kinds of manifest also record the ops backend the graphs were traced with and, for the C++
kernels, the kernel library their custom ops call (`ops`). mindgr.serve.exported reads an export back
(load_export, load_generative_export; also importable from here).

Generative runs (export_generative / export_generative_run; load_generative_export): per user-batch shape U
  prefill-u{U}.mindir      the GR decoder's PrefillCell (mindgr.models.kv_cache: prompt batch -> level-0
                           logits, prompt K, V); a linear-attention decoder (model.backbone linear): OneLA's
                           stacked LinearPrefillCell (mindgr.models.linear_decode: -> level-0 logits, the
                           prompt states S_p [blocks, U, H, dqk, dv])
  step-u{U}-b{beam}.mindir its DecodeStepCell (one token per beam -> logits, updated record K, V; the
                           one-hot record update and the ancestry gather are in the graph); linear: OneLA's
                           stacked RecordStepCell (S_p, the per-beam records, the ancestry index, the decay
                           weights -> logits, updated records)
  codes.npy, trie.npz      the code table [V+1, Lt] and the trie's keys / masks per level
  item_raw_ids.npy, manifest.json (kind "generative": decoder config with its backbone (and, linear, the
                           per-head decays the host turns into decay weights), beam, prompt tokens, every
                           graph's input shapes and dtypes, the run's data fingerprint)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mindgr.paths import atomic_write, file_sha256
from mindgr.serve.exported import (MANIFEST, ExportedEncoder, ExportError, load_export,  # noqa: F401 (read side)
                                   load_generative_export, read_manifest, verify_export)
from mindgr.serve.retrieval import DEFAULT_SHAPES, pack

FORMAT_VERSION = 2   # 2: the encoders take request_times


def _save_npy(path: Path, array):
    atomic_write(path, lambda tmp: np.save(tmp, array), tmp_suffix=".tmp.npy")


def _save_mindir(out: Path, name: str, net, *inputs):
    """ms.export of `net` to OUT/NAME.mindir, atomically (MindSpore appends the .mindir suffix itself)."""
    import mindspore as ms
    path = out / f"{name}.mindir"
    path.unlink(missing_ok=True)   # MindSpore writes MindIR read-only: re-export replaces it
    atomic_write(path, lambda tmp: ms.export(net, *inputs, file_name=str(tmp)[:-len(".mindir")],
                                             file_format="MINDIR"), tmp_suffix=".tmp.mindir")


def _write_manifest(out: Path, manifest: dict, files) -> dict:
    """The manifest, with the sha256 of every file in `files`, written last (atomically)."""
    manifest["sha256"] = {name: file_sha256(out / name) for name in sorted(set(files))}
    atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


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


def ops_record() -> dict:
    """The ops backend in force (the exported graphs call its ops) and, for the C++ kernels, their library."""
    from mindgr.ops.backend import get_backend
    backend = get_backend()
    record = {"backend": backend}
    if backend == "cpu":
        from mindgr.ops.cpu import library_path
        record["kernel_library"] = library_path()
    return record


def export_run(run_dir, out_dir=None, which: str = "best", shapes=DEFAULT_SHAPES, manifest_extra=None) -> dict:
    """Export a run; returns the manifest. out_dir defaults to RUN/export; manifest_extra: more fields
    (the serving cache's key)."""
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
        _save_mindir(out, name, run.model.encode_last, ms.Tensor(a["ids"]), ms.Tensor(a["positions"]),
                     ms.Tensor(a["offsets"]), ms.Tensor(a["timestamps"]), ms.Tensor(a["request_times"]))
        encoders[str(rows)] = {"file": name + ".mindir", "rows": rows, "tokens": rows * max_len}
    _save_npy(out / "item_table.npy", table)
    _save_npy(out / "item_raw_ids.npy", np.asarray(run.data.store.item_raw_ids, np.int64))
    manifest = {
        "format_version": FORMAT_VERSION, "kind": "retrieval",
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
        "ops": ops_record(),
        **(manifest_extra or {}),
    }
    files = [e["file"] for e in encoders.values()] + ["item_table.npy", "item_raw_ids.npy"]
    return _write_manifest(out, manifest, files)


# ---- generative runs: the decoding engine's graphs ------------------------------------------------------

GR_FORMAT_VERSION = 1


class _Recorder:
    """A runner that runs each model call and keeps the host arrays it was given (the graphs' inputs)."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn, *args):
        self.calls.append(args)
        return fn(*args)


def export_generative(bundle, out_dir, beam: int = 16, shapes=(1, 2, 4), manifest_extra=None) -> dict:
    """MindIR of the prefill and decode-step graphs of each user-batch shape (beam fixed), the code table,
    the trie arrays, the raw ids and a manifest. Returns the manifest."""
    import numpy as np
    from mindgr.generate.engine import DecodingEngine
    from mindgr.serve.generative import GenerativeRecommender
    backbone = getattr(bundle.decoder, "backbone", "hstu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = GenerativeRecommender(bundle, beam=beam, decode="engine", shapes=shapes)
    dec, p_cap = bundle.decoder, rec.p_cap
    graphs = {}
    for users in rec.shapes:
        if backbone == "linear":
            graphs[str(users)] = _export_linear(out, dec, rec.codes, users, beam, p_cap)
            continue
        eng: DecodingEngine = rec.engines[0][users]
        # the decoder's KV-cache state (mindgr.models.kv_cache)
        pre_name, pre_args, step_name, step_args = _save_state_graphs(out, eng.state, dec, eng.codes, users, beam,
                                                                      p_cap)
        graphs[str(users)] = {
            "prefill": {"file": pre_name + ".mindir",
                        "inputs": [[str(a.dtype), list(a.shape)] for a in pre_args],
                        "outputs": ["logits float32 [U, sum K]", "prompt K float32 [layers, U, P, H, dqk]",
                                    "prompt V float32 [layers, U, P, H, dv]"]},
            "step": {"file": step_name + ".mindir",
                     "inputs": [[str(a.dtype), list(a.shape)] for a in step_args],
                     "input_names": ["slots", "prompt K", "prompt V", "prompt bias index", "prompt mask",
                                     "record K", "record V", "record one-hot", "ancestry index",
                                     "record bias index", "record mask"],
                     "outputs": ["logits float32 [U * beam, sum K]", "record K", "record V"]}}
    codes = np.asarray(bundle.codes, np.int32)
    _save_npy(out / "codes.npy", codes)
    _save_npy(out / "item_raw_ids.npy", np.asarray(bundle.raw_ids, np.int64))
    trie = bundle.trie
    atomic_write(out / "trie.npz", lambda tmp: np.savez(tmp, **{f"keys{l}": trie.keys[l] for l in range(trie.num_levels)},
                                                        **{f"masks{l}": trie.masks[l] for l in range(trie.num_levels)}),
                 tmp_suffix=".tmp.npz")
    cfg = bundle.cfg.to_dict() if hasattr(bundle.cfg, "to_dict") else None
    spec = {"level_sizes": [int(s) for s in bundle.level_sizes], "dim": dec.dim, "blocks": dec.num_blocks,
            "heads": dec.num_heads, "dqk": dec.dqk, "dv": dec.dv, "max_len": dec.max_len,
            "token_merger": dec.token_merger, "group": dec.group, "pad_id": dec.pad_id,
            "trie_softmax": dec.trie_softmax, "backbone": backbone,
            "level_offsets": [int(x) for x in dec.level_offsets]}
    if backbone == "linear":     # float32 values, exact through JSON: the host's decay weights come from them
        from mindgr.models.linear_decode import decays_of
        spec["decays"] = [[float(g) for g in row] for row in decays_of(dec)]
    manifest = {
        "format_version": GR_FORMAT_VERSION, "kind": "generative",
        "run": str(bundle.run_dir) if bundle.run_dir is not None else None, "checkpoint": str(bundle.checkpoint),
        "step": getattr(bundle, "step", None), "config": cfg,
        "decoder": spec,
        "beam": beam, "prompt_tokens": p_cap, "max_history": int(bundle.max_history),
        "decode_steps": int(dec.num_levels - 1),
        "graphs": graphs,
        "codes": {"file": "codes.npy", "dtype": "int32", "shape": list(codes.shape),
                  "meaning": "row i = the semantic-ID tuple of item index i; row 0 = padding"},
        "trie": {"file": "trie.npz", "arrays": "keys{l} int64 sorted prefix keys, masks{l} bool [prefixes, K_l] "
                 "(mindgr.ids.trie.PrefixTrie)", "levels": trie.num_levels},
        "item_ids": {"file": "item_raw_ids.npy", "dtype": "int64", "shape": [len(bundle.raw_ids)],
                     "meaning": "entry i is the raw id of item index i (entry 0 unused)"},
        "data": {"fingerprint": None},
        "ops": ops_record(),
        **(manifest_extra or {}),
    }
    extra = getattr(bundle, "extra", None) or {}      # a LoadedGenerativeRun has none
    if "random" in extra:
        manifest["random_model"] = extra["random"]
    files = [g[p]["file"] for g in graphs.values() for p in ("prefill", "step")] + \
        ["codes.npy", "item_raw_ids.npy", "trie.npz"]
    return _write_manifest(out, manifest, files)


def _save_state_graphs(out: Path, be, dec, codes, users: int, beam: int, p_cap: int):
    """A decoding state's prefill and step cells as MindIR, traced with the inputs the state really builds for
    a prefill and a level-1 step (their values do not matter) -> (prefill name, its inputs, step name, its
    inputs)."""
    from mindspore import Tensor
    be.run = calls = _Recorder()
    be.prefill(dec.prompts([np.ones(1, np.int64)] * users, codes, p_cap))
    pre_args = [Tensor(a) for a in calls.calls[0]]
    be.step(1, np.zeros((users, beam), np.int64), [np.zeros((users, beam), np.int64)])
    step_args = be.last_step_inputs
    pre_name, step_name = f"prefill-u{users}", f"step-u{users}-b{beam}"
    _save_mindir(out, pre_name, be.prefill_net, *pre_args)
    _save_mindir(out, step_name, be.step_net, *step_args)
    return pre_name, pre_args, step_name, step_args


def _export_linear(out: Path, dec, codes, users: int, beam: int, p_cap: int) -> dict:
    """OneLA's stacked prefill and step cells (mindgr.models.linear_decode) of one user-batch shape as MindIR,
    traced with the inputs the state really builds; returns their manifest entry."""
    from mindgr.models.linear_decode import RecordState
    be = RecordState(dec, users, beam, p_cap, stacked=True)
    pre_name, pre_args, step_name, step_args = _save_state_graphs(out, be, dec, codes, users, beam, p_cap)
    return {"prefill": {"file": pre_name + ".mindir", "inputs": [[str(a.dtype), list(a.shape)] for a in pre_args],
                        "outputs": ["logits float32 [U, sum K]", "prompt states float32 [blocks, U, H, dqk, dv]"]},
            "step": {"file": step_name + ".mindir", "inputs": [[str(a.dtype), list(a.shape)] for a in step_args],
                     "input_names": ["slots", "prompt states", "record K", "record V", "record one-hot",
                                     "ancestry index", "prompt decay weights", "record decay weights"],
                     "outputs": ["logits float32 [U * beam, sum K]", "record K float32 [blocks, S, U, beam, H, dqk]",
                                 "record V float32 [blocks, S, U, beam, H, dv]"]}}


def export_generative_run(run_dir, out_dir=None, which: str = "best", beam: int = 16, shapes=(1, 2, 4),
                          manifest_extra=None) -> dict:
    """A trained GR run (mindgr.train.generative.load_generative_run) exported; out_dir defaults to RUN/export."""
    from mindgr.serve.generative import load_bundle
    bundle = load_bundle(run_dir, which)
    out = Path(out_dir) if out_dir else Path(bundle.run_dir) / "export"
    from mindgr.train.data import FINGERPRINT_FILE
    fingerprint = None
    fp = Path(bundle.run_dir) / FINGERPRINT_FILE      # what the run recorded of its data (none invented)
    if fp.is_file():
        fingerprint = json.loads(fp.read_text())
    return export_generative(bundle, out, beam, shapes, {"data": {"fingerprint": fingerprint}, **(manifest_extra or {})})
