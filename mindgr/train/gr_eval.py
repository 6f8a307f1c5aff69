"""Generative-retrieval evaluation: trie-constrained beam search (mindgr.generate.engine.DecodingEngine, the
engine the server uses) -> per-user ranks in the layout of full-ranking evaluation (mindgr.train.metrics).

Each user's prompt is its last `max_history` items (the run's data.max_len, as in training). The engine
returns the `beam` best distinct items (beam >= max(eval.ks)); the target's 0-based position in that list
is its rank, after removing the user's history items other than the target (filter_history, as the
encoders' evaluation does), or in the list as it is (filter_history false: TIGER's protocol). A target
outside the list is a miss: rank = the catalogue size (below every item, hit@K = 0 for every K) with no
ties. A generated list has no ties, so ties are 0 and the tie-aware metrics are the plain ones.
With a page holdout (EvalSet.page_items, mindgr.datasets.pages) the same lists also give page recall@K =
|top-K ∩ page| / min(K, |page|) per user (K = 5, 10 and the beam, up to the beam), the history items not in
the page removed when filter_history.
The decoded lists themselves (their first LIST_KEEP items, before any history filtering) are kept per user
for the ranks files, so that list-level measures (mindgr.train.judge: a reward model's mean score of the
top-K, catalogue coverage) need no second decode.
Independent of the Trainer: it takes a decoder, a trie, a code table and an EvalSet.
"""
from __future__ import annotations

import time

import numpy as np

from mindgr.generate.beam import BeamError, beam_ranks
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


def history_buckets(max_history: int) -> list:
    """Prompt capacities (in items) of the decoding engines: one, the longest prompt. The engine's cost per
    user hardly depends on the prompt (its step reads the prompt's K/V once per beam), while every capacity
    is its own compiled graphs and memory: one shape serves every user, validation and test alike."""
    return [max(1, max_history)]


def peak_rss_mb() -> float:
    """This process's resident high-water mark (VmHWM; 0 where /proc is missing): training and decoding so far."""
    from mindgr.train.memory import process_peak_mb
    return process_peak_mb()


LIST_KEEP = 100                  # items of each decoded list kept for the ranks files (4 bytes each)
USER_METRIC_PREFIX = "metric_"   # a ranks file's extra per-user metrics (page recall), -1 = not evaluated


def user_metrics_of(npz) -> dict:
    """{name: [U] float} of the extra per-user metrics of an open ranks file ({} when it has none)."""
    return {k[len(USER_METRIC_PREFIX):]: npz[k] for k in npz.files if k.startswith(USER_METRIC_PREFIX)}


def page_recall(items: np.ndarray, pages, histories, ks) -> dict:
    """{"page_recall@K": [U]}: |top-K of the list ∩ page| / min(K, |page|) per user, where the list is
    `items` [U, beam] with dead slots (0) and, when histories is given, the history items that are not in
    the page removed (as beam_ranks treats a single target); pages: each user's held-out page items."""
    items = np.asarray(items)
    out = {f"page_recall@{k}": np.zeros(items.shape[0], np.float64) for k in ks}
    for u in range(items.shape[0]):
        page = set(int(i) for i in pages[u])
        seen = set(int(i) for i in histories[u]) - page if histories is not None else set()
        listed = [it for it in items[u].tolist() if it != 0 and it not in seen]
        for k in ks:
            hits = len(page.intersection(listed[:k]))
            out[f"page_recall@{k}"][u] = hits / min(k, len(page))
    return out


_ENGINES: "OrderedDict" = None
_KEEP_ENGINES = 2


def _engine(decoder, trie, codes, beam, p_cap, n_users, engine_options):
    """A DecodingEngine, reused across calls for the same decoder, trie and shapes (its compiled graphs read
    the decoder's parameters, so a validation during training decodes with the current weights without
    compiling again); the last few are kept."""
    from collections import OrderedDict
    from mindgr.generate.engine import DecodingEngine
    global _ENGINES
    if _ENGINES is None:
        _ENGINES = OrderedDict()
    key = (id(decoder), id(trie), beam, p_cap, n_users, tuple(sorted((engine_options or {}).items())))
    hit = _ENGINES.get(key)
    if hit is not None and hit[0] is decoder and hit[1] is trie:
        _ENGINES.move_to_end(key)
        engine = hit[2]
    else:
        engine = DecodingEngine(decoder, trie, codes, beam, p_cap, n_users, **(engine_options or {}))
        _ENGINES[key] = (decoder, trie, engine)
        while len(_ENGINES) > _KEEP_ENGINES:
            _ENGINES.popitem(last=False)
    engine.timings = {k: 0.0 for k in engine.timings}
    return engine


def drop_engines():
    """Forget the kept engines: their compiled graphs and buffers are freed once nothing else holds them."""
    if _ENGINES is not None:
        _ENGINES.clear()


