"""An export directory read back (what mindgr.serve.export writes): the manifest checked, the MindIR graphs
loaded with mindspore.load + nn.GraphCell, the arrays with numpy.

Every file the manifest lists is checked against its sha256 first: a changed, damaged or missing one is
refused in one line naming it (exports written before the checksums existed load unchecked); so is a
C++ kernel library the graphs call that is gone (built by another version of the code). Reading an export
imports nothing of mindgr.train: a server from an export needs neither the run, nor its training data, nor
the training cells (`mindgr serve --export`, `mindgr recommend --export`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mindgr.paths import file_sha256

MANIFEST = "manifest.json"


class ExportError(ValueError):
    """An export directory that cannot be used (one-line message naming the file)."""


def verify_export(d: Path, manifest: dict):
    """ExportError naming the first file that is missing or differs from the manifest's sha256."""
    for name, digest in (manifest.get("sha256") or {}).items():
        path = d / name
        if Path(name).name != name or not path.is_file():
            raise ExportError(f"export {d}: {name} is missing (the manifest lists it); export the run again")
        if file_sha256(path) != digest:
            raise ExportError(f"export {d}: {name} does not match its sha256 in {MANIFEST} (modified or "
                              "corrupted); export the run again")


def check_kernels(d: Path, manifest: dict):
    """ExportError when the graphs call a C++ kernel library that is no longer there (the kernels were
    rebuilt by another version of the code and the old library removed); it is rebuilt when it is the one
    this code builds."""
    library = (manifest.get("ops") or {}).get("kernel_library")
    if not library or Path(library).is_file():
        return
    from mindgr.ops import cpu
    from mindgr.ops.cpu import build
    if build.library_path() == library:           # this code's kernels: build them (first use on this host)
        try:
            cpu.library_path()
        except build.BuildError as e:
            raise ExportError(f"export {d}: its C++ kernels cannot be built here: {str(e).splitlines()[0]}") from None
        if Path(library).is_file():
            return
    raise ExportError(f"export {d}: its graphs call the C++ kernel library {Path(library).name}, which is gone "
                      "(built by another version of the code); export the run again")


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


def read_manifest(d: Path, verify: bool = True) -> dict:
    """The manifest of export directory d; with verify, every file it lists checked against its sha256."""
    d = Path(d)
    if not d.is_dir():
        raise ExportError(f"export {d}: no such directory (write one with mindgr export --run RUN --out DIR)")
    path = d / MANIFEST
    if not path.is_file():
        raise ExportError(f"export {d}: no {MANIFEST} (not an export directory; write one with mindgr export)")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise ExportError(f"export {d}: {MANIFEST} is not valid JSON (truncated or corrupted); export the run "
                          "again") from None
    if not isinstance(manifest, dict):
        raise ExportError(f"export {d}: {MANIFEST} is not a JSON object; export the run again")
    if verify:
        verify_export(d, manifest)
    return manifest


def export_kind(manifest: dict) -> str:
    """"retrieval" or "generative" (exports written before the kind was recorded are retrieval exports)."""
    return manifest.get("kind", "retrieval")


def _chosen(d: Path, exported, wanted, what: str, flag: str) -> list:
    """The exported shapes to load: all of them, or `wanted`, each of which must have been exported."""
    exported = sorted(int(x) for x in exported)
    if wanted is None:
        return exported
    missing = sorted({int(x) for x in wanted} - set(exported))
    if missing:
        raise ExportError(f"export {d}: no graphs for {what} {missing} (it has {exported}); serve with "
                          f"{flag} {','.join(map(str, exported))} or export again with {flag}")
    return sorted({int(x) for x in wanted})


def _graph(d: Path, name: str):
    import mindspore as ms
    from mindspore import nn
    try:
        return nn.GraphCell(ms.load(str(d / name)))
    except (RuntimeError, ValueError, OSError) as e:
        raise ExportError(f"export {d}: {name} cannot be loaded ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); "
                          "export the run again") from None


def load_export(export_dir, manifest: dict | None = None, rows=None):
    """(manifest, ExportedEncoder, item table, item raw ids) from an export directory; rows: the batch
    shapes to load (default all exported)."""
    d = Path(export_dir)
    manifest = read_manifest(d) if manifest is None else manifest
    if export_kind(manifest) != "retrieval":
        raise ExportError(f"export {d}: a {export_kind(manifest)} export, not a retrieval one (load_generative_export)")
    check_kernels(d, manifest)
    chosen = _chosen(d, manifest["encoders"], rows, "batch shapes", "--batch-shapes")
    graphs = {r: _graph(d, manifest["encoders"][str(r)]["file"]) for r in chosen}
    encoder = ExportedEncoder(graphs, "request_times" in manifest.get("inputs", {}))
    return (manifest, encoder, np.load(d / manifest["item_table"]["file"]),
            np.load(d / manifest["item_ids"]["file"]))


def load_generative_export(export_dir, manifest: dict | None = None, users=None):
    """(manifest, {users: (prefill GraphCell, step GraphCell)}, codes, trie arrays dict, raw ids); users: the
    user-batch shapes to load (default all exported)."""
    d = Path(export_dir)
    manifest = read_manifest(d) if manifest is None else manifest
    if export_kind(manifest) != "generative":
        raise ExportError(f"export {d}: not a generative export (use load_export)")
    check_kernels(d, manifest)
    chosen = _chosen(d, manifest["graphs"], users, "user-batch shapes", "--batch-shapes")
    graphs = {u: (_graph(d, manifest["graphs"][str(u)]["prefill"]["file"]),
                  _graph(d, manifest["graphs"][str(u)]["step"]["file"])) for u in chosen}
    trie = dict(np.load(d / manifest["trie"]["file"]))
    return manifest, graphs, np.load(d / manifest["codes"]["file"]), trie, np.load(d / manifest["item_ids"]["file"])
