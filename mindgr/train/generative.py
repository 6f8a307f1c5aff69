"""Generative retrieval through `mindgr train` / `mindgr eval`: the GR decoder trained by next-token
prediction of semantic IDs, evaluated by trie-constrained beam search.

A GR run is `model.arch: gr` with `loss.objective: ntp | page_ntp` and a semantic-ID table (`ids.codes:
PATH` to a codes.parquet, or `ids.from_run: RUN` to tokenise that run's item table at start). The run
directory keeps its own copy, RUN/ids/codes.parquet (+ its statistics), which eval, serve and --resume
read: nothing outside the run dir is needed after the start. The data fingerprint (RUN/data.json) holds
the table's sha256 under "codes", checked on --resume and on load.

The GR-specific parts live outside the Trainer: rows and the batch plan in mindgr.train.gr_data, decoding
evaluation in mindgr.train.gr_eval, the decoder/loss/optimizer cells in GRModel below. GenerativeTrainer
is a thin adapter over mindgr.train.trainer.Trainer overriding hooks only (_check_catalogue: the code
table against the catalogue and the GR data; _check_data: the table into the run dir and the
fingerprint; _build_model, _prepare, _split_metrics, _train_flops), so that the run dir, checkpoints,
resume, logging, divergence checks and best-validation selection are the Trainer's own.

The agreed interface with serving (notes/gr_interface.md): `load_generative_run`, `LoadedGenerativeRun`,
`is_generative_config`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.config import Config, ConfigError
from mindgr.train.checkpoint import CheckpointError, CheckpointManager, file_sha256, load_checkpoint, restore_parameters
from mindgr.train.trainer import Trainer, _ranks_dir, ranks_file_name, run_config, setup_mindspore

CODES_FILE = "ids/codes.parquet"        # a GR run's own code table, relative to its run dir


def is_generative_config(cfg: Config) -> bool:
    """True when the run trains the GR decoder (model.arch gr, or a generative objective)."""
    from mindgr.models.objectives import GENERATIVE_ARCH, _OBJECTIVES
    spec = _OBJECTIVES.get(cfg.loss.objective)
    return cfg.model.arch == GENERATIVE_ARCH or bool(spec is not None and spec.generative)


# ---- the code table ----------------------------------------------------------------------------------
@dataclass
class CodeTable:
    codes: np.ndarray        # int32 [V+1, Lt], row 0 zeros
    level_sizes: list        # [Lt]
    raw_ids: np.ndarray      # int64 [V+1], [0] = -1
    stats: dict
    source: str


def _table_from_file(path) -> CodeTable:
    from mindgr.ids.codes import load_codes, stats_path
    codes, sizes, raw = load_codes(path)
    side = stats_path(path)
    stats = json.loads(side.read_text()) if side.is_file() else {}
    return CodeTable(codes, [int(s) for s in sizes], raw, stats, str(path))


def resolve_codes(cfg: Config) -> CodeTable:
    """The configured source of semantic IDs (a fresh run): ids.codes, or tokenising ids.from_run's table."""
    ids = cfg.ids
    if ids.codes:
        if not Path(ids.codes).is_file():
            raise ConfigError(f"config: ids.codes = {ids.codes}: no such file (a codes.parquet of `mindgr ids build`)")
        return _table_from_file(ids.codes)
    if ids.from_run:
        from mindgr.ids.tokenizer import tokenize
        from mindgr.train.item_table import run_item_vectors
        vectors, raw = run_item_vectors(ids.from_run, ids.checkpoint)
        result = tokenize(vectors, levels=ids.levels, codes=ids.codes_per_level, seed=ids.seed)
        stats = dict(result.stats, source={"run": str(ids.from_run), "checkpoint": ids.checkpoint})
        return CodeTable(np.asarray(result.codes, np.int32), [int(s) for s in result.level_sizes], raw, stats,
                         f"tokenised from {ids.from_run}")
    raise ConfigError("config: model.arch = gr needs a semantic-ID table: set ids.codes (a codes.parquet) or "
                      "ids.from_run (a trained run whose item table is tokenised)")


def check_codes_catalogue(table: CodeTable, store):
    """The table must give codes to exactly the data's items, in the same order (raw ids)."""
    v = store.num_items
    n = table.codes.shape[0] - 1
    if n != v:
        raise ConfigError(f"ids: {table.source}: has codes for {n} items, the data '{store.name}' has {v} "
                          "(a table of another catalogue?)")
    raw = np.asarray(store.item_raw_ids, np.int64)
    diff = np.flatnonzero(raw[1:] != table.raw_ids[1:])
    if diff.size:
        i = int(diff[0]) + 1
        raise ConfigError(f"ids: {table.source}: item {i} is raw id {int(table.raw_ids[i])} in the table but "
                          f"{int(raw[i])} in the data (a table of another catalogue?)")


