"""Which serving model serves a saved run or an export, and how each kind is exported and loaded back.

A run's task (mindgr.train.tasks.resolve_run) names its serving model (Task.serving); an export's manifest
records it ("kind"). SERVING_MODELS maps that name to a ServingKind: `export` writes the run's export
(mindgr.serve.export) and `load` builds the serving model from an export directory alone, reading
nothing of the run, its data or the training code. `mindgr serve --run` and `mindgr recommend --run`
export first (into the run's serving cache, mindgr.serve.cache) and then load that export, so both ways
in share one loading path; what an export cannot serve (`needs_run`: the GR baselines, whose graphs are not
exported) is served from the loaded run (`load_run`). A task with a new kind of answer adds one entry here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from mindgr.serve.options import ServerOptions


@dataclass(frozen=True)
class ServingKind:
    name: str
    export: Callable    # (run_dir, out_dir, which, shapes, beam, manifest_extra) -> manifest
    load: Callable      # (export_dir, manifest, ServerOptions) -> (serving model, info, banner text with {url})
    shapes: tuple       # the default batch shapes of an export made for serving
    beam: Optional[int] = None   # the default beam width of an export made for serving (generative)
    check: Callable = lambda options: None   # a one-line ValueError for options an export cannot serve
    # (run_dir, options) -> True when the export cannot serve this run with these options, and
    # load_run(run_dir, options) -> (model, info, banner) serves the loaded run itself instead
    needs_run: Callable = lambda run_dir, options: False
    load_run: Optional[Callable] = None


def _check_generative(options: ServerOptions):
    if options.decode != "engine":
        raise ValueError(f"--decode {options.decode}: an export holds the graphs of the decoding engine's fast "
                         "path only; serve the run directory (--run) for the baselines, or use --decode engine")


def _generative_needs_run(run_dir, options: ServerOptions) -> bool:
    """The baselines (per_beam, replay, naive) need the model itself: the export holds the graphs of the
    engine's fast path only (HSTU's KV cache, a linear decoder's OneLA; mindgr.serve.export)."""
    return options.decode != "engine"


def _load_generative_run(run_dir, options: ServerOptions):
    from mindgr.serve.generative import load_bundle
    bundle = load_bundle(run_dir, options.checkpoint, threads=options.threads)
    return build_generative(bundle, options, beam=options.beam or 16)


def _export_retrieval(run_dir, out_dir, which, shapes, beam, manifest_extra=None) -> dict:
    from mindgr.serve.export import export_run
    return export_run(run_dir, out_dir, which, shapes, manifest_extra)


def _load_retrieval(export_dir, manifest, options: ServerOptions):
    """Encode the history with the exported graphs, top-k over the item table (mindgr.serve.retrieval)."""
    from mindgr.serve.requests import DEFAULT_MAX_HISTORY
    from mindgr.serve.retrieval import Recommender
    index_options = {"nprobe": options.nprobe} if options.index == "faiss-ivf" else {}
    rec = Recommender.from_export(export_dir, manifest, options.shapes, options.index,
                                  options.max_history or DEFAULT_MAX_HISTORY, **index_options)
    info = {"export": str(export_dir), "run": manifest.get("run"), "checkpoint": manifest.get("checkpoint"),
            "step": manifest.get("step"), "arch": (manifest.get("model") or {}).get("arch"),
            "items": rec.catalogue.num_items, "max_len": rec.max_len, "batch_shapes": rec.shapes,
            "index": rec.index.name}
    return rec, info, (f"{info['run']} ({info['checkpoint']}) from {export_dir} on {{url}}, batch shapes "
                       f"{rec.shapes}, index {rec.index.name}")


def _export_generative(run_dir, out_dir, which, shapes, beam, manifest_extra=None) -> dict:
    from mindgr.serve.export import export_generative_run
    return export_generative_run(run_dir, out_dir, which, beam, shapes, manifest_extra)


def _load_generative(export_dir, manifest, options: ServerOptions):
    """Trie-constrained beam search with the decoding engine on the exported graphs (mindgr.serve.generative)."""
    from mindgr.serve.generative import bundle_from_export
    _check_generative(options)
    bundle = bundle_from_export(export_dir, manifest, options.shapes, options.beam)
    rec, info, text = build_generative(bundle, options, beam=int(manifest["beam"]))
    return rec, {"export": str(export_dir), **info}, text.replace("{url}", f"from {export_dir} on {{url}}")


