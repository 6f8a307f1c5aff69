"""GRPO-SR rollouts: a group of G candidates per prompt from the policy, and their log-probabilities.

Generation is trie-constrained beam search through the decoding engine (mindgr.generate.engine) with beam
width = list length = G: the G best code tuples under the current policy, each a valid item and all
distinct (as open GRPO-for-recommendation recipes do, instead of sampling, which repeats items); with
`align.exclude_consumed` the search skips the items the user already consumed, so every candidate is new. Beam
search is deterministic, so a resumed run regenerates exactly what an uninterrupted one did.

The log-probabilities of the generated items come from a jagged teacher-forced pass over their code tuples
(mindgr.models.grpo: one row per candidate, prompt + its codes 0..Lt-2), packed together with the prompts'
NLL rows into one batch of fixed capacities (`RolloutShape`): one compiled graph for the policy's pass, one
for the frozen reference's, one for the update. The old-policy log-probs are recorded at rollout time (the
ratio's denominator over the inner updates), the reference's for the KL.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from mindgr.models.grpo import ROLLOUT_KEYS
from mindgr.models.ntp import _row, page_groups


@dataclass(frozen=True)
class RolloutShape:
    prompts: int             # P: prompts (groups) of a rollout batch at most
    group: int               # G: candidates per prompt
    token_capacity: int      # T_cap of the packed batch (rollout rows + NLL rows)
    row_capacity: int        # B_cap

    @property
    def candidates(self) -> int:
        return self.prompts * self.group


def prompt_cut(window: np.ndarray, pages=None) -> int:
    """Items of an example's window that form its prompt: all but the last item (point-wise), or all but
    the last page (page-wise); the rest is the observed next item(s)."""
    if pages is None:
        return len(window) - 1
    return page_groups(pages)[-1][0]


def rollout_costs(prompt_tokens: np.ndarray, nll_tokens: np.ndarray, group: int, num_levels: int) -> np.ndarray:
    """Tokens each example adds to a rollout batch: G rows of (its prompt + Lt - 1 codes) and its NLL rows."""
    return group * (np.asarray(prompt_tokens, np.int64) + num_levels - 1) + np.asarray(nll_tokens, np.int64)


def rollout_shape(costs: np.ndarray, nll_rows: np.ndarray, prompts: int, group: int, token_capacity: int = 0
                  ) -> RolloutShape:
    """Fixed capacities for batches of at most `prompts` examples and T_cap tokens (token_capacity, or about
    `prompts` examples' mean cost, at least the largest example's)."""
    t_cap = token_capacity or int(math.ceil(max(prompts * costs.mean(), costs.max()) / 64) * 64)
    if costs.max() > t_cap:
        raise ValueError(f"data.token_capacity = {t_cap}: an example needs {int(costs.max())} tokens in a rollout "
                         f"batch (G = {group}); use at least that (or 0 = auto)")
    most_rows = int(np.sort(np.asarray(nll_rows, np.int64))[::-1][:prompts].sum())
    return RolloutShape(prompts, group, t_cap, prompts * group + most_rows)


def candidate_rows(prompt, items, codes: np.ndarray, level_offsets, group: int, pad_id: int, first: int) -> list:
    """Rows of one prompt's candidates: prompt + codes 0..Lt-2 of the item; the target positions carry the
    candidate's index (`first` + i), the NLL weight is 0."""
    p_slots, p_merged = prompt
    lt = codes.shape[1]
    rows = []
    for i, item in enumerate(np.asarray(items, np.int64)):
        gids = (codes[item].astype(np.int64) + np.asarray(level_offsets[:-1])).astype(np.int32)
        r = _row(p_slots, p_merged, gids, np.arange(lt, dtype=np.int32), group, pad_id, 1.0)
        r["cand"] = np.where(r["weight"] > 0, first + i, -1).astype(np.int32)
        r["weight"] = np.zeros_like(r["weight"])
        rows.append(r)
    return rows


