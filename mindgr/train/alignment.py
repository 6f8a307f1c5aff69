"""Preference alignment of a trained GR run: GRPO-SR (`loss.objective: grpo_sr`), a task of the one loop.

GenRec's recipe, as built here: the policy is the GR decoder of a trained run (`align.init_from`; its
weights are also the frozen reference of the KL term). A step of the loop is one rollout batch of
train.batch_size prompts (a user's training history up to a cut point: all but the window's last item,
or its last page under page_ntp):
1. rollouts (mindgr.train.rollout): G = align.group_size distinct valid items per prompt by trie-constrained
   beam search under the current policy; their log-probs under it (old) and under the reference;
2. the hybrid reward (mindgr.train.reward_gate): RM(history, item) of the reward run (`align.reward_run`,
   mindgr.train.reward's scorer), times the relevance gate (`align.gate`), 0 for consumed items; advantages
   normalised within each prompt's group;
3. `align.inner_updates` optimizer updates of the GRPO-SR loss (mindgr.models.grpo) on that batch: the
   clipped ratio surrogate, beta * KL(current || reference) (k3 estimator) and lambda * the NTP loss of the
   prompts' users, computed on the GR run's own training rows (ntp or page_ntp, as it was trained).
No dropout in the RL step (the ratio compares the same network's deterministic log-probs).

The decoder's architecture, the data and the code table are those of the initial run (checked in one
line); the run directory, checkpoints (the same parameter names as a GR run's, so eval / serve / export
load an aligned run as a GR run), resume, divergence checks, evaluation by beam search and `best` are the
loop's and the GR task's. A window of the log adds: mean reward (after the gate), mean RM score, the
gated-out fraction of the candidates, KL, NLL, clip fraction, rollout items/s.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mindgr.config import Config, ConfigError
from mindgr.train.checkpoint import CheckpointError, file_sha256
from mindgr.train.generative import (CODES_FILE, GenerativeTask, _table_from_file, check_codes_catalogue,
                                     check_codes_fingerprint, gr_train_data)
from mindgr.train.loop import TrainLoop

DECODER_PREFIX = "loss_net.decoder."      # the GR decoder's parameters in a GR (or aligned) run's checkpoint
NLL_OBJECTIVES = ("ntp", "page_ntp")
# data keys that may differ from the initial run's: how batches are formed, not what the data is
_DATA_FREE = ("prefetch", "token_capacity", "row_capacity", "gr_layout")


def _diff(a: dict, b: dict, prefix: str, skip=()) -> str | None:
    for key in sorted(set(a) | set(b)):
        if key in skip:
            continue
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            d = _diff(a[key], b[key], f"{prefix}{key}.", ())
            if d:
                return d
        elif a.get(key) != b.get(key):
            return f"{prefix}{key} = {b.get(key)!r}, the initial run has {a.get(key)!r}"
    return None


def init_run_config(cfg: Config) -> Config:
    """The config of align.init_from (a one-line ConfigError when it is not a GR run)."""
    from mindgr.train.rundir import run_config
    src = cfg.align.init_from
    if not src:
        raise ConfigError("config: loss.objective = grpo_sr needs align.init_from: the trained GR run to align")
    try:
        init = run_config(Path(src))
    except CheckpointError as e:
        raise ConfigError(f"config: align.init_from = {src}: {e}") from None
    if init.loss.objective not in NLL_OBJECTIVES:
        raise ConfigError(f"config: align.init_from = {src}: a run of loss.objective {init.loss.objective}; "
                          f"GRPO-SR starts from a GR run trained by {' or '.join(NLL_OBJECTIVES)}")
    return init


def init_checkpoint(cfg: Config) -> Path:
    from mindgr.train.rundir import saved_checkpoint
    init = init_run_config(cfg)
    try:
        return saved_checkpoint(Path(cfg.align.init_from), init, cfg.align.init_checkpoint)
    except CheckpointError as e:
        raise ConfigError(f"config: align.init_from: {e}") from None


def restore_decoder(decoder, tensors: dict, where: str):
    """Copy a GR checkpoint's decoder weights (DECODER_PREFIX) into `decoder`."""
    from mindgr.train.checkpoint import restore_parameters
    own = {k[len(DECODER_PREFIX):]: v for k, v in tensors.items() if k.startswith(DECODER_PREFIX)}
    restore_parameters(decoder, own, where)