def build_generative(bundle, options: ServerOptions, beam: int):
    """The generative serving model of a bundle (an export's, or a random-weight one)."""
    from mindgr.serve import generative as gr
    from mindgr.serve.requests import DEFAULT_MAX_HISTORY
    shapes = options.shapes or sorted(getattr(bundle.decoder, "graphs", None) or gr.DEFAULT_GR_SHAPES)
    rec = gr.GenerativeRecommender(bundle, beam, options.decode, shapes, options.overlap,
                                   options.max_history or DEFAULT_MAX_HISTORY)
    info = {**gr.bundle_info(bundle), **rec.describe()}
    return rec, info, (f"generative model ({info['checkpoint']}) on {{url}}, decode {options.decode}, beam {beam}, "
                       f"overlap {'on' if options.overlap else 'off'}, user-batch shapes {rec.shapes}")


SERVING_MODELS = {
    "retrieval": ServingKind("retrieval", _export_retrieval, _load_retrieval, shapes=(1, 4, 16, 64)),
    "generative": ServingKind("generative", _export_generative, _load_generative, shapes=(1, 2, 4), beam=16,
                              check=_check_generative, needs_run=_generative_needs_run,
                              load_run=_load_generative_run),
}


def serving_kind(run_dir) -> str:
    """The serving model of a saved run ("retrieval", "generative"), from its task."""
    from mindgr.train.tasks import resolve_run
    task = resolve_run(run_dir)
    if not task.serving:      # a task that serves nothing (a reward model): one line
        raise ValueError(f"{run_dir}: a {task.name} run has no serving model (it is scored by other runs, "
                         "not served)")
    return task.serving


def load_export_model(export_dir, options: ServerOptions):
    """(serving model, info for /health, banner text with {url}) from an export directory: its manifest
    checked (every file's sha256), then the kind it records loads it."""
    from mindgr.serve.exported import ExportError, export_kind, read_manifest
    manifest = read_manifest(Path(export_dir))
    kind = export_kind(manifest)
    if kind not in SERVING_MODELS:
        raise ExportError(f"export {export_dir}: unknown kind {kind!r} (this version serves "
                          f"{', '.join(SERVING_MODELS)}); export the run again")
    return SERVING_MODELS[kind].load(Path(export_dir), manifest, options)


def setup_process(threads: Optional[int] = None, backend: Optional[str] = None):
    """Graph mode on this process's device, at most `threads` compute threads, and (given) an ops backend:
    what a served model needs before its graphs load (no run config is read)."""
    from mindgr.runtime import limit_threads, select_device
    select_device()
    if threads:
        limit_threads(threads)
    if backend:
        from mindgr.ops import set_backend
        set_backend(backend)


def _export_threads(export_dir) -> Optional[int]:
    """The parallel.threads of the run an export was made from (its manifest's config), if recorded."""
    from mindgr.serve.exported import ExportError, read_manifest
    try:
        cfg = read_manifest(Path(export_dir), verify=False).get("config") or {}
    except ExportError:
        return None                       # refused with its reason when the model loads
    return (cfg.get("parallel") or {}).get("threads") or None


def load_served(options: ServerOptions, run_dir=None, export_dir=None):
    """The serving model of an export directory, or of a run (exported first into its serving cache, then
    loaded from there; a run its export cannot serve, e.g. a baseline decode, is loaded itself):
    (model, info for /health, banner text with {url})."""
    if (run_dir is None) == (export_dir is None):
        raise ValueError("give exactly one of a run directory and an export directory")
    if run_dir is not None:
        if options.threads:
            setup_process(options.threads)
        from mindgr.serve.cache import cached_export
        kind = SERVING_MODELS[serving_kind(run_dir)]
        if kind.needs_run(run_dir, options):   # what an export cannot serve: the loaded run itself
            return kind.load_run(run_dir, options)
        kind.check(options)                   # before the export, not after it
        export_dir = cached_export(run_dir, kind, options)
    setup_process(options.threads or _export_threads(export_dir))
    return load_export_model(export_dir, options)


def load_recommender(options: ServerOptions, run_dir=None, export_dir=None):
    """The serving model alone (`mindgr recommend`)."""
    return load_served(options, run_dir, export_dir)[0]
