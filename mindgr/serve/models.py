"""Which serving model serves a saved run. The run's task (mindgr.train.tasks.resolve_run) loads it
(Task.load_run) and names its serving model (Task.serving); SERVING_MODELS maps that name to the serving
model built on the loaded run. A task with a new kind of answer adds one entry here (and one in
mindgr.serve.export's EXPORTERS when it can be exported).
"""
from __future__ import annotations

from typing import Optional


def serving_kind(run_dir) -> str:
    """The serving model of a saved run ("retrieval", "generative"), from its task."""
    from mindgr.train.tasks import resolve_run
    return _served(run_dir, resolve_run(run_dir))


def _served(run_dir, task) -> str:
    """The task's serving model, or a one-line refusal for a task that serves nothing (a reward model)."""
    if not task.serving:
        raise ValueError(f"{run_dir}: a {task.name} run has no serving model (it is scored by other runs, "
                         "not served)")
    return task.serving


def load_run(run_dir, which: str = "best", threads: Optional[int] = None):
    """(serving kind, the run loaded by its task)."""
    from mindgr.train.tasks import resolve_run
    task = resolve_run(run_dir)
    return _served(run_dir, task), task.load_run(run_dir, which, threads=threads)


def _retrieval(loaded, shapes=None, max_history=None, index: str = "exact", nprobe: int = 8, **_):
    """Encode the history at fixed batch shapes, top-k over the item table (mindgr.serve.recommend)."""
    from mindgr.serve.recommend import DEFAULT_MAX_HISTORY, DEFAULT_SHAPES, Recommender
    options = {"nprobe": nprobe} if index == "faiss-ivf" else {}
    rec = Recommender.from_run(loaded, shapes or DEFAULT_SHAPES, index, max_history or DEFAULT_MAX_HISTORY, **options)
    info = {"run": str(loaded.run_dir), "checkpoint": loaded.checkpoint, "step": loaded.step,
            "arch": loaded.cfg.model.arch, "items": rec.catalogue.num_items, "max_len": rec.max_len,
            "batch_shapes": rec.shapes, "index": rec.index.name}
    return rec, info, (f"{loaded.run_dir} ({loaded.checkpoint}) on {{url}}, batch shapes {rec.shapes}, index "
                       f"{rec.index.name}")


def _generative(bundle, shapes=None, max_history=None, beam: int = 16, decode: str = "engine",
                overlap: bool = False, **_):
    """Trie-constrained beam search with the decoding engine (mindgr.serve.generative)."""
    from mindgr.serve import generative as gr
    from mindgr.serve.recommend import DEFAULT_MAX_HISTORY
    rec = gr.GenerativeRecommender(bundle, beam, decode, shapes or gr.DEFAULT_GR_SHAPES, overlap,
                                   max_history or DEFAULT_MAX_HISTORY)
    info = {**gr.bundle_info(bundle), **rec.describe()}
    return rec, info, (f"generative model ({info['checkpoint']}) on {{url}}, decode {decode}, beam {beam}, overlap "
                       f"{'on' if overlap else 'off'}, user-batch shapes {rec.shapes}")


# serving kind -> build(loaded run, **server options) -> (recommender, info, banner text with {url})
SERVING_MODELS = {"retrieval": _retrieval, "generative": _generative}


def build_served(kind: str, loaded, **options):
    return SERVING_MODELS[kind](loaded, **options)


def load_recommender(run_dir, which: str = "best", threads: Optional[int] = None, **options):
    """The recommender of a saved run (its serving model on the run its task loaded); options per kind are
    ignored by the other kinds, except `shapes`, which may be {kind: shapes}."""
    kind, loaded = load_run(run_dir, which, threads)
    shapes = options.pop("shapes", None)
    if isinstance(shapes, dict):
        shapes = shapes.get(kind)
    return build_served(kind, loaded, shapes=shapes, **options)[0]