def reward_scorer(cfg: Config, num_items: int | None = None):
    """The scorer (mindgr.train.reward.RewardScorer) of the reward run align.reward_run, checked against the
    catalogue (num_items)."""
    a = cfg.align
    if not a.reward_run:
        raise ConfigError("config: loss.objective = grpo_sr needs align.reward_run: a reward-model run "
                          "(loss.objective = rating) that scores (history, item)")
    try:
        from mindgr.train.reward import load_reward_scorer
    except ImportError:
        raise ConfigError("config: align.reward_run: this version of mindgr has no reward-model runs "
                          "(mindgr.train.reward)") from None
    try:
        scorer = load_reward_scorer(a.reward_run, a.reward_checkpoint, setup=False)
    except CheckpointError as e:
        raise ConfigError(f"config: align.reward_run: {e}") from None
    if num_items is not None and scorer.num_items != num_items:
        raise ConfigError(f"config: align.reward_run = {a.reward_run}: a reward model of {scorer.num_items} items, "
                          f"the data has {num_items} (another catalogue?)")
    if scorer.uses_times:
        raise ConfigError(f"config: align.reward_run = {a.reward_run}: a reward model with a time bias "
                          "(model.time_bias); GRPO-SR scores histories without times: train it with time_bias false")
    return scorer


@dataclass
class AlignExamples:
    """What the executor and the plan see: each example's tokens in a rollout batch, the capacities."""
    lengths: np.ndarray
    token_capacity: int
    row_capacity: int


@dataclass
class AlignInputs:
    """A rollout batch's host inputs (prepared in the input thread): the prompts' histories (everything the
    user consumed before the cut, item ids) and the NLL rows of their training windows."""
    histories: list
    values: list | None      # the value of every history item (data with values), else None
    nll_rows: list


class AlignModel:
    """Policy decoder (initialised from the initial run), its frozen reference, the GRPO-SR loss, optimizer,
    the compiled update (train_step, named as a GR run's) and the rollout cells."""

    def __init__(self, cfg: Config, trie, codes: np.ndarray, num_items: int, shape, init_path: Path):
        from mindgr.models.generative import build_decoder, max_prompt_tokens
        from mindgr.models.grpo import AlignStep, GRPOLoss
        from mindgr.train.checkpoint import load_checkpoint
        from mindgr.train.rollout import Rollout
        from mindgr.train.step import build_optimizer
        sizes = [int(s) for s in trie.level_sizes]
        tensors, _ = load_checkpoint(init_path)
        self.decoder = build_decoder(cfg.model, sizes, cfg.data.max_len, cfg.run.seed, num_items)
        self.reference = build_decoder(cfg.model, sizes, cfg.data.max_len, cfg.run.seed, num_items)
        for dec in (self.decoder, self.reference):
            restore_decoder(dec, tensors, str(init_path))
        self.reference.set_train(False)
        self.encoder = self.decoder          # the executor's name for the trained network
        a = cfg.align
        self.loss_net = GRPOLoss(self.decoder, shape.candidates, a.clip_eps, a.beta, a.nll_weight,
                                 a.policy_weight)
        self.optimizer = build_optimizer(self.decoder.trainable_params(), cfg.train)
        self.train_step = AlignStep(self.loss_net, self.optimizer)
        p_cap = max_prompt_tokens(len(sizes), cfg.model.token_merger, cfg.data.max_len)
        self.rollout = Rollout(self.decoder, self.reference, trie, codes, shape, p_cap, a.exclude_consumed)


def _new_window() -> dict:
    return {"n": 0, "updates": 0, "reward": 0.0, "rm": 0.0, "gated": 0.0, "kl": 0.0, "nll": 0.0, "clip": 0.0,
            "surrogate": 0.0, "items": 0, "generate_s": 0.0, "score_s": 0.0, "reward_s": 0.0, "update_s": 0.0}


