"""The generative serving model: raw item ids -> prompt -> the decoding engine's beam search -> top-k items.

The model comes as a GenerativeBundle: from an export (`bundle_from_export`: the exported prefill and
decode-step MindIR graphs behind ExportedDecoder, the code table, the trie; what `mindgr serve` runs), from
a trained run (`load_bundle`: what `mindgr export` writes out), or a random-weight decoder of a given shape
(mindgr.bench.fixtures.random_bundle: tests and the load benchmark). GenerativeRecommender has the
retrieval Recommender's serving interface (parse, shape_for, max_rows, warm_up, recommend, to_response),
so the same DynamicBatcher and HTTP app serve it.

- Requests are validated as the HSTU path validates them (mindgr.serve.requests.parse_query: unknown
  ids, empty or over-long history, bad k, timestamps if given) plus k <= the beam width (a beam search
  returns at most `beam` items). The prompt is the history's last `max_history` items (the run's
  data.max_len), as in training.
- One DecodingEngine per (worker, user-batch shape), each compiled once at start (warm_up): the prefill
  graph and the one decode-step graph of that shape. `decode="engine"` is the engine's fast path (shared
  prompt K/V, per-beam records, partial top-k, reused trie masks), `decode="naive"` the baseline (every
  beam's whole sequence recomputed each step, full sort, masks rebuilt per step). Same lists.
- The search keeps `beam` complete items at the last level; with exclude_history the search itself skips
  the history's items there (the beams' other children take their places), and the first k remain. When
  the beams hold fewer than k such items the answer is refused (HTTP 422, `check_complete`, the HSTU
  server's rule): a list never silently holds fewer than k items.
- Overlap (`overlap=True`): two batcher workers each run their own batch's search, and every MindSpore
  call of both goes through one model thread (ModelThread), so that one batch's host-side work (masks,
  selection, packing) runs while the other batch's graph computes. Off: one worker, model calls inline.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindgr.serve.requests import DEFAULT_MAX_HISTORY, Catalogue, RequestError, ServingModel, parse_query

DECODES = ("engine", "per_beam", "replay", "naive")
# the engine's options of each: its fast path (the decoder's shared layout: HSTU's KV cache, linear attention's
# OneLA), the cached baselines (per-beam K/V or states; replay, linear only) and the naive recompute search
DECODE_OPTIONS = {"engine": {}, "per_beam": dict(cache="per_beam"), "replay": dict(cache="replay"),
                  "naive": dict(cache="recompute", selection="full_sort", masks="rebuild")}
DEFAULT_GR_SHAPES = (1, 2, 4)          # users per compiled batch (each user is `beam` decode rows)


@dataclass
class GenerativeBundle:
    """The fields of mindgr.train.generative.LoadedGenerativeRun that serving uses."""
    cfg: Any
    run_dir: Any
    decoder: Any                 # mindgr.models.generative.GRDecoder, set_train(False)
    codes: np.ndarray            # int32 [V+1, Lt], row 0 = padding
    level_sizes: list
    trie: Any                    # mindgr.ids.trie.PrefixTrie
    raw_ids: np.ndarray          # [V+1], raw id of each item index (index 0 unused)
    max_history: int             # history items kept in a prompt
    checkpoint: str
    extra: dict = field(default_factory=dict)
    step: int | None = None


EXPORTED_BACKBONES = ("hstu", "linear")   # decoders whose fast-path graphs an export holds


class ExportedDecoder:
    """The generation contract (mindgr.models.generation) of an exported GR decoder: its code layout from
    the manifest, its decoding state running the exported prefill and decode-step graphs of each user-batch
    shape: the KV-cache state (mindgr.models.kv_cache) for an HSTU decoder, OneLA's record state
    (mindgr.models.linear_decode, its decays from the manifest) for a linear-attention one. It has no
    weights and no plain forward, so only the engine's fast path runs on it (not the per-beam, replay or
    naive baselines)."""

    def __init__(self, spec: dict, graphs: dict, prompt_tokens: int):
        self.level_sizes = [int(s) for s in spec["level_sizes"]]
        self.num_levels = len(self.level_sizes)
        self.level_offsets = np.asarray(spec["level_offsets"], np.int64)
        self.dim, self.num_blocks, self.num_heads = int(spec["dim"]), int(spec["blocks"]), int(spec["heads"])
        self.dqk, self.dv, self.max_len = int(spec["dqk"]), int(spec["dv"]), int(spec["max_len"])
        self.token_merger, self.group, self.pad_id = spec["token_merger"], int(spec["group"]), int(spec["pad_id"])
        self.trie_softmax = bool(spec.get("trie_softmax", False))
        self.backbone = spec.get("backbone", "hstu")
        self.decays = np.asarray(spec["decays"], np.float32) if self.backbone == "linear" else None
        self.graphs, self.prompt_tokens = graphs, int(prompt_tokens)    # users -> (prefill, step) GraphCells

    def prompts(self, histories, codes, max_prompt_tokens: int):
        from mindgr.models.generative import prompts_of
        return prompts_of(self, histories, codes, max_prompt_tokens)

    def decode_state(self, num_users: int, beam: int, max_prompt_tokens: int, runner=None, layout: str = "shared"):
        shared = ("shared", "onela") if self.backbone == "linear" else ("shared",)
        if layout not in shared or num_users not in self.graphs or max_prompt_tokens != self.prompt_tokens:
            raise ValueError(f"the export has the shared-cache graphs of {sorted(self.graphs)} users at "
                             f"{self.prompt_tokens} prompt tokens, not {layout} for {num_users} users at "
                             f"{max_prompt_tokens}")
        if self.backbone == "linear":
            from mindgr.models.linear_decode import RecordState
            return RecordState(self, num_users, beam, max_prompt_tokens, runner=runner, graphs=self.graphs[num_users])
        from mindgr.models.kv_cache import KVCacheState
        return KVCacheState(self, num_users, beam, max_prompt_tokens, runner=runner, graphs=self.graphs[num_users])


def bundle_from_export(export_dir, manifest: dict, shapes=None, beam: int | None = None) -> GenerativeBundle:
    """A GenerativeBundle of an export directory (manifest already read and checked): the graphs of
    `shapes` (default every exported user-batch shape), the code table, the trie. The decode-step graphs
    are built for one beam width: another `beam` is an ExportError naming the fix."""
    from mindgr.ids.trie import PrefixTrie
    from mindgr.serve.exported import ExportError, load_generative_export
    d = Path(export_dir)
    if beam is not None and int(beam) != int(manifest["beam"]):
        raise ExportError(f"export {d}: its decode-step graphs are for beam {manifest['beam']}, not {beam}; serve "
                          f"with --beam {manifest['beam']} or export again with --beam {beam}")
    backbone = manifest["decoder"].get("backbone", "hstu")
    if backbone not in EXPORTED_BACKBONES:
        raise ExportError(f"export {d}: a {backbone} decoder; this version serves exports of "
                          f"{', '.join(EXPORTED_BACKBONES)} decoders (export the run again)")
    if backbone == "linear" and "decays" not in manifest["decoder"]:
        raise ExportError(f"export {d}: a linear decoder without its decays in the manifest; "
                          "export the run again")
    manifest, graphs, codes, trie_arrays, raw_ids = load_generative_export(d, manifest, users=shapes)
    spec = manifest["decoder"]
    trie = PrefixTrie(codes, spec["level_sizes"])
    for level in range(trie.num_levels):   # the exported trie is the code table's (a mismatch: mixed files)
        if not np.array_equal(trie.keys[level], trie_arrays.get(f"keys{level}")):
            raise ExportError(f"export {d}: {manifest['trie']['file']} does not match "
                              f"{manifest['codes']['file']}; export the run again")
    decoder = ExportedDecoder(spec, graphs, manifest["prompt_tokens"])
    return GenerativeBundle(cfg=manifest.get("config"), run_dir=manifest.get("run"), decoder=decoder, codes=codes,
                            level_sizes=list(spec["level_sizes"]), trie=trie, raw_ids=raw_ids,
                            max_history=int(manifest["max_history"]), checkpoint=str(manifest.get("checkpoint")),
                            step=manifest.get("step"))


class ModelThread:
    """One thread that runs every MindSpore call handed to it, in arrival order (a device queue on CPU)."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="mindgr-model", daemon=True)
        self._thread.start()

    def __call__(self, fn, *args):
        fut: Future = Future()
        self._q.put((fn, args, fut))
        return fut.result()

    def _main(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args, fut = item
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed back to the caller's thread
                fut.set_exception(e)

    def close(self):
        self._q.put(None)
        self._thread.join(5)


class GenerativeRecommender(ServingModel):
    """A GR bundle served by beam search at a few fixed user-batch shapes."""

    def __init__(self, bundle, beam: int = 16, decode: str = "engine", shapes=DEFAULT_GR_SHAPES,
                 overlap: bool = False, max_history: int = DEFAULT_MAX_HISTORY):
        from mindgr.generate.engine import DecodingEngine
        from mindgr.models.ntp import tokens_per_prompt_item
        if decode not in DECODES:
            raise ValueError(f"decode: {decode!r} (expected one of {', '.join(DECODES)})")
        if decode != "engine" and isinstance(bundle.decoder, ExportedDecoder):
            raise ValueError(f"decode {decode}: an export holds the graphs of the engine's fast path only; the "
                             "baselines serve --random-gr models (use --decode engine)")
        if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
            raise ValueError(f"beam: {beam!r} (expected a positive integer)")
        self.bundle, self.beam, self.decode, self.overlap = bundle, beam, decode, bool(overlap)
        self.catalogue = Catalogue(bundle.raw_ids)
        self.max_history, self.prompt_items = max_history, int(bundle.max_history)
        dec = bundle.decoder
        self.p_cap = self.prompt_items * tokens_per_prompt_item(dec.num_levels, dec.token_merger)
        self.shapes = sorted({int(r) for r in shapes})
        if not self.shapes or self.shapes[0] < 1:
            raise ValueError(f"batch shapes: {shapes!r} (expected positive user counts)")
        self.workers = 2 if self.overlap else 1
        self.runner = ModelThread() if self.overlap else None
        options = DECODE_OPTIONS[decode]
        self.codes = np.asarray(bundle.codes)
        self.engines = [{rows: DecodingEngine(dec, bundle.trie, self.codes, beam, self.p_cap, rows,
                                              runner=self.runner, **options) for rows in self.shapes}
                        for _ in range(self.workers)]
        for engines in self.engines[1:]:      # the second worker calls the first one's compiled cells
            for rows, eng in engines.items():
                eng.share_graphs(self.engines[0][rows])
        self.metrics = None               # the server's ServerMetrics, for the decode time split
        self._free = queue.Queue()        # worker slots: each batch in flight holds one engine set
        for w in range(self.workers):
            self._free.put(w)

    @property
    def time_unit(self) -> str:
        return "s"

    def describe(self) -> dict:
        dec = self.bundle.decoder
        return {"model": "generative", "decode": self.decode, "beam": self.beam, "overlap": self.overlap,
                "items": self.catalogue.num_items, "level_sizes": list(self.bundle.level_sizes),
                "prompt_items": self.prompt_items, "prompt_tokens": self.p_cap, "dim": dec.dim,
                "blocks": dec.num_blocks, "batch_shapes": self.shapes, "workers": self.workers}

    def parse(self, history, timestamps=None, request_time=None, k=10, exclude_history=True):
        q = parse_query(self.catalogue, history, timestamps, request_time, k, exclude_history, self.max_history)
        if q.k > self.beam:
            raise RequestError(f"k: {q.k} is more than the beam width {self.beam} (a beam search returns at "
                               "most beam items)")
        return q

    def warm_up(self):
        """Compile each shape's graphs (prefill + decode step, or the naive recompute graph) once."""
        for engines in self.engines:           # the second set runs the first set's graphs: no new compile
            for rows, eng in engines.items():
                eng.search([np.ones(1, np.int64)], 1)

    def search(self, histories, rows: int | None = None, worker: int | None = None, exclude=None):
        """Beam search of internal-id histories: (items [n, beam], scores [n, beam]), the raw engine lists;
        exclude: per history, items the search skips (None: none)."""
        rows = rows or self.shape_for(len(histories))
        slot = self._free.get() if worker is None else worker
        try:
            eng = self.engines[slot][rows]
            for key in eng.timings:
                eng.timings[key] = 0.0
            t0 = time.perf_counter()
            items, scores = eng.search([np.asarray(h, np.int64)[-self.prompt_items:] for h in histories], self.beam,
                                       exclude=exclude)
            split = dict(eng.timings, total=time.perf_counter() - t0)
        finally:
            if worker is None:
                self._free.put(slot)
        if self.metrics is not None:
            self.metrics.record_decode(split)
        return items, scores

    def recommend(self, queries, rows: int | None = None) -> list:
        """[(internal item ids [<=k], scores)] per query, best first."""
        exclude = [q.items if q.exclude_history else None for q in queries]
        items, scores = self.search([q.items for q in queries], rows,
                                    exclude=exclude if any(e is not None for e in exclude) else None)
        out = []
        for q, it, sc in zip(queries, items, scores):
            keep = it > 0
            out.append((it[keep][:q.k], sc[keep][:q.k]))
        return out

    def short_reason(self, query, found: int) -> str:
        left = "left after excluding the history " if query.exclude_history else ""
        return (f"k: {query.k} asked, only {found} of the beam's {self.beam} items are {left}(serve with a "
                "wider --beam, or ask for fewer)")

    def close(self):
        if self.runner is not None:
            self.runner.close()


def bundle_info(bundle) -> dict:
    run, extra = bundle.run_dir, getattr(bundle, "extra", None) or {}
    return {"run": str(run) if run is not None else None, "checkpoint": str(bundle.checkpoint),
            **({"step": bundle.step} if getattr(bundle, "step", None) is not None else {}),
            **({"random_model": extra["random"]} if "random" in extra else {})}


def load_bundle(run_dir, which: str = "best", threads=None):
    """A trained GR run as a bundle (mindgr.train.generative.load_generative_run, when it exists)."""
    try:
        from mindgr.train.generative import load_generative_run
    except ImportError:
        raise ValueError(f"{Path(run_dir)}: serving a generative run needs mindgr.train.generative "
                         "(not in this build)") from None
    return load_generative_run(run_dir, which, threads=threads)
