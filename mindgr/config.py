"""Typed run configuration: YAML file + `section.key=value` overrides, validated with one-line errors.

Every field is declared once here with its type and allowed range, so `--print-config` shows the whole
resolved run and a typo fails fast instead of being silently ignored.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key, the value and what is allowed."""


def _rng(lo=None, hi=None, lo_open=False, choices=None):
    return {"lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices}


@dataclass
class RunConfig:
    name: str = "run"                         # the run directory's name inside out_dir
    out_dir: str = "runs"                     # the run directory is out_dir/name
    seed: int = field(default=0, metadata=_rng(lo=0))     # initial weights, batch order, negatives, dropout
    log_every: int = field(default=10, metadata=_rng(lo=1))  # steps per progress line (and metrics.jsonl record)
    keep_last: int = field(default=2, metadata=_rng(lo=1))   # checkpoints kept besides the best one
    ckpt_every: int = field(default=0, metadata=_rng(lo=0))  # steps between checkpoints; 0 = once per epoch


@dataclass
class SyntheticConfig:
    num_users: int = field(default=2000, metadata=_rng(lo=1))   # users generated
    num_items: int = field(default=1000, metadata=_rng(lo=2))   # catalogue size
    median_len: int = field(default=50, metadata=_rng(lo=2))    # median history length (log-normal)
    min_len: int = field(default=5, metadata=_rng(lo=3))        # shortest history
    max_len: int = field(default=200, metadata=_rng(lo=3))      # longest history
    num_clusters: int = field(default=20, metadata=_rng(lo=1))  # interest clusters users drift between
    seed: int = field(default=0, metadata=_rng(lo=0))           # the generator's seed
    # request pages of about this many items (mindgr.datasets.synthetic); 0 = no pages
    page_size: float = field(default=0.0, metadata=_rng(lo=0.0))
    # a value per interaction (a 1-5 rating that depends on the user's interest in the item's cluster,
    # drawn from a stream of its own: the item sequences are the same with or without it)
    values: bool = False


@dataclass
class CsvConfig:
    """data.kind = csv: which columns of the interaction log hold what (see mindgr.datasets.csvlog)."""
    user_column: str = "user_id"              # a header name, or a 0-based field number with header: false
    item_column: str = "item_id"              # the item id column
    time_column: str = "timestamp"            # "" = no timestamps: file order is the order
    page_column: str = ""                     # optional page / request id of every row
    value_column: str = ""                    # optional value of every row (a rating, watch ratio, ...): a number
    time_unit: str = field(default="s", metadata=_rng(choices=["s", "ms", "us", "ns"]))  # unit of the time column
    separator: str = ","                      # one character, or tab / comma / semicolon / space / pipe
    header: bool = True                       # the first line names the columns
    dedupe: bool = False                      # drop events repeating an earlier one (counted either way)


@dataclass
class DataConfig:
    # the reader of data.path (README: Data; `sequences` = `user item item ...` lines)
    kind: str = field(default="synthetic", metadata=_rng(
        choices=["synthetic", "movielens-1m", "movielens-100k", "kuairand", "sequences", "csv", "store"]))
    path: str = ""                            # source file/dir (or a prepared store dir for kind=store)
    lenient: bool = False                     # skip (and count) malformed lines instead of failing
    max_len: int = field(default=200, metadata=_rng(lo=2))    # N: the most recent items kept
    holdout: int = field(default=2, metadata=_rng(lo=1, hi=2))  # 2: train on s[:-2]; 1: HSTU protocol s[:-1]
    token_capacity: int = field(default=0, metadata=_rng(lo=0))  # T_cap; 0 = derived from batch size
    row_capacity: int = field(default=0, metadata=_rng(lo=0))    # B_cap; 0 = derived
    positive_column: str = "is_click"         # kuairand: which column marks a positive interaction
    timestamps: str = ""                      # movielens-1m sequences.txt: ratings file with times for its users
    prefetch: int = field(default=2, metadata=_rng(lo=0))  # batches prepared ahead in a thread; 0 = inline
    # pages (mindgr.datasets.pages): "" = the source's own (csv page_column, synthetic page_size), or
    # "timestamps" = a user's items with equal times form one page (users with only zero times left out)
    pages: str = field(default="", metadata=_rng(choices=["", "timestamps"]))
    # item: leave one item out (test = last item); page: leave one page out (test = last page, valid = the
    # page before, training stops before the held-out pages; targets: the page's first item + all its items)
    holdout_unit: str = field(default="item", metadata=_rng(choices=["item", "page"]))
    # arch gr, training batches: rows (every target its own row, the prompt copied into each) or tree (each prompt once, every target a short segment on it)
    gr_layout: str = field(default="rows", metadata=_rng(choices=["rows", "tree"]))
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    csv: CsvConfig = field(default_factory=CsvConfig)


@dataclass
class ModelConfig:
    arch: str = "hstu"   # a registered model (mindgr.models.registry), checked there: config cannot import models
    dim: int = field(default=50, metadata=_rng(lo=1))         # D, item embedding width
    num_blocks: int = field(default=2, metadata=_rng(lo=1))   # encoder (or decoder) blocks
    num_heads: int = field(default=1, metadata=_rng(lo=1))    # attention heads
    dqk: int = field(default=0, metadata=_rng(lo=0))          # per-head q/k width; 0 = dim / heads
    dv: int = field(default=0, metadata=_rng(lo=0))           # per-head v width; 0 = dim / heads
    dropout: float = field(default=0.2, metadata=_rng(lo=0.0, hi=0.95))  # dropout rate in training
    time_bias: bool = True                    # HSTU relative time bias (needs timestamps)
    # The last position's time bias uses the row's request time (the target's time; the published HSTU
    # convention) instead of its own time. False (the default) is how every run before this key was
    # trained: a saved config.yaml without the key evaluates and resumes as it was trained.
    request_time: bool = False
    num_time_buckets: int = field(default=128, metadata=_rng(lo=1))  # log-spaced time-gap buckets of the bias
    ffn_dim: int = field(default=0, metadata=_rng(lo=0))      # SASRec FFN width; 0 = dim
    ffn_multiply: int = field(default=1, metadata=_rng(lo=1))  # FuXi-alpha SwiGLU hidden width = dim * this
    # arch gr: how a history item enters the prompt: none (one token per code), item (one merged token
    # per item), item_id (item plus a learned embedding of the item itself) or pairs (one per two codes);
    # decoding always emits every code
    token_merger: str = field(default="none", metadata=_rng(choices=["none", "item", "item_id", "pairs"]))
    # arch gr, token_merger item_id: in training, each prompt item's id slot is dropped (zero) with this
    # probability, so the merged token cannot lean on the id alone (decoding always has it)
    item_id_dropout: float = field(default=0.0, metadata=_rng(lo=0.0, hi=0.95))
    # arch gr: each code's softmax runs over the codes the prefix trie allows after the item's earlier
    # codes (in training and in decoding), instead of over every code of its level
    trie_softmax: bool = False
    # loss.objective rating (the reward model): each history item enters the encoder with the value the user
    # gave it (a learned direction times the value's distance from the mean), so the model reads the user's
    # rating scale; the scorer then needs the histories' values
    value_input: bool = False
    # arch gr: the decoder's blocks: hstu (pointwise SiLU attention with a relative position bias) or linear
    # (causal linear attention with a fixed per-head decay, HSTU's gating kept; mindgr.models.linear_attention)
    backbone: str = field(default="hstu", metadata=_rng(choices=["hstu", "linear"]))
    # backbone linear: tokens per chunk of the chunked training form (intra-chunk products + a state carried
    # between chunks); any value gives the same outputs, it only trades the two parts' work
    linear_chunk: int = field(default=64, metadata=_rng(lo=1))


@dataclass
class LossConfig:
    # a registered objective (mindgr.models.objectives): sampled_softmax (item encoders), ntp / page_ntp
    # (next-token prediction of semantic IDs, model.arch gr), rating (the reward model: an item encoder
    # regressing each interaction's value; needs data with values); checked there: config cannot import models
    objective: str = "sampled_softmax"
    # which negatives the sampled softmax scores: per token, one shared pool, the batch's targets, or pool + batch
    negatives: str = field(default="per_token", metadata=_rng(
        choices=["per_token", "shared_pool", "in_batch", "mixed"]))
    num_negatives: int = field(default=128, metadata=_rng(lo=1))   # R, per_token
    pool_size: int = field(default=4096, metadata=_rng(lo=1))      # K, shared_pool / mixed
    in_batch_size: int = field(default=1024, metadata=_rng(lo=1))  # distinct targets kept, in_batch / mixed
    sampling: str = field(default="uniform", metadata=_rng(choices=["uniform", "popularity"]))  # the pool's q
    logq: bool = True                          # logQ correction of shared candidates
    # What the shared candidates' sum estimates: the softmax over the whole catalogue ("full"), or the
    # per-token sampled softmax over num_negatives uniform negatives ("per_token": every candidate weighs
    # R/V, the published objective in expectation, with K/R times more samples behind it). Measured on
    # ML-1M: "per_token" trained worse than both "full" and per_token negatives (benchmarks/results/negatives.md).
    pool_estimate: str = field(default="full", metadata=_rng(choices=["full", "per_token"]))
    fp16_negatives: bool = False               # hold shared candidate embeddings and scores in float16
    temperature: float = field(default=0.05, metadata=_rng(lo=0.0, lo_open=True))  # logits = cosine / temperature


@dataclass
class TrainConfig:
    epochs: int = field(default=10, metadata=_rng(lo=1))
    max_steps: int = field(default=0, metadata=_rng(lo=0))    # 0 = run all epochs
    batch_size: int = field(default=128, metadata=_rng(lo=1))  # mean sequences per batch
    lr: float = field(default=1e-3, metadata=_rng(lo=0.0, lo_open=True))
    beta1: float = field(default=0.9, metadata=_rng(lo=0.0, hi=0.999999))   # AdamWeightDecay
    beta2: float = field(default=0.98, metadata=_rng(lo=0.0, hi=0.999999))  # AdamWeightDecay
    eps: float = field(default=1e-8, metadata=_rng(lo=0.0, lo_open=True))   # AdamWeightDecay
    weight_decay: float = field(default=0.0, metadata=_rng(lo=0.0))         # AdamWeightDecay
    # learning rate over the run (mindgr.train.schedule): constant, or a cosine decay from train.lr to
    # lr_floor * train.lr at the run's last step (train.epochs, or train.max_steps if that ends it first);
    # either after a linear warm-up of warmup_steps
    lr_schedule: str = field(default="constant", metadata=_rng(choices=["constant", "cosine"]))
    warmup_steps: int = field(default=0, metadata=_rng(lo=0))
    lr_floor: float = field(default=0.0, metadata=_rng(lo=0.0, hi=1.0))


@dataclass
class EvalConfig:
    every_epochs: int = field(default=1, metadata=_rng(lo=0))  # 0 = only at the end
    ks: list = field(default_factory=lambda: [1, 10, 50, 200])
    batch_size: int = field(default=256, metadata=_rng(lo=1))  # sequences per eval batch (mean)
    # true: the user's history items (other than the target) are removed from the ranking; false: not
    # (TIGER's protocol: a generated list is taken as it is)
    filter_history: bool = True
    # GR: the decode itself skips each user's history items (other than the target), as `mindgr serve`
    # does with exclude_history, so every list holds beam items new to the user (a filter after the search
    # leaves fewer); the ranking is then the filtered one
    exclude_history_in_search: bool = False
    beam: int = field(default=0, metadata=_rng(lo=0))          # GR beam width (>= max ks); 0 = max(ks)
    max_users: int = field(default=0, metadata=_rng(lo=0))     # GR validation during training: users decoded; 0 = all
    # GR test decode (the run's final one, and `mindgr eval` / `compare` by default): a fixed sample of this
    # many users; 0 = all (`mindgr train --quick` sets it so that a short run's test decode is short too)
    test_max_users: int = field(default=0, metadata=_rng(lo=0))
    # stop training after this many validations in a row without a new best (0 = train every epoch); the
    # test evaluation then uses the best checkpoint as always
    patience: int = field(default=0, metadata=_rng(lo=0))


@dataclass
class IdsConfig:
    """model.arch gr: the semantic-ID table (item -> codes). Exactly one of codes / from_run; the run
    directory keeps its own copy (RUN/ids/codes.parquet), which eval, serve and --resume use."""
    codes: str = ""                           # a codes.parquet written by `mindgr ids build`
    from_run: str = ""                        # a trained run: tokenise its item table at start
    checkpoint: str = field(default="best", metadata=_rng(choices=["best", "latest"]))  # from_run's checkpoint
    levels: int = field(default=3, metadata=_rng(lo=1))       # from_run: L residual k-means levels
    codes_per_level: int = field(default=256, metadata=_rng(lo=2))  # from_run: K
    seed: int = field(default=0, metadata=_rng(lo=0))         # from_run: k-means seed


@dataclass
class AlignConfig:
    """loss.objective grpo_sr: preference alignment of a trained GR run (GRPO with an NLL regulariser). The
    decoder starts from init_from's weights (its model section, data and code table must be this config's);
    each step decodes a group of candidates per prompt, rewards them with a reward model behind a relevance
    gate, and makes `inner_updates` optimizer updates on that rollout batch (train.batch_size prompts)."""
    init_from: str = ""                       # the trained GR run the policy starts from (and the KL reference)
    init_checkpoint: str = field(default="best", metadata=_rng(choices=["best", "latest"]))  # its checkpoint
    group_size: int = field(default=16, metadata=_rng(lo=2))  # G: candidates per prompt (beam search, unique items)
    inner_updates: int = field(default=2, metadata=_rng(lo=1, hi=16))  # optimizer updates per rollout batch
    clip_eps: float = field(default=0.2, metadata=_rng(lo=0.0, hi=1.0, lo_open=True))  # ratio clip 1 -/+ eps
    beta: float = field(default=0.04, metadata=_rng(lo=0.0))  # weight of the KL to the initial policy (k3)
    nll_weight: float = field(default=1.0, metadata=_rng(lo=0.0))  # lambda: weight of the NTP loss (0 = pure GRPO)
    # rho: weight of the group-relative policy term (0: no policy gradient, the KL and NLL terms alone: the
    # ablation that shows what the rollouts and the reward add)
    policy_weight: float = field(default=1.0, metadata=_rng(lo=0.0))
    # the NTP loss counts only the observed items whose value is at least this (e.g. 4: the movies the user
    # rated 4 or 5, the supervised term then imitates what users liked); 0 = every observed item
    nll_min_value: float = field(default=0.0, metadata=_rng(lo=0.0))
    reward_run: str = ""                      # the reward-model run that scores (history, item)
    reward_checkpoint: str = field(default="best", metadata=_rng(choices=["best", "latest"]))  # its checkpoint
    # the relevance gate: none (the plain reward) or first_code (the item shares its first code with one of the
    # user's last gate_recent items); consumed items are never rewarded either way
    gate: str = field(default="first_code", metadata=_rng(choices=["none", "first_code"]))
    gate_recent: int = field(default=10, metadata=_rng(lo=1))   # first_code: the user's last N items
    # rollouts never generate an item the user consumed (the search skips them; the group is G new items),
    # so the advantages rank new items only; false: consumed items are generated and get reward 0
    exclude_consumed: bool = True


@dataclass
class OpsConfig:
    backend: str = field(default="auto", metadata=_rng(choices=["auto", "reference", "cpu", "ascend"]))


@dataclass
class ParallelConfig:
    """Multi-process data parallel training (msrun); see docs/distributed.md. Every key may change on resume."""
    nproc: int = field(default=1, metadata=_rng(lo=1))       # processes `mindgr train` launches with msrun
    threads: int = field(default=0, metadata=_rng(lo=0))     # CPU compute threads per process; 0 = default
    bind_cores: bool = False                  # pin each rank's threads to its own share of the host's cores
    balance: str = field(default="cost", metadata=_rng(choices=["cost", "tokens", "random"]))  # how a global batch is split
    draws: str = field(default="global", metadata=_rng(choices=["global", "sequence"]))  # host negatives/masks
    # Who sums the dense gradients over the ranks (docs/distributed.md): own = one flat AllReduce of every
    # gradient and the loss (mindgr.parallel.dp.FlatSum); mindspore = MindSpore's DATA_PARALLEL mode and
    # nn.DistributedGradReducer, its AllReduces fused into parallel.grad_buckets buckets; host = every rank
    # on one x86-64 host adds the gradients through shared memory between two graphs (no collective);
    # auto = host when every rank is on one CPU host (measured fastest there), else mindspore (measured not
    # slower than own); own with parallel.sparse, whose executor keeps the flat sum
    grad_reduce: str = field(default="auto", metadata=_rng(choices=["auto", "own", "mindspore", "host"]))
    grad_buckets: int = field(default=1, metadata=_rng(lo=0, hi=64))  # mindspore: 0 = one AllReduce per parameter
    # One compiled graph per step (gradients, their sum, the update: the form in which MindSpore can overlap
    # the sum with the backward, on Ascend) instead of two (forward + backward, then sum + update: each
    # rank's wall compute time apart from the wait). On CPU level with two; two with grad_buckets > 1
    fused_step: bool = False
    calibrate: bool = True                    # fit cost_a/b/c0 by a timed probe at start; false = use them
    cost_a: float = field(default=0.0, metadata=_rng(lo=0.0))   # cost per token (c(L) = c0 + a*L + b*L^2)
    cost_b: float = field(default=0.0, metadata=_rng(lo=0.0))   # cost per attended pair
    cost_c0: float = field(default=0.0, metadata=_rng(lo=0.0))  # cost per sequence
    capacity_slack: float = field(default=0.01, metadata=_rng(lo=0.0, hi=1.0))  # per-rank capacity headroom
    timeout: float = field(default=300.0, metadata=_rng(lo=0.0, lo_open=True))  # s without progress -> exit
    node_timeout: int = field(default=30, metadata=_rng(lo=5))   # s before msrun's scheduler drops a dead rank
    cluster_timeout: int = field(default=120, metadata=_rng(lo=10))  # s to wait for every rank to join
    master_port: int = field(default=0, metadata=_rng(lo=0, hi=65535))  # 0 = pick a free port
    log_dir: str = ""                         # msrun logs; "" = RUN_DIR/msrun
    # Sharded item embeddings (docs/sparse.md). none: the table is replicated and its dense gradient
    # all-reduced; hierarchical: rows sharded over the local ranks of a node group, replicated across node
    # groups; flat: rows sharded over all ranks; frequency: the head of the id distribution as hierarchical,
    # the rest flat with a two-stage (node-deduplicated) exchange.
    sparse: str = field(default="none", metadata=_rng(choices=["none", "hierarchical", "flat", "frequency"]))
    nodes: int = field(default=0, metadata=_rng(lo=0))        # node groups; 0 = from msrun (nodes of the job)
    local_ranks: int = field(default=0, metadata=_rng(lo=0))  # ranks per node group; 0 = world / nodes
    staleness: int = field(default=1, metadata=_rng(lo=0, hi=16))  # tau: cross-node embedding update delay
    unique_capacity: int = field(default=0, metadata=_rng(lo=0))   # distinct ids per rank-step; 0 = derived
    sparse_update: str = field(default="lazy", metadata=_rng(choices=["lazy", "dense"]))  # rows Adam touches
    intra_gbps: float = field(default=600.0, metadata=_rng(lo=0.0, lo_open=True))  # GB/s inside a node
    inter_gbps: float = field(default=25.0, metadata=_rng(lo=0.0, lo_open=True))   # GB/s between nodes
    # A modelled inter-node link for process groups on one machine (mindgr.parallel.sparse.link): every
    # cross-node exchange of the hierarchical layout also takes link_latency_ms per cross-node message plus
    # its bytes over link_gbps (GB/s per node, shared by the node's ranks). 0 and 0 = off (a real link).
    link_latency_ms: float = field(default=0.0, metadata=_rng(lo=0.0, hi=10000.0))  # per cross-node message
    link_gbps: float = field(default=0.0, metadata=_rng(lo=0.0))  # GB/s leaving a node; 0 = no bandwidth term
    # frequency layout: rows replicated per node group; -1 = chosen by the byte model from the id statistics
    hot_rows: int = field(default=-1, metadata=_rng(lo=-1))
    # a row is replicated when that costs at most this much more inter-node bytes than fetching it
    hot_tolerance: float = field(default=0.05, metadata=_rng(lo=0.0))


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ids: IdsConfig = field(default_factory=IdsConfig)
    ops: OpsConfig = field(default_factory=OpsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    align: AlignConfig = field(default_factory=AlignConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Keys a resumed run (`train --resume`) may change: none of them changes what the weights so far were
# trained on. train.lr (and its schedule) may change, e.g. lowered after a divergence; epochs / max_steps
# extend or shorten the run (and stretch a schedule's horizon);
# logging, checkpointing, evaluation, op backend and input prefetch change how, not what, is trained;
# run.name / run.out_dir are where the run lives (a moved or copied run dir resumes). Every parallel.* key
# may change too (how many ranks train a global batch never changes what is trained).
RESUMABLE_CHANGES = frozenset({
    "train.epochs", "train.max_steps", "train.lr", "train.lr_schedule", "train.warmup_steps", "train.lr_floor",
    "run.name", "run.out_dir", "run.log_every", "run.keep_last", "run.ckpt_every",
    "eval.every_epochs", "eval.ks", "eval.batch_size", "eval.filter_history",
    "eval.exclude_history_in_search", "eval.beam", "eval.max_users",
    "eval.test_max_users",
    "eval.patience", "ops.backend", "data.prefetch"})


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value, tp):
    """Check `value` against the declared type; ints are accepted for floats, nothing else is converted."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):  # a NaN passes every range check and poisons the run
                raise ConfigError(f"config: {key} = {value!r}: expected a finite number")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif tp is list:
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        raise ConfigError(f"config: {key} = {value!r}: expected a list of integers")
    raise ConfigError(f"config: {key} = {value!r}: expected {_type_name(tp)}")


def _check_range(key: str, value, meta: dict):
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"config: {key} = {value!r}: expected one of {', '.join(choices)}")
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
        rel = ">" if meta.get("lo_open") else ">="
        bound = f"{rel} {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise ConfigError(f"config: {key} = {value!r}: expected a value {bound}")
    if hi is not None and value > hi:
        raise ConfigError(f"config: {key} = {value!r}: expected a value <= {hi}")


def _apply(obj, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"config: {prefix.rstrip('.') or '<top>'} = {data!r}: expected a mapping")
    hints = typing.get_type_hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for name, value in data.items():
        key = prefix + str(name)
        if name not in fields:
            raise ConfigError(f"config: unknown key '{key}' (allowed: {', '.join(fields)})")
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            _apply(getattr(obj, name), value, key + ".")
            continue
        value = _coerce(key, value, tp)
        _check_range(key, value, fields[name].metadata)
        setattr(obj, name, value)


def _nest(dotted: str, value) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _merge(dst: dict, src: dict):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def parse_override(text: str) -> dict:
    """`model.dim=64` -> {"model": {"dim": 64}}; the value is read as YAML (so 1e-3, true, [1,10] work)."""
    if "=" not in text:
        raise ConfigError(f"config: override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or "." not in key:
        raise ConfigError(f"config: override {text!r}: expected section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return _nest(key, value)


def _check_run_name(name: str):
    """A run lives in out_dir/name: an empty, absolute or `..` name would write somewhere else."""
    parts = Path(name).parts
    if not name.strip() or not parts:
        raise ConfigError(f"config: run.name = {name!r}: expected a non-empty name")
    if Path(name).is_absolute():
        raise ConfigError(f"config: run.name = {name!r}: expected a name relative to run.out_dir, not an absolute path")
    if ".." in parts:
        raise ConfigError(f"config: run.name = {name!r}: '..' would put the run outside run.out_dir")


def _validate_pages(d):
    """Where pages come from (data.pages, synthetic.page_size, csv.page_column): one source, with times."""
    paged_synthetic = d.synthetic.page_size > 0
    if paged_synthetic and d.kind != "synthetic":
        raise ConfigError(f"config: data.synthetic.page_size = {d.synthetic.page_size:g}: only for data.kind "
                          f"synthetic, not {d.kind} (data.pages=timestamps makes pages from equal times)")
    if d.pages == "timestamps":
        if d.kind == "sequences":
            raise ConfigError("config: data.pages = timestamps: data.kind sequences has no timestamps")
        if d.kind == "synthetic" and paged_synthetic:
            raise ConfigError("config: data.pages = timestamps and data.synthetic.page_size > 0: pages from "
                              "one source only (set data.pages='' to keep the generator's pages)")
        if d.kind == "csv" and d.csv.page_column != "":
            raise ConfigError(f"config: data.pages = timestamps and data.csv.page_column = {d.csv.page_column!r}: "
                              "pages from one source only")
        if d.kind == "csv" and d.csv.time_column == "":
            raise ConfigError("config: data.pages = timestamps needs times: data.csv.time_column is ''")
    if d.holdout_unit == "page" and not d.pages:
        no_pages = ((d.kind == "synthetic" and not paged_synthetic) or (d.kind == "csv" and d.csv.page_column == "")
                    or d.kind not in ("synthetic", "csv", "store"))
        if no_pages:
            raise ConfigError(f"config: data.holdout_unit = page needs pages: data.kind {d.kind} has none here "
                              "(set data.pages=timestamps, data.synthetic.page_size or data.csv.page_column)")


def _validate_cross(cfg: Config):
    _check_run_name(cfg.run.name)
    m = cfg.model
    for name in ("dqk", "dv"):
        if getattr(m, name) == 0 and m.dim % m.num_heads:
            raise ConfigError(f"config: model.{name} = 0 derives dim/num_heads, but model.dim = {m.dim} "
                              f"is not divisible by model.num_heads = {m.num_heads}: set model.{name}")
    if m.backbone != "hstu":          # (which model kinds take a backbone: models.objectives.check_objective_arch)
        if cfg.data.gr_layout == "tree":
            raise ConfigError(f"config: data.gr_layout = tree needs model.backbone = hstu (its virtual rows "
                              f"are HSTU attention rows); use data.gr_layout = rows with model.backbone = {m.backbone}")
    if cfg.data.kind != "synthetic" and not cfg.data.path:
        raise ConfigError(f"config: data.path = '': data.kind = {cfg.data.kind} needs a source path")
    if cfg.data.timestamps and cfg.data.kind != "movielens-1m":
        raise ConfigError(f"config: data.timestamps = {cfg.data.timestamps!r}: only for data.kind movielens-1m "
                          f"(times for sequences.txt), not {cfg.data.kind}")
    _validate_pages(cfg.data)
    if cfg.data.synthetic.values and cfg.data.kind != "synthetic":
        raise ConfigError(f"config: data.synthetic.values = true: only for data.kind synthetic, not {cfg.data.kind} "
                          "(a ratings file keeps its ratings; csv: data.csv.value_column)")
    if cfg.data.token_capacity and cfg.data.token_capacity < cfg.data.max_len:
        raise ConfigError(f"config: data.token_capacity = {cfg.data.token_capacity}: expected 0 (auto) "
                          f"or >= data.max_len = {cfg.data.max_len}")
    p = cfg.parallel
    if p.nproc > 1 and not p.calibrate and p.cost_a == 0 and p.cost_b == 0 and p.cost_c0 == 0:
        raise ConfigError("config: parallel.calibrate = false needs a cost model: set parallel.cost_a and/or "
                          "parallel.cost_b (> 0), or parallel.calibrate=true")
    if p.sparse != "none":
        if p.nodes and p.local_ranks and p.nproc > 1 and p.nodes * p.local_ranks != p.nproc:
            raise ConfigError(f"config: parallel.nodes x parallel.local_ranks = {p.nodes} x {p.local_ranks} "
                              f"!= parallel.nproc = {p.nproc}")
        if p.nodes and p.nproc > 1 and p.nproc % p.nodes:
            raise ConfigError(f"config: parallel.nodes = {p.nodes} does not divide parallel.nproc = {p.nproc}")
        if p.grad_reduce in ("mindspore", "host"):
            raise ConfigError(f"config: parallel.sparse = {p.sparse} sums its dense gradients with the flat "
                              f"AllReduce: use parallel.grad_reduce=auto or own (not {p.grad_reduce})")
        if cfg.loss.negatives not in ("per_token", "shared_pool"):
            raise ConfigError(f"config: parallel.sparse = {p.sparse} needs loss.negatives = per_token or "
                              f"shared_pool (not {cfg.loss.negatives})")
        if cfg.loss.negatives == "shared_pool" and cfg.loss.sampling != "uniform":
            # the frequency layout's cut and the byte model count a uniform pool
            raise ConfigError(f"config: parallel.sparse = {p.sparse} with loss.negatives = shared_pool needs "
                              f"loss.sampling = uniform (not {cfg.loss.sampling})")
    if (p.link_latency_ms or p.link_gbps) and p.sparse != "hierarchical":
        raise ConfigError(f"config: parallel.link_latency_ms / link_gbps model the cross-node exchange of "
                          f"parallel.sparse = hierarchical, not {p.sparse}; set them to 0")
    if not cfg.eval.ks or min(cfg.eval.ks) < 1:
        raise ConfigError(f"config: eval.ks = {cfg.eval.ks!r}: expected a non-empty list of integers >= 1")
    if cfg.eval.beam and cfg.eval.beam < max(cfg.eval.ks):
        raise ConfigError(f"config: eval.beam = {cfg.eval.beam}: the beam must be >= the longest list, "
                          f"max(eval.ks) = {max(cfg.eval.ks)}")
    if cfg.ids.codes and cfg.ids.from_run:
        raise ConfigError("config: ids.codes and ids.from_run are both set: give one source of semantic IDs")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a config that hides a typo or a stale value."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"config: {self.name}:{key_node.start_mark.line + 1}: duplicate key '{key}' "
                                  f"(first on line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_yaml(path) -> object:
    """A YAML file's content, refusing duplicate keys; every failure is a one-line ConfigError naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config: {path}: is a directory, expected a YAML file")
    if not p.is_file():
        raise ConfigError(f"config: file not found: {path}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"config: {path}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"config: {path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") \
            from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _read_mapping(path) -> dict:
    """One config file's own keys (its `base:` still in them); one-line ConfigErrors for bad files."""
    try:
        loaded = read_yaml(path)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"config: {path}{where}: not valid YAML") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config: {path}: expected a mapping of sections at the top level")
    return loaded


def read_config_file(path, _chain: tuple = ()) -> dict:
    """A config file's keys with its `base:` chain resolved: the base (a path relative to this file) is read
    first, recursively, and this file's keys override it section by section (a list or value is replaced
    whole). A missing base or a cycle is a one-line ConfigError naming the chain."""
    own = _read_mapping(path)
    chain = _chain + (Path(path).resolve(),)
    if "base" not in own:
        return own
    base = own.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"config: {path}: base = {base!r}: expected the path of a config file, relative to this one")
    base_path = Path(path).parent / base
    names = " -> ".join(str(p.name) for p in chain)
    if base_path.resolve() in chain:
        raise ConfigError(f"config: {path}: base {base!r} makes a cycle: {names} -> {base_path.name}")
    if not base_path.is_file():
        raise ConfigError(f"config: {path}: base {base!r} not found (looked for {base_path})")
    data = read_config_file(base_path, chain)
    _merge(data, own)
    return data


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or the defaults) with its `base:` chain, apply overrides, validate.
    Raises ConfigError."""
    data: dict = read_config_file(path) if path else {}
    for text in overrides or []:
        _merge(data, parse_override(text))
    cfg = Config()
    _apply(cfg, data, "")
    _validate_cross(cfg)
    return cfg


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def config_from_dict(data: dict) -> Config:
    cfg = Config()
    _apply(cfg, data, "")
    _validate_cross(cfg)
    return cfg
