"""Generative retrieval through `mindgr train` / `mindgr eval`: the GR decoder trained by next-token
prediction of semantic IDs, evaluated by trie-constrained beam search.

A GR run is `model.arch: gr` with `loss.objective: ntp | page_ntp` and a semantic-ID table (`ids.codes:
PATH` to a codes.parquet, or `ids.from_run: RUN` to tokenise that run's item table at start). The run
directory keeps its own copy, RUN/ids/codes.parquet (+ its statistics), which eval, serve and --resume
read: nothing outside the run dir is needed after the start. The data fingerprint (RUN/data.json) holds
the table's sha256 under "codes", checked on --resume and on load.

The GR-specific parts live outside the loop: rows and the batch plan in mindgr.train.gr_data, decoding
evaluation in mindgr.train.gr_eval, the decoder/loss/optimizer cells in GRModel below, and GenerativeTask,
the task (mindgr.train.task) that any executor accepting it runs under the one training loop
(mindgr.train.loop): load (the code table against the catalogue, the GR rows and plan), on_run_dir (the
table into the run dir and the fingerprint), build_model, inputs / rank_inputs, flops, evaluate (beam
search). The run dir, checkpoints, resume, logging, divergence checks and best-validation selection are the
loop's own. GenerativeTrainer(cfg) is the loop with that task on the local executor.

The agreed interface with serving (notes/gr_interface.md): `load_generative_run`, `LoadedGenerativeRun`;
which runs are generative: mindgr.train.tasks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindgr.config import Config, ConfigError
from mindgr.paths import atomic_write
from mindgr.train.checkpoint import CheckpointError, CheckpointManager, file_sha256, load_checkpoint, restore_parameters
from mindgr.train.gr_eval import USER_METRIC_PREFIX, user_metrics_of
from mindgr.train.task import ArrayInputs, Task
from mindgr.train.loop import TrainLoop
from mindgr.train.rundir import data_change_note, run_config, saved_checkpoint
from mindgr.train.saved_run import SEARCH, history_mode
from mindgr.train.trainer import _ranks_dir, ranks_file_name, setup_mindspore

CODES_FILE = "ids/codes.parquet"        # a GR run's own code table, relative to its run dir


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
    """GR decoder, NTP loss, optimizer and the compiled train step (the Trainer's `model`). The trie of the
    code table gives the loss its softmax groups under model.trie_softmax."""

    def __init__(self, cfg: Config, trie, num_items: int, tree_caps=None):
        from mindgr.models.generative import build_decoder
        from mindgr.models.objectives import build_objective, check_objective_arch
        from mindgr.train.step import TrainStep, build_optimizer
        check_objective_arch(cfg)
        self.decoder = build_decoder(cfg.model, [int(s) for s in trie.level_sizes], cfg.data.max_len, cfg.run.seed,
                                     num_items)
        self.encoder = self.decoder          # the Trainer's name for the trained network
        if tree_caps is not None:            # data.gr_layout = tree: the same objective over tree batches
            from mindgr.models.tree import TreeNTPLoss
            self.loss_net = TreeNTPLoss(self.decoder, tree_caps)
        elif cfg.model.trie_softmax:         # copied rows in the entry layout (the head at targets only)
            from mindgr.models.ntp import EntryNTPLoss
            self.loss_net = EntryNTPLoss(self.decoder)
        else:
            self.loss_net = build_objective(cfg, self.decoder, num_items)
        if cfg.model.trie_softmax:           # only the trie's allowed codes are scored (models.trie_head)
            self.loss_net.use_trie_head(trie_head(self.decoder, trie))
        self.optimizer = build_optimizer(self.decoder.trainable_params(), cfg.train)
        self.train_step = TrainStep(self.loss_net, self.optimizer)


def trie_head(decoder, trie):
    """The loss head that scores only the codes the trie allows (model.trie_softmax)."""
    from mindgr.models.trie_head import TrieHead
    return TrieHead(decoder, [trie.children(l) for l in range(1, trie.num_levels)], trie.node_offsets(),
                    trie.masks[0][0])


def entry_codes(trie) -> np.ndarray:
    """Per prefix node (item_nodes' numbering): the codes the trie head scores for an entry there, the whole
    first level at the root (one matmul), the allowed children elsewhere."""
    counts = np.concatenate([m.sum(1) for m in trie.masks]).astype(np.int64)
    counts[0] = int(trie.level_sizes[0])
    return counts


def gr_train_data(cfg: Config, data, table: CodeTable, trie):
    """GRTrainData of a RunData: its training windows (and pages) as NTP rows over the code table."""
    from mindgr.models.generative import decoder_max_len
    from mindgr.models.ntp import RowError
    from mindgr.train.gr_data import GRTrainData, GRTreeData, page_windows, training_windows
    windows = training_windows(data.train.inputs, data.train.targets)
    pages = page_windows(data.store, data.split, windows)
    if cfg.loss.objective == "page_ntp" and pages is None:
        raise ConfigError(f"config: loss.objective = page_ntp needs pages, and data '{data.store.name}' has none "
                          "(a csv page_column, data.pages=timestamps or data.synthetic.page_size; or use "
                          "loss.objective=ntp)")
    offsets = np.concatenate([[0], np.cumsum(table.level_sizes)]).astype(np.int64)
    pages = pages if cfg.loss.objective == "page_ntp" else None
    groups = trie.item_nodes() if cfg.model.trie_softmax else None
    head = entry_codes(trie) if cfg.model.trie_softmax else None
    common = (windows, table.codes, offsets, int(offsets[-1]), cfg.loss.objective, cfg.model.token_merger,
              cfg.train.batch_size, cfg.run.seed)
    try:
        if cfg.data.gr_layout == "tree":
            max_len = decoder_max_len(len(table.level_sizes), cfg.model.token_merger, cfg.data.max_len)
            return GRTreeData(*common, max_len, cfg.data.token_capacity, pages, groups, head)
        return GRTrainData(*common, cfg.data.token_capacity, pages, groups, head)
    except RowError as e:
        raise ConfigError(f"config: {e}") from None


class GRExamples:
    """The GR examples an executor plans and splits: token rows per example, the global capacities, and each
    example's share of the NTP loss normaliser (the sum of its target weights, computed when first asked)."""

    def __init__(self, train):
        self.train = train
        self.lengths = train.tokens
        self.token_capacity, self.row_capacity = train.token_capacity, train.row_capacity
        self._weights = np.full(len(train.tokens), np.nan)
        self._head_codes = np.zeros(len(train.tokens), np.int64)

    def __getitem__(self, indices):
        """The loss weights of examples `indices` (RankPlanner's `weights`)."""
        indices = self._known(indices)
        return self._weights[indices]

    def head_codes(self, indices) -> int:
        """Codes the trie head scores for examples `indices` (each loss entry's allowed codes), as a batch of
        them counts in its info: the global batch's FLOPs on a rank that packs only its share."""
        indices = self._known(indices)
        return int(self._head_codes[indices].sum())

    def _known(self, indices) -> np.ndarray:
        """indices as an array, after the weight and head-code count of each new example (one pass over its
        rows; the head codes stay 0 without the trie head)."""
        indices = np.asarray(indices, np.int64)
        codes = self.train.entry_codes
        for i in np.unique(indices[np.isnan(self._weights[indices])]):
            rows = self.train.rows(int(i))
            self._weights[i] = float(sum(np.float64(r["weight"].sum()) for r in rows))
            if codes is not None:
                self._head_codes[i] = sum(int(codes[r["group"][r["weight"] > 0]].sum()) for r in rows)
        return indices


class GenerativeTask(Task):
    """Generative retrieval: its own task data (NTP token rows over the code table and their batch plan,
    mindgr.train.gr_data), its own step inputs (mindgr.models.ntp.BATCH_KEYS + the dropout masks), FLOPs
    (decoder + NTP head) and evaluation (trie-constrained beam search -> ranks -> metrics,
    mindgr.train.gr_eval). on_run_dir keeps the run's own code table in RUN/ids/. Runs on the local and the
    data-parallel executor (a rank packs its share of the global batch's examples, with its rows of the
    single-process dropout masks)."""

    name = "generative"
    serving = "generative"
    samples_users = True
    semantic_ids = True

    _restored: Path | None = None    # the checkpoint the decoder's weights are exactly (None once a step ran)
    eval_apart = True                # the decoding graphs (~1 GB at Beauty's shape) never sit beside the step's

    def release_eval(self):
        from mindgr.train.gr_eval import drop_engines
        drop_engines()

    def check_config(self, executor: str):
        from mindgr.models.objectives import check_objective_arch
        super().check_config(executor)
        check_objective_arch(self.cfg)
        c = self.cfg
        if executor not in ("local", "data_parallel"):
            raise ConfigError("config: model.arch = gr trains in one process or data parallel (parallel.sparse = none)")
        if executor != "local":
            if c.data.gr_layout == "tree":
                raise ConfigError("config: data.gr_layout = tree trains in one process (parallel.nproc = 1); use "
                                  "data.gr_layout = rows with more processes")
            if c.model.item_id_dropout > 0:
                raise ConfigError("config: model.item_id_dropout trains in one process (parallel.nproc = 1) so far")
        if c.model.item_id_dropout > 0 and c.model.token_merger != "item_id":
            raise ConfigError(f"config: model.item_id_dropout = {c.model.item_id_dropout} needs "
                              f"model.token_merger = item_id (it is {c.model.token_merger})")
        beam_width_of(c)

    def load(self, run_dir, resuming: bool):
        from mindgr.ids.trie import PrefixTrie
        from mindgr.train.task import RetrievalTask
        self.task = RetrievalTask(self.cfg, check_negatives=False)   # the store, split and eval sets
        self.task.load()
        self.data = self.task.data
        if resuming:                         # a resumed run decodes with its own table, nothing else
            check_codes_fingerprint(run_dir)
            self.codes = _table_from_file(Path(run_dir) / CODES_FILE)
        else:
            self.codes = resolve_codes(self.cfg)
        check_codes_catalogue(self.codes, self.data.store)
        self.trie = PrefixTrie(self.codes.codes, self.codes.level_sizes)
        self.train = gr_train_data(self.cfg, self.data, self.codes, self.trie)
        self._examples = GRExamples(self.train)
        self.plan = self.train.plan
        return self.plan

    @property
    def examples(self):
        return self._examples

    def example_weights(self):
        return self._examples

    def rank_capacities(self, world: int, slack: float) -> tuple[int, int]:
        """Tokens as the retrieval task; rows: as many of the shortest row as the tokens hold (an example
        may give several rows, so the global row capacity / world does not bound a rank's rows)."""
        tokens, _ = super().rank_capacities(world, slack)
        shortest = min(min(c) for c in self.train.row_counts)
        rows = -(-tokens // shortest)                 # ceil
        return tokens, int(-(-rows // 8) * 8)       # rounded up to 8

    def describe(self) -> str:
        d, gd = self.data, self.train
        return (f"{d.store.num_users} users, {d.num_items} items, {len(gd.windows)} GR examples, capacity "
                f"{gd.token_capacity} tokens x {gd.row_capacity} rows, {gd.plan.num_batches(0)} batches/epoch "
                f"({self.task.load_s:.1f}s)")

    def on_run_dir(self, run_dir, fresh: bool):
        if not fresh:
            return
        from mindgr.ids.codes import save_codes
        from mindgr.paths import write_json_atomic
        from mindgr.train.data import FINGERPRINT_FILE
        t, run_dir = self.codes, Path(run_dir)
        save_codes(run_dir / CODES_FILE, t.codes, t.level_sizes, t.raw_ids, dict(t.stats, copied_from=t.source))
        fp_path = run_dir / FINGERPRINT_FILE
        fp = json.loads(fp_path.read_text())
        fp["codes"] = codes_fingerprint(run_dir)
        write_json_atomic(fp_path, fp)

    def build_model(self, log):
        from mindgr.train.local import HostSampler
        self.log = log
        gd = self.train
        self.model = GRModel(self.cfg, self.trie, self.data.num_items, getattr(gd, "caps", None))
        self.sampler = HostSampler(self.cfg, self.data.num_items, self.model.decoder, gd.token_capacity)
        log.info(f"GR: {self.cfg.loss.objective}, token merger {self.cfg.model.token_merger}, "
                 f"{self.cfg.data.gr_layout} layout, codes "
                 f"{'x'.join(str(s) for s in self.codes.level_sizes)} ({self.codes.source}); "
                 f"{len(gd.windows)} examples, {int(gd.tokens.sum())} tokens/epoch; capacity "
                 f"{gd.token_capacity} tokens x {gd.row_capacity} rows, {gd.plan.num_batches(0)} batches/epoch; "
                 f"decoder max_len {self.model.decoder.max_len}")
        return self.model

    def inputs(self, epoch: int, b: int, indices):
        batch, info = self.train.batch(indices)
        p_id = self.cfg.model.item_id_dropout
        if p_id > 0:                         # a stream of its own per (seed, epoch, batch): resumes exactly
            from mindgr.models.ntp import drop_item_slots
            rng = np.random.default_rng([self.cfg.run.seed, epoch, b, 13])
            batch = dict(batch, slots=drop_item_slots(batch["slots"], self.train.pad_id, p_id, rng))
        drop = self.sampler.masks.batch(epoch, b)
        return ArrayInputs(tuple(batch[k] for k in self.train.keys) + (drop,)), info

    def rank_inputs(self, epoch: int, b: int, indices, share, shape):
        """This rank's examples' rows packed at its capacities (rows keep the global batch's token order,
        so share.token_src picks this rank's rows of the single-process masks), loss weighted by share.scale.
        info: the global batch's tokens and row lengths (the step's FLOPs, as one process counts them)."""
        batch, _ = self.train.batch(share.indices, shape.rank_tokens, shape.rank_rows)
        drop = self.sampler.masks.rows(epoch, b, share.token_src, shape.rank_tokens)
        arrays = tuple(batch[k] for k in self.train.keys) + (drop, np.float32(share.scale))
        lengths = np.array([n for i in indices for n in self.train.row_counts[int(i)]], np.int64)
        info = {"tokens": share.global_tokens, "lengths": lengths}
        if self.train.entry_codes is not None:
            info["head_codes"] = self._examples.head_codes(indices)
        return ArrayInputs(arrays), info

    def flops(self, info: dict) -> float:
        from mindgr.models import model_spec
        from mindgr.models.objectives import objective_spec
        from mindgr.models.generative import prefix_attention_flops
        fwd = model_spec(self.cfg.model.arch).encoder_flops(self.cfg.model, info["lengths"])
        fwd += prefix_attention_flops(self.cfg.model, info.get("prefix_pairs", 0))        # tree layout
        if "head_codes" in info:             # the trie head: the codes it scores
            fwd += 2.0 * self.cfg.model.dim * info["head_codes"]
        else:
            fwd += objective_spec(self.cfg.loss.objective).flops(self.cfg.model,
                                                                  info.get("head_tokens", info["tokens"]),
                                                                  self.model.decoder.num_codes)
        return 3.0 * fwd

    def restored(self, path):
        self._restored = None if path is None else Path(path)

    def _best_restored(self, run_dir) -> Path | None:
        """The best checkpoint when the decoder holds exactly its weights (the final evaluation), else None."""
        best = CheckpointManager(run_dir, self.cfg.run.keep_last).best()
        return best if best is not None and self._restored == best else None

    def evaluate(self, model, split: str, ctx) -> dict:
        """Beam search of every user on every rank (the same decode; the writer keeps the ranks files)."""
        from mindgr.train.gr_eval import generative_metrics, progress_printer
        e = self.cfg.eval
        evalset = getattr(self.data.split, split)
        cap = e.max_users if split == "valid" else e.test_max_users
        best = self._best_restored(ctx.run_dir) if split == "test" else None
        searched = bool(e.exclude_history_in_search)
        metrics = generative_metrics(model.decoder, self.trie, self.codes.codes, evalset, e.ks,
                                     self.cfg.data.max_len, beam_width_of(self.cfg), e.batch_size,
                                     self.data.num_items, searched or e.filter_history, cap, self.cfg.run.seed,
                                     per_user=best is not None,
                                     progress=_alive(ctx, split, progress_printer(split, emit=ctx.log.info)),
                                     exclude_in_search=searched)
        if best is not None:                 # the final test decode: its ranks, for `mindgr eval` / `compare`
            metrics, both = metrics
            if ctx.writer:
                ranks_dir, _ = _ranks_dir(ctx.run_dir)
                save_decode_ranks(ranks_dir, split, "best", evalset.targets, both, best, cap,
                                  getattr(evalset, "target_values", None), searched)
        d = metrics["decode"]
        capped = f" (eval.max_users = {cap} of {len(evalset.targets)})" if cap and cap < len(evalset.targets) else ""
        ctx.log.info(f"decode {split}: {d['users']} users{capped}, beam {d['beam']}, history "
                 f"{history_words(searched or e.filter_history, searched)}, {d['users_per_s']:.0f} users/s, "
                 f"prompt {d['prompt_tokens_mean']:.1f} tokens")
        return metrics

    # ---- saved runs -----------------------------------------------------------------------------
    @classmethod
    def load_run(cls, run_dir, which: str = "best", allow_data_change: bool = False, threads: int | None = None):
        return load_generative_run(run_dir, which, allow_data_change, threads)

    @classmethod
    def evaluate_run(cls, run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                     filter_history=None, max_users: int | None = None) -> dict:
        return evaluate_generative_run(run_dir, split, which, allow_data_change, filter_history, max_users)


def _alive(ctx, split: str, progress):
    """A decode's progress callback that also tells the executor (its watchdog) the rank is alive."""
    if ctx.beat is None:
        return progress

    def report(done: int, total: int, seconds: float):
        ctx.beat(f"decoding {split}: {done}/{total} users")
        progress(done, total, seconds)
    return report


class GenerativeTrainer(TrainLoop):
    """The training loop with the GR task on the local executor (one process)."""

    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False):
        from mindgr.train.local import LocalExecutor
        super().__init__(cfg, LocalExecutor(cfg, GenerativeTask(cfg)), resume, quiet)


def beam_width_of(cfg: Config) -> int:
    from mindgr.generate.beam import BeamError
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
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    from mindgr.models.objectives import objective_spec
    if not objective_spec(cfg.loss.objective).generative:     # what its objective trains
        raise CheckpointError(f"{run_dir}: not a generative run (model.arch = {cfg.model.arch}); use mindgr.train.trainer.load_run")
    if threads is not None:
        cfg.parallel.threads = threads
    path = saved_checkpoint(run_dir, cfg, which)
    check_codes_fingerprint(run_dir)
    data_note = data_change_note(run_dir, cfg, allow_data_change)
    table = _table_from_file(run_dir / CODES_FILE)
    setup_mindspore(cfg)
    from mindgr.ids.trie import PrefixTrie
    trie = PrefixTrie(table.codes, table.level_sizes)
    model = GRModel(cfg, trie, table.codes.shape[0] - 1)
    tensors, meta = load_checkpoint(path)
    # Decoding reads the loss cell's weights (the decoder's) only. The optimizer's moments are named after the
    # cell the optimizer was built over, which runs saved before the trie head's entry layout name otherwise
    # (adam_m.decoder.* against adam_m.head.decoder.*): they are not needed here (--resume restores them).
    prefix = "loss_net."
    restore_parameters(model.train_step.loss_net, {k[len(prefix):]: v for k, v in tensors.items()
                                                   if k.startswith(prefix)}, str(path))
    model.decoder.set_train(False)
    return LoadedGenerativeRun(cfg, run_dir, model.decoder, table.codes, table.level_sizes, trie, table.raw_ids,
                               cfg.data.max_len,
                               path.name, meta.get("step"), data_note)


def _saved_ranks(path: Path, checkpoint_sha: str, users: int, max_users: int):
    """(ranks, ties) of an earlier decode of the same checkpoint and users (None if there is none)."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as f:
            if str(f["checkpoint_sha256"]) != checkpoint_sha or int(f["max_users"]) != max_users \
                    or len(f["ranks"]) != users or "lists" not in f.files:   # older files: no lists, decode again
                return None
            return f["ranks"], f["ties"], user_metrics_of(f)
    except (KeyError, ValueError, OSError):
        return None


def history_words(filtered: bool, searched: bool) -> str:
    return "skipped by the search" if searched else "filtered" if filtered else "not filtered"


def save_decode_ranks(ranks_dir: Path, split: str, which: str, targets, both: dict, ckpt_path: Path,
                      max_users: int, target_values=None, searched: bool = False) -> dict:
    """Both ranks files (history filtered and not) of one decode (generative_metrics(..., per_user=True)'s
    second value), each recording the checkpoint's sha256 and the users decoded so that a later eval of the
    same checkpoint reuses them; returns {filter_history: path}. Each also holds the decoded lists (`lists`,
    [U, min(beam, LIST_KEEP)] int32, before history filtering) and, for data with values, each target's
    value (`target_values`): what `mindgr compare --by-value / --judge` read. searched: a decode that
    skipped the history (the filtered ranking is the one kept, as {SEARCH: path})."""
    if searched:
        both = {SEARCH: both[True]}
    sha = file_sha256(ckpt_path.with_suffix(".json"))   # the sidecar names the committed weights file
    targets = np.asarray(targets, np.int64)
    values = {} if target_values is None else {"target_values": np.asarray(target_values, np.float32)}
    paths = {}
    for f, (_, r, t, extra, lists) in both.items():
        per_user = {USER_METRIC_PREFIX + name: v for name, v in extra.items()}
        paths[f] = ranks_dir / ranks_file_name(split, which, f)
        atomic_write(paths[f], lambda tmp: np.savez(tmp, ranks=r, ties=t, targets=targets, checkpoint=ckpt_path.name,
                                                    checkpoint_sha256=sha, max_users=max_users, filter_history=f,
                                                    lists=lists, **values, **per_user),
                     tmp_suffix=".tmp.npz")
    return paths


def evaluate_generative_run(run_dir, split: str = "test", which: str = "best", allow_data_change: bool = False,
                            filter_history: bool | None = None, max_users: int | None = None) -> dict:
    """`mindgr eval` of a GR run: decode the split's users (all, or a fixed seeded sample of max_users; None =
    the run's eval.test_max_users for the test split, all users for validation) and
    write RUN/ranks/ like the encoders' eval. One decode gives both rankings (history filtered and not),
    so both ranks files are written; a later eval or `mindgr compare` of the same checkpoint reuses them
    (the file records the checkpoint's sha256) instead of decoding again."""
    from mindgr.train.data import RunData
    from mindgr.train.gr_eval import generative_metrics, progress_printer
    from mindgr.train.metrics import ranking_metrics
    run = load_generative_run(run_dir, which, allow_data_change)
    cfg = run.cfg
    if filter_history is None:
        filter_history = history_mode(cfg.eval)
    searched = filter_history == SEARCH
    if max_users is None:
        max_users = cfg.eval.test_max_users if split == "test" else 0
    beam = beam_width_of(cfg)
    ranks_dir, ranks_note = _ranks_dir(run.run_dir)
    data = RunData(cfg)
    evalset = getattr(data.split, split)
    targets = np.asarray(evalset.targets, np.int64)
    ckpt = CheckpointManager(run.run_dir, cfg.run.keep_last)
    ckpt_path = ckpt.best() if which == "best" else ckpt.latest()
    sha = file_sha256(ckpt_path.with_suffix(".json"))   # the sidecar names the committed weights file
    paths = {f: ranks_dir / ranks_file_name(split, which, f) for f in ((SEARCH,) if searched else (True, False))}
    saved = _saved_ranks(paths[filter_history], sha, len(targets), max_users)
    if saved is not None:
        ranks, ties, extra = saved
        seen = ranks >= 0
        metrics = ranking_metrics(ranks[seen], cfg.eval.ks, ties[seen])
        metrics.update({name: float(v[v >= 0].mean()) for name, v in extra.items() if (v >= 0).any()})
        metrics["decode"] = {"reused": str(paths[filter_history])}
    else:
        metrics, both = generative_metrics(run.decoder, run.trie, run.codes, evalset, cfg.eval.ks, run.max_history,
                                           beam, cfg.eval.batch_size, data.num_items, searched or filter_history,
                                           max_users, cfg.run.seed, per_user=True, progress=progress_printer(split),
                                           exclude_in_search=searched)
        save_decode_ranks(ranks_dir, split, which, targets, both, ckpt_path, max_users,
                          getattr(evalset, "target_values", None), searched)
    out = {"run": str(run.run_dir), "split": split, "checkpoint": run.checkpoint, "step": run.step,
           "filter_history": filter_history, **metrics, "ranks_file": str(paths[filter_history])}
    if max_users:
        out["note"] = f"a fixed sample of {metrics['count']} of {len(targets)} users (max users {max_users})"
    for key, note in (("ranks_note", ranks_note), ("data_note", run.data_note)):
        if note:
            out[key] = note
    return out