def codes_fingerprint(run_dir: Path) -> dict:
    p = Path(run_dir) / CODES_FILE
    return {"file": CODES_FILE, "bytes": p.stat().st_size, "sha256": file_sha256(p)}


def check_codes_fingerprint(run_dir: Path):
    """The run dir's code table is the one it was trained with (RUN/data.json "codes")."""
    from mindgr.train.data import FINGERPRINT_FILE
    run_dir = Path(run_dir)
    path = run_dir / CODES_FILE
    if not path.is_file():
        raise CheckpointError(f"{run_dir}: a generative run without its code table ({CODES_FILE})")
    fp = run_dir / FINGERPRINT_FILE
    saved = json.loads(fp.read_text()).get("codes") if fp.is_file() else None
    if saved and saved.get("sha256") != file_sha256(path):
        raise CheckpointError(f"{path}: changed since the run was trained (sha256 differs from {fp.name}); a GR "
                              "run decodes only with the code table it was trained on")


# ---- the cells ---------------------------------------------------------------------------------------
class GRModel:
    """GR decoder, NTP loss, optimizer and the compiled train step (the Trainer's `model`)."""

    def __init__(self, cfg: Config, level_sizes, num_items: int):
        from mindgr.models.generative import build_decoder
        from mindgr.models.objectives import build_objective, check_objective_arch
        from mindgr.train.step import TrainStep, build_optimizer
        check_objective_arch(cfg)
        self.decoder = build_decoder(cfg.model, level_sizes, cfg.data.max_len, cfg.run.seed)
        self.encoder = self.decoder          # the Trainer's name for the trained network
        self.loss_net = build_objective(cfg, self.decoder, num_items)
        self.optimizer = build_optimizer(self.decoder.trainable_params(), cfg.train)
        self.train_step = TrainStep(self.loss_net, self.optimizer)


class _GRRunData:
    """The Trainer's RunData with the GR training examples and plan in place of the item-encoder ones."""

    def __init__(self, base, train):
        self._base, self.train, self.plan = base, train, train.plan

    def __getattr__(self, name):
        return getattr(self._base, name)


def gr_train_data(cfg: Config, data, table: CodeTable):
    """GRTrainData of a RunData: its training windows (and pages) as NTP rows over the code table."""
    from mindgr.models.ntp import RowError
    from mindgr.train.gr_data import GRTrainData, page_windows, training_windows
    windows = training_windows(data.train.inputs, data.train.targets)
    pages = page_windows(data.store, data.split, windows)
    if cfg.loss.objective == "page_ntp" and pages is None:
        raise ConfigError(f"config: loss.objective = page_ntp needs pages, and data '{data.store.name}' has none "
                          "(a csv page_column, or use loss.objective=ntp)")
    offsets = np.concatenate([[0], np.cumsum(table.level_sizes)]).astype(np.int64)
    try:
        return GRTrainData(windows, table.codes, offsets, int(offsets[-1]), cfg.loss.objective,
                           cfg.model.token_merger, cfg.train.batch_size, cfg.run.seed, cfg.data.token_capacity,
                           pages if cfg.loss.objective == "page_ntp" else None)
    except RowError as e:
        raise ConfigError(f"config: {e}") from None


