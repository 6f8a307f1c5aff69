"""Generative-retrieval evaluation: trie-constrained beam search (mindgr.ids.decode.DecodingEngine, the
engine the server uses) -> per-user ranks in the layout of full-ranking evaluation (mindgr.train.metrics).

Each user's prompt is its last `max_history` items (the run's data.max_len, as in training). The engine
returns the `beam` best distinct items (beam >= max(eval.ks)); the target's 0-based position in that list
is its rank, after removing the user's history items other than the target (filter_history, as the
encoders' evaluation does), or in the list as it is (filter_history false: TIGER's protocol). A target
outside the list is a miss: rank = the catalogue size (below every item, hit@K = 0 for every K) with no
ties. A generated list has no ties, so ties are 0 and the tie-aware metrics are the plain ones.
Independent of the Trainer: it takes a decoder, a trie, a code table and an EvalSet.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.ids.beam import BeamError, beam_ranks
from mindgr.train.metrics import ranking_metrics


def beam_width(eval_cfg) -> int:
    """eval.beam, or max(eval.ks) when 0; a beam shorter than the longest list is a one-line error."""
    beam = eval_cfg.beam or max(eval_cfg.ks)
    if beam < max(eval_cfg.ks):
        raise BeamError(f"eval.beam = {beam} must be >= max(eval.ks) = {max(eval_cfg.ks)}: beam search returns "
                        "at most beam items")
    return beam


def eval_users(num: int, max_users: int, seed: int = 0) -> np.ndarray:
    """Indices of the users evaluated: all, or a fixed seeded sample of max_users (sorted)."""
    if not max_users or max_users >= num:
        return np.arange(num)
    return np.sort(np.random.default_rng([seed, 31]).choice(num, max_users, replace=False))


def generative_ranks(decoder, trie, codes, evalset, rows, max_history: int, beam: int, batch_users: int,
                     num_items: int, filter_history: bool = True, engine_options: dict | None = None):
    """(greater [len(rows)], ties [len(rows)], stats) of evalset's users `rows`, decoded batch_users at a time."""
    from mindgr.ids.decode import DecodingEngine
    from mindgr.models.generative import max_prompt_tokens
    rows = np.asarray(rows, np.int64)
    batch_users = max(1, min(batch_users, len(rows)))
    p_cap = max_prompt_tokens(decoder.num_levels, decoder.token_merger, max_history)
    engine = DecodingEngine(decoder, trie, codes, beam, p_cap, batch_users, **(engine_options or {}))
    greater = np.zeros(len(rows), np.int64)
    prompt_tokens = 0
    t0 = time.perf_counter()
    for lo in range(0, len(rows), batch_users):
        chunk = rows[lo:lo + batch_users]
        hist = [np.asarray(evalset.histories[r][-max_history:], np.int64) for r in chunk]
        prompt_tokens += sum(len(h) for h in hist) * (p_cap // max_history)
        items, _ = engine.search(hist, beam)
        full = [evalset.histories[r] for r in chunk] if filter_history else None
        greater[lo:lo + len(chunk)] = beam_ranks(items, evalset.targets[chunk], full, num_items)
    seconds = time.perf_counter() - t0
    stats = {"users": int(len(rows)), "beam": beam, "decode_s": seconds,
             "users_per_s": len(rows) / seconds if seconds > 0 else 0.0,
             "prompt_tokens_mean": prompt_tokens / max(len(rows), 1),
             "prefill_s": engine.timings["prefill"], "step_s": engine.timings["model"]}
    return greater, np.zeros(len(rows), np.int64), stats


def generative_metrics(decoder, trie, codes, evalset, ks, max_history: int, beam: int, batch_users: int,
                       num_items: int, filter_history: bool = True, max_users: int = 0, seed: int = 0,
                       per_user: bool = False):
    """Ranking metrics of the decoded lists (and, with per_user, (greater, ties) per evalset user, -1 =
    not evaluated, for `mindgr compare`)."""
    rows = eval_users(len(evalset.targets), max_users, seed)
    greater, ties, stats = generative_ranks(decoder, trie, codes, evalset, rows, max_history, beam, batch_users,
                                            num_items, filter_history)
    metrics = ranking_metrics(greater, ks, ties)
    metrics["decode"] = stats
    if not per_user:
        return metrics
    by_user = np.full(len(evalset.targets), -1, np.int64)
    ties_by_user = np.full(len(evalset.targets), -1, np.int64)
    by_user[rows], ties_by_user[rows] = greater, ties
    return metrics, by_user, ties_by_user
