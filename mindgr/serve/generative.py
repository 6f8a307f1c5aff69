"""Serving a generative (GR) model: raw item ids -> prompt -> the decoding engine's beam search -> top-k items.

The model comes as a LoadedGenerativeRun-shaped bundle (mindgr.train.generative.load_generative_run, or
`random_bundle` below: a random-weight decoder of a given shape, for tests and the load benchmark when
no trained GR run exists). GenerativeRecommender has the HSTU Recommender's serving interface (parse,
shape_for, max_rows, warm_up, recommend, to_response), so the same DynamicBatcher and HTTP app serve it.

- Requests are validated as the HSTU path validates them (mindgr.serve.recommend.parse_query: unknown
  ids, empty or over-long history, bad k, timestamps if given) plus k <= the beam width (a beam search
  returns at most `beam` items). The prompt is the history's last `max_history` items (the run's
  data.max_len), as in training.
- One DecodingEngine per (worker, user-batch shape), each compiled once at start (warm_up): the prefill
  graph and the one decode-step graph of that shape. `decode="engine"` is the engine's fast path (shared
  prompt K/V, per-beam records, partial top-k, reused trie masks), `decode="naive"` the baseline (every
  beam's whole sequence recomputed each step, full sort, masks rebuilt per step). Same lists.
- The search keeps `beam` complete items at the last level; exclude_history then drops history items
  and the first k remain. When the beam holds fewer than k such items the answer is refused (HTTP 422,
  `check_complete`, the HSTU server's rule): a list never silently holds fewer than k items.
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

from mindgr.serve.recommend import DEFAULT_MAX_HISTORY, Catalogue, RequestError, ServingModel, parse_query

DECODES = ("engine", "per_beam", "replay", "naive")
# the engine's options of each: its fast path (the decoder's shared layout: HSTU's KV cache, linear attention's
# OneLA), the cached baselines (per-beam K/V or states; replay, linear only) and the naive recompute search
DECODE_OPTIONS = {"engine": {}, "per_beam": dict(cache="per_beam"), "replay": dict(cache="replay"),
                  "naive": dict(cache="recompute", selection="full_sort", masks="rebuild")}
DEFAULT_GR_SHAPES = (1, 2, 4)          # users per compiled batch (each user is `beam` decode rows)
BEAUTY_LEVELS = (256, 256, 256, 32)    # 3 residual k-means levels of 256 codes + a de-dup digit
RAW_ID_BASE = 1000                     # random bundles: raw id of item i is RAW_ID_BASE + i


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


def beauty_like_codes(rng, num_items: int, level_sizes=BEAUTY_LEVELS) -> np.ndarray:
    """Random unique code tuples [V+1, Lt] (row 0 = padding) with Beauty-like sharing: the first level
    from 64 of its codes, the de-dup digit mostly 0..3 (as a real residual k-means table clusters)."""
    sizes = [int(s) for s in level_sizes]
    first = min(64, sizes[0])
    seen, rows = set(), []
    while len(rows) < num_items:
        t = (int(rng.integers(first)),) + tuple(int(rng.integers(s)) for s in sizes[1:-1]) + \
            (int(rng.integers(min(4, sizes[-1]))),)
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return np.concatenate([np.zeros((1, len(sizes)), np.int32), np.asarray(rows, np.int32)])


def random_bundle(num_items: int = 12101, prompt_tokens: int = 200, dim: int = 128, blocks: int = 4,
                  heads: int = 2, level_sizes=BEAUTY_LEVELS, seed: int = 0, weight_scale: float = 0.1,
                  token_merger: str = "none", backbone: str = "hstu") -> GenerativeBundle:
    """A random-weight GR decoder of the given shape and a random code table: what serving needs of a run.
    prompt_tokens fixes max_history (prompt_tokens // tokens per item) and the decoder's max_len."""
    from mindspore import Tensor
    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.models.ntp import tokens_per_prompt_item
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in level_sizes]
    codes = beauty_like_codes(rng, num_items, sizes)
    per_item = tokens_per_prompt_item(len(sizes), token_merger)
    max_history = prompt_tokens // per_item
    if max_history < 1:
        raise ValueError(f"prompt of {prompt_tokens} tokens holds no item ({per_item} tokens each)")
    dec = GRDecoder(sizes, dim, blocks, heads, dim // heads, dim // heads,
                    max_len=max_history * per_item + len(sizes) - 1, token_merger=token_merger, seed=seed,
                    num_items=num_items, backbone=backbone)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * weight_scale).astype(np.float32)))
    dec.set_train(False)
    raw = np.concatenate([[-1], RAW_ID_BASE + np.arange(1, num_items + 1)]).astype(np.int64)
    spec = dict(items=num_items, prompt_tokens=prompt_tokens, dim=dim, blocks=blocks, heads=heads,
                level_sizes=sizes, seed=seed, token_merger=token_merger, backbone=backbone)
    return GenerativeBundle(cfg=None, run_dir=None, decoder=dec, codes=codes, level_sizes=sizes,
                            trie=PrefixTrie(codes, sizes), raw_ids=raw, max_history=max_history,
                            checkpoint="random weights", extra={"random": spec})


def parse_random_spec(text: str) -> dict:
    """`items=12101,prompt=200,dim=128,blocks=4,heads=2,seed=0,levels=256x256x256x32,backbone=linear` -> random_bundle's
    keyword arguments (any subset; the rest keep their defaults)."""
    names = {"items": "num_items", "prompt": "prompt_tokens", "dim": "dim", "blocks": "blocks",
             "heads": "heads", "seed": "seed"}
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key == "backbone":
            if value not in ("hstu", "linear"):
                raise ValueError(f"--random-gr: {part!r} (expected backbone=hstu or backbone=linear)")
            out["backbone"] = value
            continue
        if key == "levels":
            try:
                out["level_sizes"] = [int(x) for x in value.split("x")]
            except ValueError:
                raise ValueError(f"--random-gr: {part!r} (expected levels=K0xK1x...)") from None
            continue
        if key not in names or not value.lstrip("-").isdigit():
            raise ValueError(f"--random-gr: {part!r} (expected KEY=INT with KEY one of {', '.join(names)})")
        out[names[key]] = int(value)
    return out


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

    def search(self, histories, rows: int | None = None, worker: int | None = None):
        """Beam search of internal-id histories: (items [n, beam], scores [n, beam]), the raw engine lists."""
        rows = rows or self.shape_for(len(histories))
        slot = self._free.get() if worker is None else worker
        try:
            eng = self.engines[slot][rows]
            for key in eng.timings:
                eng.timings[key] = 0.0
            t0 = time.perf_counter()
            items, scores = eng.search([np.asarray(h, np.int64)[-self.prompt_items:] for h in histories], self.beam)
            split = dict(eng.timings, total=time.perf_counter() - t0)
        finally:
            if worker is None:
                self._free.put(slot)
        if self.metrics is not None:
            self.metrics.record_decode(split)
        return items, scores

    def recommend(self, queries, rows: int | None = None) -> list:
        """[(internal item ids [<=k], scores)] per query, best first."""
        items, scores = self.search([q.items for q in queries], rows)
        out = []
        for q, it, sc in zip(queries, items, scores):
            keep = it > 0
            if q.exclude_history:
                keep &= ~np.isin(it, q.items)
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
    run, extra = bundle.run_dir, getattr(bundle, "extra", None) or {}     # a LoadedGenerativeRun has no extra
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