class GenerativeTrainer(Trainer):
    """The Trainer for a GR run: hooks only (see the module docstring)."""

    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False):
        from mindgr.models.objectives import check_objective_arch
        check_objective_arch(cfg)
        if cfg.parallel.nproc > 1 or cfg.parallel.sparse != "none":
            raise ConfigError("config: model.arch = gr trains in one process (parallel.nproc = 1, parallel.sparse = none)")
        beam_width_of(cfg)
        super().__init__(cfg, resume, quiet)

    def _check_catalogue(self):
        own = self.run_dir / CODES_FILE
        if self.resume_meta is not None:     # a resumed run decodes with its own table, nothing else
            check_codes_fingerprint(self.run_dir)
            self.codes = _table_from_file(own)
        else:
            self.codes = resolve_codes(self.cfg)
        check_codes_catalogue(self.codes, self.data.store)
        self.data = _GRRunData(self.data, gr_train_data(self.cfg, self.data, self.codes))
        from mindgr.ids.trie import PrefixTrie
        self.trie = PrefixTrie(self.codes.codes, self.codes.level_sizes)

    def _check_data(self, resume: bool):
        super()._check_data(resume)
        if not self.writer or self.resume_meta is not None:
            return
        from mindgr.ids.codes import save_codes
        from mindgr.train.data import FINGERPRINT_FILE
        from mindgr.train.logger import write_json_atomic
        t = self.codes
        save_codes(self.run_dir / CODES_FILE, t.codes, t.level_sizes, t.raw_ids, dict(t.stats, copied_from=t.source))
        fp_path = self.run_dir / FINGERPRINT_FILE
        fp = json.loads(fp_path.read_text())
        fp["codes"] = codes_fingerprint(self.run_dir)
        write_json_atomic(fp_path, fp)

    def _build_model(self):
        m = GRModel(self.cfg, self.codes.level_sizes, self.data.num_items)
        gd = self.data.train
        self.log.info(f"GR: {self.cfg.loss.objective}, token merger {self.cfg.model.token_merger}, codes "
                      f"{'x'.join(str(s) for s in self.codes.level_sizes)} ({self.codes.source}); "
                      f"{len(gd.windows)} examples, {int(gd.tokens.sum())} tokens/epoch; capacity "
                      f"{gd.token_capacity} tokens x {gd.row_capacity} rows, {gd.plan.num_batches(0)} batches/epoch; "
                      f"decoder max_len {m.decoder.max_len}")
        return m

    def _prepare(self, epoch: int, b: int, indices):
        from mindgr.models.ntp import BATCH_KEYS
        batch, info = self.data.train.batch(indices)
        drop = self.sampler.masks.batch(epoch, b)
        return tuple(batch[k] for k in BATCH_KEYS) + (drop,), info

    def _train_flops(self, batch: dict) -> float:
        from mindgr.models import model_spec
        from mindgr.models.objectives import objective_spec
        fwd = model_spec(self.cfg.model.arch).encoder_flops(self.cfg.model, batch["lengths"])
        fwd += objective_spec(self.cfg.loss.objective).flops(self.cfg.model, batch["tokens"],
                                                              self.model.decoder.num_codes)
        return 3.0 * fwd

    def _split_metrics(self, examples, split: str) -> dict:
        from mindgr.train.gr_eval import generative_metrics
        e = self.cfg.eval
        evalset = getattr(self.data.split, split)
        cap = e.max_users if split == "valid" else 0
        metrics = generative_metrics(self.model.decoder, self.trie, self.codes.codes, evalset, e.ks,
                                     self.cfg.data.max_len, beam_width_of(self.cfg), e.batch_size,
                                     self.data.num_items, e.filter_history, cap, self.cfg.run.seed)
        d = metrics["decode"]
        capped = f" (eval.max_users = {cap} of {len(evalset.targets)})" if cap and cap < len(evalset.targets) else ""
        self.log.info(f"decode {split}: {d['users']} users{capped}, beam {d['beam']}, history "
                      f"{'filtered' if e.filter_history else 'not filtered'}, {d['users_per_s']:.0f} users/s, "
                      f"prompt {d['prompt_tokens_mean']:.1f} tokens")
        return metrics


def beam_width_of(cfg: Config) -> int:
    from mindgr.ids.beam import BeamError
    from mindgr.train.gr_eval import beam_width
    try:
        return beam_width(cfg.eval)
    except BeamError as e:
        raise ConfigError(f"config: {e}") from None


# ---- loading a trained GR run (eval, serving) ------------------------------------------------------------
@dataclass
class LoadedGenerativeRun:
    cfg: Config
    run_dir: Path
    decoder: object          # mindgr.models.generative.GRDecoder, the checkpoint's weights, set_train(False)
    codes: np.ndarray        # int32 [V+1, Lt], row 0 = padding (zeros)
    level_sizes: list
    trie: object             # mindgr.ids.trie.PrefixTrie(codes, level_sizes)
    raw_ids: np.ndarray      # int64 [V+1], the dataset's raw id of every item index ([0] unused)
    max_history: int         # history items in a prompt (data.max_len)
    checkpoint: str          # the checkpoint file loaded
    step: int | None = None
    data_note: str | None = None