def progress_printer(label: str, every_s: float = 30.0, emit=None):
    """A `progress` callback for generative_ranks: one line at most every `every_s` seconds (users done, rate,
    time left) through `emit` (default: print to stderr), so a long decode is visibly alive."""
    import sys
    emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
    last = [0.0]

    def report(done: int, total: int, seconds: float):
        if seconds - last[0] < every_s or done >= total:
            return
        last[0] = seconds
        rate = done / seconds if seconds > 0 else 0.0
        left = (total - done) / rate if rate > 0 else float("nan")
        emit(f"decode {label}: {done}/{total} users ({100 * done / total:.0f}%), {rate:.0f} users/s, "
             f"about {left / 60:.1f} min left")
    return report


def generative_ranks(decoder, trie, codes, evalset, rows, max_history: int, beam: int, batch_users: int,
                     num_items: int, filter_history=True, engine_options: dict | None = None, progress=None,
                     exclude_in_search: bool = False):
    """(greater, ties, stats) of evalset's users `rows`, decoded batch_users at a time; filter_history may be
    a bool or a tuple of bools (then greater and ties are dicts by value: one decode gives both rankings).
    Every user is decoded at one prompt capacity and batch shape (history_buckets), so one engine (its
    compiled graphs) serves validation and test; a user's list does not depend on its batch (the prompt's
    K/V and position biases are per user). Batches are decoded one after another and only their ranks are
    kept (peak memory: one batch's search). progress(done, total, seconds),
    if given, is called after every batch (progress_printer throttles it). exclude_in_search: the search
    skips each user's history items other than the target (the lists then hold no history item)."""
    from mindgr.models.generative import max_prompt_tokens
    flags = tuple(filter_history) if isinstance(filter_history, (tuple, list)) else (bool(filter_history),)
    rows = np.asarray(rows, np.int64)
    batch_users = max(1, min(batch_users, len(rows)))
    per_item = max_prompt_tokens(decoder.num_levels, decoder.token_merger, 1)
    lengths = np.array([min(len(evalset.histories[r]), max_history) for r in rows], np.int64)
    caps = history_buckets(max_history)
    bucket = np.searchsorted(np.asarray(caps), lengths)        # smallest cap >= the prompt's items
    greater = {f: np.zeros(len(rows), np.int64) for f in flags}
    lists = np.zeros((len(rows), min(beam, LIST_KEEP)), np.int32)     # 0 = a dead slot
    pages = getattr(evalset, "page_items", None)       # page holdout: page recall of the same lists
    ks = sorted({k for k in (5, 10, beam) if k <= beam})
    recall = {f: {f"page_recall@{k}": np.zeros(len(rows)) for k in ks} for f in flags} if pages is not None else None
    prompt_tokens = 0
    timings = {"prefill": 0.0, "model": 0.0}
    t0 = time.perf_counter()
    done = 0
    for b, cap in enumerate(caps):
        members = np.flatnonzero(bucket == b)
        if not len(members):
            continue
        n_users = batch_users     # one shape for every batch (the last one padded): validation's and test's alike
        engine = _engine(decoder, trie, codes, beam, cap * per_item, n_users, engine_options)
        for lo in range(0, len(members), n_users):
            idx = members[lo:lo + n_users]
            chunk = rows[idx]
            hist = [np.asarray(evalset.histories[r][-max_history:], np.int64) for r in chunk]
            prompt_tokens += int(lengths[idx].sum()) * per_item
            exclude = None
            if exclude_in_search:
                exclude = [np.setdiff1d(np.asarray(evalset.histories[r], np.int64), [int(evalset.targets[r])])
                           for r in chunk]
            items, _ = engine.search(hist, beam, exclude=exclude)
            kept = np.asarray(items)[:, : lists.shape[1]]
            lists[idx, : kept.shape[1]] = kept
            for f in flags:
                full = [evalset.histories[r] for r in chunk] if f else None
                greater[f][idx] = beam_ranks(items, evalset.targets[chunk], full, num_items)
                if recall is not None:
                    for name, v in page_recall(items, [pages[r] for r in chunk], full, ks).items():
                        recall[f][name][idx] = v
            done += len(idx)
            if progress is not None:
                progress(done, len(rows), time.perf_counter() - t0)
        for key in timings:
            timings[key] += engine.timings[key]
    seconds = time.perf_counter() - t0
    stats = {"users": int(len(rows)), "beam": beam, "decode_s": seconds,
             "users_per_s": len(rows) / seconds if seconds > 0 else 0.0,
             "prompt_tokens_mean": prompt_tokens / max(len(rows), 1), "prompt_caps_items": caps,
             "prefill_s": timings["prefill"], "step_s": timings["model"], "peak_rss_mb": round(peak_rss_mb(), 1),
             "lists": lists}
    if recall is not None:
        stats["page_recall"] = recall if isinstance(filter_history, (tuple, list)) else recall[flags[0]]
    ties = {f: np.zeros(len(rows), np.int64) for f in flags}
    if len(flags) == 1 and not isinstance(filter_history, (tuple, list)):
        return greater[flags[0]], ties[flags[0]], stats
    return greater, ties, stats