class AlignmentTask(GenerativeTask):
    """GRPO-SR of a trained GR run (module docstring). `reward`: score(histories, items) -> [U, G] float32;
    None = the scorer of align.reward_run."""

    name = "alignment"
    eval_apart = False                   # its step is AlignStep, and its rollouts decode between steps

    def __init__(self, cfg: Config, reward=None):
        super().__init__(cfg)
        self.reward = reward
        self.scorer = None
        self.window = _new_window()
        self.timing = _new_window()          # totals of the run (benchmarks read them)

    # ---- config ---------------------------------------------------------------------------------
    def check_config(self, executor: str):
        super().check_config(executor)
        c, a = self.cfg, self.cfg.align
        if executor != "local":
            raise ConfigError("config: loss.objective = grpo_sr trains in one process (parallel.nproc = 1)")
        if c.model.trie_softmax:
            raise ConfigError("config: loss.objective = grpo_sr does not support model.trie_softmax yet")
        if c.data.gr_layout != "rows":
            raise ConfigError("config: loss.objective = grpo_sr packs copied rows: set data.gr_layout = rows")
        init = init_run_config(c)
        d = _diff(_asdict(init.model), _asdict(c.model), "model.")
        if d:
            raise ConfigError(f"config: align.init_from: the decoder must be the initial run's: {d}")
        d = _diff(_asdict(init.data), _asdict(c.data), "data.", _DATA_FREE)
        if d:
            raise ConfigError(f"config: align.init_from: the data must be the initial run's: {d}")
        if self.reward is None and not a.reward_run:
            reward_scorer(c)                # the one-line error for a missing reward run
        self.nll_objective = init.loss.objective

    # ---- data -----------------------------------------------------------------------------------
    def load(self, run_dir, resuming: bool):
        from mindgr.ids.trie import PrefixTrie
        from mindgr.models.generative import max_prompt_tokens
        from mindgr.models.ntp import tokens_per_prompt_item
        from mindgr.train.rollout import prompt_cut, rollout_costs, rollout_shape
        from mindgr.train.task import RetrievalTask
        from mindgr.datasets import EpochPlan
        cfg, a = self.cfg, self.cfg.align
        self.nll_objective = init_run_config(cfg).loss.objective
        self.task = RetrievalTask(cfg, check_negatives=False)
        self.task.load()
        self.data = self.task.data
        init_dir = Path(a.init_from)
        if resuming:                         # its own table, and the reference it started from unchanged
            check_codes_fingerprint(run_dir)
            self.codes = _table_from_file(Path(run_dir) / CODES_FILE)
            self._check_reference(run_dir)
        else:
            try:
                check_codes_fingerprint(init_dir)
            except CheckpointError as e:
                raise ConfigError(f"config: align.init_from: {e}") from None
            self.codes = _table_from_file(init_dir / CODES_FILE)
        check_codes_catalogue(self.codes, self.data.store)
        self.trie = PrefixTrie(self.codes.codes, self.codes.level_sizes)
        if a.group_size > self.data.num_items:
            raise ConfigError(f"config: align.group_size = {a.group_size} is larger than the catalogue "
                              f"({self.data.num_items} items)")
        nll_cfg = replace(cfg, loss=replace(cfg.loss, objective=self.nll_objective))
        self.train = gr_train_data(nll_cfg, self.data, self.codes, self.trie)
        gd, split, lt = self.train, self.data.split, len(self.codes.level_sizes)
        per = tokens_per_prompt_item(lt, cfg.model.token_merger)
        p_cap = max_prompt_tokens(lt, cfg.model.token_merger, cfg.data.max_len)
        train_values = getattr(split, "train_values", None)
        if a.nll_min_value and train_values is None:
            raise ConfigError(f"config: align.nll_min_value = {a.nll_min_value} needs data with values (a rating "
                              "per interaction) and this data has none")
        self.histories, self.values, prompt_tokens = [], [] if train_values is not None else None, []
        self.window_values = []              # the value of every item of each example's window (data with values)
        for k, i in enumerate(gd.example_ids):
            window = gd.windows[k]
            cut = prompt_cut(window, None if gd.pages is None else gd.pages[k])
            full = np.asarray(split.train[i], np.int64)
            self.histories.append(full[: len(full) - (len(window) - cut)])   # all the user had before the cut
            if self.values is not None:
                self.values.append(np.asarray(train_values[i], np.float32)[: len(self.histories[-1])])
                self.window_values.append(np.asarray(train_values[i], np.float32)[len(full) - len(window):])
            prompt_tokens.append(min(cut * per, (p_cap // per) * per))
        if a.nll_min_value and not any((w[1:] >= a.nll_min_value).any() for w in self.window_values):
            top = max(float(w.max()) for w in self.window_values)
            raise ConfigError(f"config: align.nll_min_value = {a.nll_min_value} keeps no observed item in the NLL "
                              f"term (the training values reach {top:g})")
        nll_tokens = np.array([sum(c) for c in gd.row_counts], np.int64)
        costs = rollout_costs(np.array(prompt_tokens), nll_tokens, a.group_size, lt)
        try:
            self.shape = rollout_shape(costs, np.array([len(c) for c in gd.row_counts]), cfg.train.batch_size,
                                       a.group_size, cfg.data.token_capacity)
        except ValueError as e:
            raise ConfigError(f"config: {e}") from None
        self.prompt_tokens = np.array(prompt_tokens, np.int64)
        self._examples = AlignExamples(costs, self.shape.token_capacity, self.shape.row_capacity)
        self.plan = EpochPlan(costs, self.shape.token_capacity, self.shape.prompts, seed=cfg.run.seed)
        return self.plan

    def describe(self) -> str:
        d, sh = self.data, self.shape
        return (f"{d.store.num_users} users, {d.num_items} items, {len(self.histories)} prompts, groups of "
                f"{sh.group}, rollout batches of at most {sh.prompts} prompts, capacity {sh.token_capacity} tokens "
                f"x {sh.row_capacity} rows, {self.plan.num_batches(0)} batches/epoch ({self.task.load_s:.1f}s)")

    @property
    def examples(self):
        return self._examples

    def example_weights(self):
        return None

    def _reference_record(self) -> dict:
        path = init_checkpoint(self.cfg)
        return {"init_from": str(self.cfg.align.init_from), "checkpoint": path.name,
                "sidecar_sha256": file_sha256(path.with_suffix(".json"))}

    def _check_reference(self, run_dir):
        from mindgr.train.data import FINGERPRINT_FILE
        fp = Path(run_dir) / FINGERPRINT_FILE
        saved = json.loads(fp.read_text()).get("align") if fp.is_file() else None
        now = self._reference_record()
        if saved and saved.get("sidecar_sha256") != now["sidecar_sha256"]:
            raise CheckpointError(f"--resume: the initial run's checkpoint {now['checkpoint']} changed since this "
                                  "run started (its KL reference and starting point would differ)")

    def on_run_dir(self, run_dir, fresh: bool):
        super().on_run_dir(run_dir, fresh)
        if not fresh:
            return
        from mindgr.paths import write_json_atomic
        from mindgr.train.data import FINGERPRINT_FILE
        fp_path = Path(run_dir) / FINGERPRINT_FILE
        fp = json.loads(fp_path.read_text())
        fp["align"] = self._reference_record()
        write_json_atomic(fp_path, fp)

    # ---- model and steps ------------------------------------------------------------------------
    def build_model(self, log):
        self.log = log
        self.scorer = None
        if self.reward is None:
            self.scorer = reward_scorer(self.cfg, self.data.num_items)
            if self.scorer.uses_values and self.values is None:
                raise ConfigError(f"config: align.reward_run = {self.cfg.align.reward_run}: its reward model reads "
                                  "the history's values (model.value_input) and this data has none")
        path = init_checkpoint(self.cfg)
        self.model = AlignModel(self.cfg, self.trie, self.codes.codes, self.data.num_items, self.shape, path)
        a = self.cfg.align
        log.info(f"GRPO-SR from {a.init_from} ({path.name}, NLL: its {self.nll_objective}); groups of "
                 f"{a.group_size}, {a.inner_updates} updates per rollout batch, clip {a.clip_eps}, beta {a.beta}, "
                 f"lambda {a.nll_weight}, gate {a.gate}; reward {a.reward_run or 'given by the caller'}")
        return self.model

    def inputs(self, epoch: int, b: int, indices):
        indices = [int(i) for i in indices]
        rows = [r for i in indices for r in self._nll_rows(i)]
        lt = len(self.codes.level_sizes)
        lengths = np.concatenate([np.repeat(self.prompt_tokens[indices] + lt - 1, self.shape.group),
                                  np.array([r["slots"].shape[0] for r in rows], np.int64)])
        n = int(lengths.sum())
        info = {"tokens": n, "fill": n / self.shape.token_capacity, "lengths": lengths}
        values = None if self.values is None else [self.values[i] for i in indices]
        return AlignInputs([self.histories[i] for i in indices], values, rows), info

    def _nll_rows(self, i: int) -> list:
        """Example i's NLL rows; with align.nll_min_value, the targets valued below it weigh 0."""
        floor = self.cfg.align.nll_min_value
        if not floor:
            return self.train.rows(i)
        return self.train.rows(i, target_weights=self.window_values[i] >= floor)

    def rank_inputs(self, epoch, b, indices, share, shape):
        raise NotImplementedError("GRPO-SR trains in one process")

    def rewards(self, histories, items: np.ndarray, values=None):
        """(hybrid reward r [U, G], RM score [U, G], gate open [U, G]) of generated items (dead beams, item 0,
        are scored as the first candidate and never rewarded)."""
        from mindgr.train.reward_gate import gate_mask, hybrid_reward
        a = self.cfg.align
        scored = np.where(items > 0, items, items[:, :1])
        if self.scorer is not None:
            rm = self.scorer.score(histories, scored, values if self.scorer.uses_values else None)
        else:
            rm = self.reward(histories, scored)
        rm = np.asarray(rm, np.float32)
        if rm.shape != items.shape:
            raise ValueError(f"the reward model returned shape {rm.shape} for {items.shape} candidates")
        keep = gate_mask(a.gate, histories, items, self.codes.codes, a.gate_recent)
        return hybrid_reward(rm, keep), rm, keep

    def train_step(self, model, inputs: AlignInputs) -> float:
        """Rollouts, rewards, then align.inner_updates updates -> the mean loss of the updates."""
        from mindspore import Tensor
        from mindgr.train.reward_gate import group_advantages
        from mindgr.train.rollout import batch_tensors
        sh, a = self.shape, self.cfg.align
        model.decoder.set_train(False)
        roll = model.rollout.run(inputs.histories, inputs.nll_rows)
        p = len(inputs.histories)
        items = roll.items[:p]
        t0 = time.perf_counter()
        r, rm, keep = self.rewards(inputs.histories, items, inputs.values)
        adv = np.zeros(sh.candidates, np.float32)
        adv[: p * sh.group] = group_advantages(r).reshape(-1)
        t1 = time.perf_counter()
        model.decoder.set_train(True)
        tensors = batch_tensors(roll.arrays) + [Tensor(roll.old_logp), Tensor(roll.ref_logp), Tensor(adv),
                                                Tensor(roll.cand_w)]
        figures = np.zeros(5)
        for _ in range(a.inner_updates):
            out = model.train_step(*tensors)
            figures += [float(x.asnumpy()) for x in out]
        t2 = time.perf_counter()
        real = items > 0
        for w in (self.window, self.timing):
            w["n"] += 1
            w["updates"] += a.inner_updates
            w["reward"] += float(r[real].mean())
            w["rm"] += float(rm[real].mean())
            w["gated"] += float(1.0 - keep[real].mean())
            w["surrogate"] += figures[1] / a.inner_updates
            w["kl"] += figures[2] / a.inner_updates
            w["nll"] += figures[3] / a.inner_updates
            w["clip"] += figures[4] / a.inner_updates
            w["items"] += int(real.sum())
            w["generate_s"] += roll.generate_s
            w["score_s"] += roll.score_s
            w["reward_s"] += t1 - t0
            w["update_s"] += t2 - t1
        return float(figures[0] / a.inner_updates)

    def window_extra(self) -> tuple[dict, str]:
        w = self.window
        if not w["n"]:
            return {}, ""
        n = w["n"]
        rec = {"reward": w["reward"] / n, "rm_score": w["rm"] / n, "gated_fraction": w["gated"] / n,
               "kl": w["kl"] / n, "nll": w["nll"] / n, "clip_fraction": w["clip"] / n,
               "rollout_items_per_s": w["items"] / w["generate_s"] if w["generate_s"] else 0.0,
               "update_s": w["update_s"] / w["updates"]}
        self.window = _new_window()
        return rec, (f" | reward {rec['reward']:.4f} rm {rec['rm_score']:.4f} gated {rec['gated_fraction']:.2f} "
                     f"kl {rec['kl']:.4f} nll {rec['nll']:.4f} clip {rec['clip_fraction']:.3f} rollout "
                     f"{rec['rollout_items_per_s']:.0f} items/s")

    def flops(self, info: dict) -> float:
        """The decoder's FLOPs of a step's teacher-forced passes (old and reference log-probs, and forward +
        backward per update) over the rollout batch; the beam search itself is not counted."""
        from mindgr.models import model_spec
        from mindgr.models.objectives import objective_spec
        fwd = model_spec(self.cfg.model.arch).encoder_flops(self.cfg.model, info["lengths"])
        fwd += objective_spec("ntp").flops(self.cfg.model, info["tokens"], self.model.decoder.num_codes)
        return (2.0 + 3.0 * self.cfg.align.inner_updates) * fwd


def _asdict(section) -> dict:
    import dataclasses
    return dataclasses.asdict(section)


class AlignmentTrainer(TrainLoop):
    """The training loop with the alignment task on the local executor; reward: see AlignmentTask."""

    def __init__(self, cfg: Config, resume: bool = False, quiet: bool = False, reward=None):
        from mindgr.train.local import LocalExecutor
        super().__init__(cfg, LocalExecutor(cfg, AlignmentTask(cfg, reward)), resume, quiet)