def load_generative_run(run_dir, which: str = "best", allow_data_change: bool = False,
                        threads: int | None = None) -> LoadedGenerativeRun:
    """A GR run with its best (or latest) checkpoint restored, its own code table and trie. The data it
    was trained on must be unchanged (its fingerprint), unless allow_data_change."""
    if which not in ("best", "latest"):
        raise ValueError(f"checkpoint: {which!r} (expected best or latest)")
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if not is_generative_config(cfg):
        raise CheckpointError(f"{run_dir}: not a generative run (model.arch = {cfg.model.arch}); use mindgr.train.trainer.load_run")
    if threads is not None:
        cfg.parallel.threads = threads
    ckpts = CheckpointManager(run_dir, cfg.run.keep_last)
    path = ckpts.best() if which == "best" else ckpts.latest()
    if path is None:
        if which == "best" and ckpts.latest() is not None:
            raise CheckpointError(f"{run_dir}: no best checkpoint (no validation has run: eval.every_epochs = "
                                  f"{cfg.eval.every_epochs}); use the last one with --checkpoint latest")
        raise CheckpointError(f"{run_dir}: no checkpoint to load")
    check_codes_fingerprint(run_dir)
    from mindgr.train.data import FINGERPRINT_FILE, data_fingerprint, fingerprint_mismatch
    saved_fp = run_dir / FINGERPRINT_FILE
    data_note = None
    if saved_fp.is_file():
        diff = fingerprint_mismatch(json.loads(saved_fp.read_text()), data_fingerprint(cfg.data))
        if diff and not allow_data_change:
            raise CheckpointError(f"{run_dir}: its data changed since it was trained ({diff}); pass "
                                  "--allow-data-change to use the data as it is now")
        data_note = f"evaluated on changed data ({diff})" if diff else None
    table = _table_from_file(run_dir / CODES_FILE)
    setup_mindspore(cfg)
    model = GRModel(cfg, table.level_sizes, table.codes.shape[0] - 1)
    tensors, meta = load_checkpoint(path)
    restore_parameters(model.train_step, tensors, str(path))
    model.decoder.set_train(False)
    from mindgr.ids.trie import PrefixTrie
    return LoadedGenerativeRun(cfg, run_dir, model.decoder, table.codes, table.level_sizes,
                               PrefixTrie(table.codes, table.level_sizes), table.raw_ids, cfg.data.max_len,
                               path.name, meta.get("step"), data_note)


def _saved_ranks(path: Path, checkpoint_sha: str, users: int, max_users: int):
    """(ranks, ties) of an earlier decode of the same checkpoint and users (None if there is none)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as f:
            if str(f["checkpoint_sha256"]) != checkpoint_sha or int(f["max_users"]) != max_users \
                    or len(f["ranks"]) != users:
                return None
            return f["ranks"], f["ties"]
    except (KeyError, ValueError, OSError):
        return None


def evaluate_generative_run(run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                            filter_history: bool | None = None, max_users: int = 0) -> dict:
    """`mindgr eval` of a GR run: decode the split's users (all, or a fixed seeded sample of max_users) and
    write RUN/ranks/ like the encoders' eval. One decode gives both rankings (history filtered and not),
    so both ranks files are written; a later eval or `mindgr compare` of the same checkpoint reuses them
    (the file records the checkpoint's sha256) instead of decoding again."""
    from mindgr.train.data import RunData
    from mindgr.train.gr_eval import generative_metrics
    from mindgr.train.metrics import ranking_metrics
    run = load_generative_run(run_dir, which, allow_data_change)
    cfg = run.cfg
    if filter_history is None:
        filter_history = cfg.eval.filter_history
    beam = beam_width_of(cfg)
    ranks_dir, ranks_note = _ranks_dir(run.run_dir)
    data = RunData(cfg)
    evalset = getattr(data.split, split)
    targets = np.asarray(evalset.targets, np.int64)
    ckpt = CheckpointManager(run.run_dir, cfg.run.keep_last)
    ckpt_path = ckpt.best() if which == "best" else ckpt.latest()
    sha = file_sha256(ckpt_path.with_suffix(".json"))   # the sidecar names the committed weights file
    paths = {f: ranks_dir / ranks_file_name(split, which, f) for f in (True, False)}
    saved = _saved_ranks(paths[filter_history], sha, len(targets), max_users)
    if saved is not None:
        ranks, ties = saved
        seen = ranks >= 0
        metrics = ranking_metrics(ranks[seen], cfg.eval.ks, ties[seen])
        metrics["decode"] = {"reused": str(paths[filter_history])}
    else:
        metrics, both = generative_metrics(run.decoder, run.trie, run.codes, evalset, cfg.eval.ks, run.max_history,
                                           beam, cfg.eval.batch_size, data.num_items, filter_history,
                                           max_users, cfg.run.seed, per_user=True)
        for f, (_, r, t) in both.items():
            tmp = paths[f].with_name(paths[f].stem + ".tmp.npz")
            np.savez(tmp, ranks=r, ties=t, targets=targets, checkpoint=run.checkpoint, checkpoint_sha256=sha,
                     max_users=max_users, filter_history=f)
            os.replace(tmp, paths[f])
    out = {"run": str(run.run_dir), "split": split, "checkpoint": run.checkpoint, "step": run.step,
           "filter_history": filter_history, **metrics, "ranks_file": str(paths[filter_history])}
    if max_users:
        out["note"] = f"a fixed sample of {metrics['count']} of {len(targets)} users (--max-users)"
    for key, note in (("ranks_note", ranks_note), ("data_note", run.data_note)):
        if note:
            out[key] = note
    return out