def generative_metrics(decoder, trie, codes, evalset, ks, max_history: int, beam: int, batch_users: int,
                       num_items: int, filter_history: bool = True, max_users: int = 0, seed: int = 0,
                       per_user: bool = False, progress=None, exclude_in_search: bool = False):
    """Ranking metrics of the decoded lists (and, with per_user, (greater, ties) per evalset user, -1 =
    not evaluated, for `mindgr compare`). With per_user, the other ranking (history filtered or not) of
    the same lists comes too: a dict {filter_history: (metrics, greater, ties, per-user page recall, lists)}
    (page recall {} without a page holdout, else {"page_recall@K": [U] float, -1 = not evaluated}; lists
    [U, min(beam, LIST_KEEP)] int32, each user's decoded items before history filtering, 0 = none).
    exclude_in_search: the decode skips the history (generative_ranks); both rankings then agree."""
    rows = eval_users(len(evalset.targets), max_users, seed)
    flags = (True, False)
    greater, ties, stats = generative_ranks(decoder, trie, codes, evalset, rows, max_history, beam, batch_users,
                                            num_items, flags, progress=progress, exclude_in_search=exclude_in_search)
    recall = stats.pop("page_recall", None)
    lists = np.zeros((len(evalset.targets), stats["lists"].shape[1]), np.int32)
    lists[rows] = stats.pop("lists")
    both = {}
    for f in flags:
        m = ranking_metrics(greater[f], ks, ties[f])
        m["decode"] = stats
        by_user = np.full(len(evalset.targets), -1, np.int64)
        ties_by_user = np.full(len(evalset.targets), -1, np.int64)
        by_user[rows], ties_by_user[rows] = greater[f], ties[f]
        extra = {}                     # page holdout: mean page recall, and per user (-1 = not evaluated)
        for name, v in (recall[f] if recall is not None else {}).items():
            m[name] = float(v.mean()) if len(v) else 0.0
            extra[name] = np.full(len(evalset.targets), -1.0)
            extra[name][rows] = v
        both[f] = (m, by_user, ties_by_user, extra, lists)
    metrics = dict(both[bool(filter_history)][0])
    metrics["other_ranking"] = {"filter_history": not filter_history,
                                **{k: v for k, v in both[not filter_history][0].items() if k != "decode"}}
    if not per_user:
        return metrics
    return metrics, both


def target_log_probs(decoder, codes, evalset, rows, max_history: int, batch_users: int = 64) -> np.ndarray:
    """log p(target | prompt) [len(rows)] (float64) of evalset's users `rows`: a teacher-forced pass over each
    held-out target's code tuple after the user's last `max_history` items, the sequence log-probability
    GRPO-SR's policy ratio uses (minus the sum of the level-masked code cross-entropies of the NTP loss).
    Unlike a hit, it moves with every change of the model's belief about the target, inside the list or
    not. batch_users users per pass, one compiled graph (the last batch padded)."""
    from mindgr.models.generative import max_prompt_tokens
    from mindgr.models.grpo import CandidateLogProbs
    from mindgr.train.rollout import RolloutShape, batch_tensors, candidate_rows, pack_rollout
    rows = np.asarray(rows, np.int64)
    out = np.zeros(len(rows), np.float64)
    if not len(rows):
        return out
    batch_users = max(1, min(int(batch_users), len(rows)))
    p_cap = max_prompt_tokens(decoder.num_levels, decoder.token_merger, max_history)
    lt = decoder.num_levels
    shape = RolloutShape(batch_users, 1, batch_users * (p_cap + lt - 1), batch_users)
    net = CandidateLogProbs(decoder, shape.candidates)
    net.set_train(False)
    for lo in range(0, len(rows), batch_users):
        chunk = rows[lo:lo + batch_users]
        hist = [np.asarray(evalset.histories[r][-max_history:], np.int64) for r in chunk]
        prompts = decoder.prompts(hist, codes, p_cap)
        cand = []
        for u, (prompt, r) in enumerate(zip(prompts, chunk)):
            cand += candidate_rows(prompt, [int(evalset.targets[r])], codes, decoder.level_offsets, decoder.group,
                                   decoder.pad_id, u)
        logp = net(*batch_tensors(pack_rollout(cand, shape, decoder.group, decoder.pad_id))).asnumpy()
        out[lo:lo + len(chunk)] = logp[:len(chunk)]
    return out