def pack_rollout(rows: list, shape: RolloutShape, group: int, pad_id: int) -> dict:
    """Rows (candidate rows and NLL rows) -> the fixed-capacity arrays of ROLLOUT_KEYS; tokens of no
    candidate carry cand = C (the spare slot)."""
    c = shape.candidates
    lengths = [r["slots"].shape[0] for r in rows]
    n = sum(lengths)
    if n > shape.token_capacity or len(rows) > shape.row_capacity:
        raise AssertionError(f"a rollout batch of {len(rows)} rows, {n} tokens exceeds its capacities "
                             f"({shape.row_capacity}, {shape.token_capacity})")
    t = shape.token_capacity
    out = dict(slots=np.full((t, group), pad_id, np.int32), merged=np.zeros(t, np.float32),
               target=np.zeros(t, np.int32), group=np.zeros(t, np.int32), weight=np.zeros(t, np.float32),
               cand=np.full(t, c, np.int32))
    pos = 0
    for r, m in zip(rows, lengths):
        for key in ("slots", "merged", "target", "group", "weight"):
            out[key][pos:pos + m] = r[key]
        cand = r.get("cand")
        if cand is not None:
            out["cand"][pos:pos + m] = np.where(cand >= 0, cand, c)
        pos += m
    offsets = np.full(shape.row_capacity + 1, n, np.int32)
    offsets[: len(rows) + 1] = np.concatenate([[0], np.cumsum(lengths)])
    out["offsets"] = offsets
    return out


def batch_tensors(arrays: dict) -> list:
    from mindspore import Tensor
    return [Tensor(arrays[k]) for k in ROLLOUT_KEYS]


@dataclass
class RolloutBatch:
    items: np.ndarray        # int64 [P, G] generated items (0 = a dead beam), best first
    arrays: dict             # ROLLOUT_KEYS, the packed candidate + NLL rows
    old_logp: np.ndarray     # float32 [C] the policy's log-probs at rollout time
    ref_logp: np.ndarray     # float32 [C] the frozen initial policy's
    cand_w: np.ndarray       # float32 [C] 1 / (G * prompts) for a real candidate, 0 for padding
    generate_s: float        # seconds of beam search
    score_s: float           # seconds of the two teacher-forced passes


class Rollout:
    """Generation and log-probs of rollout batches for a policy decoder and its frozen reference."""

    def __init__(self, decoder, reference, trie, codes: np.ndarray, shape: RolloutShape, max_prompt_tokens: int,
                 exclude_consumed: bool = True):
        from mindgr.generate.engine import DecodingEngine
        from mindgr.models.grpo import CandidateLogProbs
        self.dec, self.codes, self.shape, self.p_cap = decoder, np.asarray(codes), shape, max_prompt_tokens
        self.exclude_consumed = bool(exclude_consumed)
        self.engine = DecodingEngine(decoder, trie, codes, shape.group, max_prompt_tokens, shape.prompts)
        self.policy_net = CandidateLogProbs(decoder, shape.candidates)
        self.reference_net = CandidateLogProbs(reference, shape.candidates)
        for net in (self.policy_net, self.reference_net):
            net.set_train(False)

    def prompts(self, histories) -> list:
        return self.dec.prompts(histories, self.codes, self.p_cap)

    def generate(self, histories) -> np.ndarray:
        """items [U, G] (int64): the policy's G best distinct valid items per prompt (with exclude_consumed,
        the G best of the items not in the prompt's history)."""
        exclude = histories if self.exclude_consumed else None
        items, _ = self.engine.search(histories, self.shape.group, exclude=exclude)
        return np.asarray(items, np.int64)

    def run(self, histories, nll_rows: list) -> RolloutBatch:
        """Generate for `histories` (the prompts' items), pack the candidates with `nll_rows`, score."""
        sh, dec = self.shape, self.dec
        t0 = time.perf_counter()
        items = self.generate(histories)
        t1 = time.perf_counter()
        prompts = self.prompts(histories)
        rows = []
        for u, prompt in enumerate(prompts):
            rows += candidate_rows(prompt, items[u], self.codes, dec.level_offsets, dec.group, dec.pad_id, u * sh.group)
        arrays = pack_rollout(rows + list(nll_rows), sh, dec.group, dec.pad_id)
        tensors = batch_tensors(arrays)
        old = self.policy_net(*tensors).asnumpy()
        ref = self.reference_net(*tensors).asnumpy()
        t2 = time.perf_counter()
        cand_w = np.zeros(sh.candidates, np.float32)
        real = np.zeros(sh.candidates, bool)
        real[: items.size] = (items > 0).reshape(-1)
        cand_w[real] = 1.0 / (sh.group * len(histories))
        return RolloutBatch(items, arrays, old, ref, cand_w, t1 - t0, t2 - t1)
