"""Synthetic KuaiRand-like data with real, learnable sequential structure.

Items belong to latent clusters; each item has a few likely successors inside
its cluster, users drift between their preferred clusters, and some steps are
popularity noise. A next-item model can learn this; a popularity model cannot.
"""
from pathlib import Path

import numpy as np

from .store import SequenceStore, remap_items

_SUCCESSOR_PROBS = np.array([0.6, 0.25, 0.15])  # weights of an item's few successors
_P_SWITCH = 0.08   # per step: jump to another of the user's preferred clusters
_P_NOISE = 0.12    # per step: a globally popular item regardless of context
_START_MS = 1_600_000_000_000


class _ClusterSampler:
    """Draws items by popularity restricted to a cluster, vectorised over many draws."""

    def __init__(self, cluster, pop):
        self.cluster = cluster
        self.by_cluster = np.argsort(cluster, kind="stable")
        self.cdf = np.cumsum(pop[self.by_cluster])
        sorted_c = cluster[self.by_cluster]
        ids = np.arange(cluster.max() + 1)
        self.start = np.searchsorted(sorted_c, ids, side="left")
        self.end = np.searchsorted(sorted_c, ids, side="right")
        self.lo = np.where(self.start > 0, self.cdf[np.maximum(self.start - 1, 0)], 0.0)
        self.hi = self.cdf[self.end - 1]

    def neighbour(self, items):
        """The next item of the same cluster (wrapping); the item itself if alone."""
        pos = np.empty_like(self.by_cluster)
        pos[self.by_cluster] = np.arange(len(pos))
        c = self.cluster[items]
        k = self.start[c] + (pos[items] - self.start[c] + 1) % (self.end[c] - self.start[c])
        return self.by_cluster[k]

    def __call__(self, rng, clusters):
        u = self.lo[clusters] + rng.random(len(clusters)) * (self.hi[clusters] - self.lo[clusters])
        k = np.searchsorted(self.cdf, u, side="right")
        k = np.clip(k, self.start[clusters], self.end[clusters] - 1)  # guard float rounding
        return self.by_cluster[k]


def _session_gaps(rng, n, new_session):
    """Millisecond gaps: seconds-minutes inside a session, hours-days between sessions."""
    inside = np.exp(np.log(40_000.0) + 1.0 * rng.standard_normal(n))
    between = np.exp(np.log(8 * 3600_000.0) + 1.2 * rng.standard_normal(n))
    gaps = np.where(new_session, between, inside)
    return np.maximum(gaps, 1000.0).astype(np.int64)


def generate_synthetic(num_users=2000, num_items=1000, median_len=50, max_len=200, min_len=5,
                       num_clusters=20, seed=0, sigma=0.8, zipf_a=1.1, page_size=0.0, values=False):
    """Deterministic (per seed) synthetic store; time_unit "ms", raw item ids 1..num_items.

    page_size > 0: the log is a sequence of request pages of about page_size items each (page_seqs);
    page_size 0 (the default): one item per step, no pages, the data exactly as before pages existed.
    values: a 1-5 rating per interaction (value_seqs, see _ratings), drawn after the items from a stream
    of its own, so the items, times and pages are the same with or without values."""
    if not (1 <= min_len <= max_len) or num_users < 1 or num_items < 2:
        raise ValueError("need num_users >= 1, num_items >= 2 and 1 <= min_len <= max_len")
    if page_size < 0 or 0 < page_size < 1:
        raise ValueError(f"page_size = {page_size}: expected 0 (no pages) or a mean page size >= 1")
    rng = np.random.default_rng(seed)
    num_clusters = max(1, min(num_clusters, num_items))

    lens = np.exp(np.log(median_len) + sigma * rng.standard_normal(num_users))
    lens = np.clip(np.round(lens), min_len, max_len).astype(np.int64)

    pop = (rng.permutation(num_items) + 1.0) ** -zipf_a  # Zipf over a random item order
    pop /= pop.sum()
    pop_cdf = np.cumsum(pop)
    cluster = rng.permutation(num_items) % num_clusters  # balanced, none empty
    in_cluster = _ClusterSampler(cluster, pop)

    # Sparse within-cluster transitions: a few successors per item, avoiding self-loops.
    k_succ = len(_SUCCESSOR_PROBS)
    succ = in_cluster(rng, np.repeat(cluster, k_succ)).reshape(num_items, k_succ)
    succ_cluster = np.repeat(cluster, k_succ).reshape(num_items, k_succ)
    for _ in range(20):
        selfloop = succ == np.arange(num_items)[:, None]
        if not selfloop.any():
            break
        succ[selfloop] = in_cluster(rng, succ_cluster[selfloop])
    # Very popular items keep drawing themselves: fall back to their cluster neighbour.
    rows, cols = np.nonzero(succ == np.arange(num_items)[:, None])
    succ[rows, cols] = in_cluster.neighbour(rows)

    # Each user prefers a few clusters (sparse Dirichlet) and switches among them.
    pref = rng.dirichlet(np.full(num_clusters, 0.3), size=num_users)
    pref_cdf = np.cumsum(pref, axis=1)

    def pick_cluster(users):
        u = rng.random(len(users))[:, None]
        return np.minimum((pref_cdf[users] < u).sum(axis=1), num_clusters - 1)

    if page_size > 0:
        store = _paged_store(rng, lens, page_size, succ, in_cluster, pick_cluster, pop_cdf, num_items)
        return _with_ratings(store, seed, pref, cluster) if values else store

    steps = int(lens.max())
    items = np.empty((num_users, steps), dtype=np.int64)
    new_session = np.zeros((num_users, steps), dtype=bool)
    everyone = np.arange(num_users)
    prev = in_cluster(rng, pick_cluster(everyone))
    items[:, 0] = prev
    for t in range(1, steps):
        r = rng.random(num_users)
        switch = r < _P_SWITCH
        noise = (r >= _P_SWITCH) & (r < _P_SWITCH + _P_NOISE)
        which = np.searchsorted(np.cumsum(_SUCCESSOR_PROBS), rng.random(num_users) * _SUCCESSOR_PROBS.sum())
        nxt = succ[prev, np.minimum(which, k_succ - 1)]
        nxt[noise] = np.minimum(np.searchsorted(pop_cdf, rng.random(int(noise.sum()))), num_items - 1)
        nxt[switch] = in_cluster(rng, pick_cluster(everyone[switch]))
        items[:, t] = nxt
        # Sessions tend to break when the user's interest jumps.
        new_session[:, t] = rng.random(num_users) < np.where(switch, 0.5, 0.04)
        prev = nxt

    mask = np.arange(steps)[None, :] < lens[:, None]
    starts = _START_MS + rng.integers(0, 60 * 86400_000, size=num_users)
    gaps = _session_gaps(rng, num_users * steps, new_session.reshape(-1)).reshape(num_users, steps)
    gaps[:, 0] = starts
    times = np.cumsum(gaps, axis=1)

    splits = np.cumsum(lens)[:-1]
    raw_seqs = np.split(items[mask] + 1, splits)
    item_seqs, item_raw_ids = remap_items(raw_seqs)  # keep only items that occur
    store = SequenceStore(name="synthetic", user_ids=np.arange(1, num_users + 1, dtype=np.int64),
                          item_seqs=item_seqs, time_seqs=np.split(times[mask], splits),
                          item_raw_ids=item_raw_ids, time_unit="ms")
    return _with_ratings(store, seed, pref, cluster) if values else store


def _ratings(rng, pref, cluster, users, items):
    """1-5 ratings of (user, item) interactions (items: 0-based generator indices). A rating rises with the
    user's interest in the item's cluster (its preference weight over the user's largest one, in [0, 1]),
    with a quality of its own per item and a leniency per user, plus noise: an item outside the user's
    clusters (a popularity-noise step) tends to be rated low, the user's main cluster high. The item mean
    and user mean capture quality and leniency; the interest term needs the user's history."""
    num_users, num_items = pref.shape[0], len(cluster)
    quality = rng.standard_normal(num_items)
    leniency = rng.standard_normal(num_users)
    interest = pref[users, cluster[items]] / pref[users].max(axis=1)
    score = 2.2 + 2.5 * interest + 0.6 * quality[items] + 0.4 * leniency[users] + 0.5 * rng.standard_normal(len(items))
    return np.clip(np.rint(score), 1, 5).astype(np.float32)


def _with_ratings(store, seed, pref, cluster):
    """The store with a rating per interaction (_ratings), from a stream seeded by (seed, 17)."""
    lens = store.lengths()
    users = np.repeat(np.arange(store.num_users), lens)
    items = store.item_raw_ids[np.concatenate(store.item_seqs)] - 1     # raw ids are the generator's + 1
    values = _ratings(np.random.default_rng([seed, 17]), pref, cluster, users, items)
    store.value_seqs = np.split(values, np.cumsum(lens)[:-1])
    return store


_P_ANCHOR = 0.5   # paged: a page slot is a successor of the previous page's anchor item (else cluster popularity)


def _shuffle_rows(rng, values, keep):
    """Each row's kept values first, in a uniformly random order (exchangeable), then the rest."""
    key = np.where(keep, rng.random(values.shape), 2.0)
    order = np.argsort(key, axis=1, kind="stable")
    return np.take_along_axis(values, order, 1), np.take_along_axis(keep, order, 1)


def _paged_store(rng, lens, page_size, succ, in_cluster, pick_cluster, pop_cdf, num_items):
    """Request pages: per step every user gets a page of 1 + Poisson(page_size - 1) items (cut at the
    user's length), all at one time (the request's), drawn independently given the user's current
    interest (its cluster and an anchor item of the previous page): each slot is popularity noise
    (_P_NOISE), a successor of the anchor (_P_ANCHOR) or a popular item of the cluster; a page keeps its
    first `size` distinct draws (of 3 x size; fewer if there are not that many) in a random order, so
    page-mates are exchangeable. The interest moves
    between pages: the cluster switches with _P_SWITCH, the anchor is a random item of the new page."""
    num_users = len(lens)
    everyone = np.arange(num_users)
    cluster = pick_cluster(everyone)
    anchor = in_cluster(rng, cluster)
    k_succ = succ.shape[1]
    succ_cdf = np.cumsum(_SUCCESSOR_PROBS) / _SUCCESSOR_PROBS.sum()
    items = [[] for _ in range(num_users)]
    pages = [[] for _ in range(num_users)]
    times = [[] for _ in range(num_users)]
    clock = _START_MS + rng.integers(0, 60 * 86400_000, size=num_users)
    filled = np.zeros(num_users, np.int64)
    step = 0
    while (filled < lens).any():
        users = np.flatnonzero(filled < lens)
        n = len(users)
        switch = rng.random(n) < _P_SWITCH
        if step and switch.any():
            cluster[users[switch]] = pick_cluster(users[switch])
            anchor[users[switch]] = in_cluster(rng, cluster[users[switch]])
        size = np.minimum(1 + rng.poisson(page_size - 1, n), lens[users] - filled[users])
        width = 3 * int(size.max())                     # spare draws: a page keeps its first `size` distinct
        r = rng.random((n, width))
        which = np.minimum(np.searchsorted(succ_cdf, rng.random((n, width))), k_succ - 1)
        draw = succ[np.repeat(anchor[users], width).reshape(n, width), which]
        popular = in_cluster(rng, np.repeat(cluster[users], width)).reshape(n, width)
        draw = np.where(r < _P_NOISE + _P_ANCHOR, draw, popular)
        noise = r < _P_NOISE
        draw[noise] = np.minimum(np.searchsorted(pop_cdf, rng.random(int(noise.sum()))), num_items - 1)
        order = np.argsort(draw, axis=1, kind="stable")  # a repeat of an earlier draw in the row is dropped
        srt = np.take_along_axis(draw, order, 1)
        repeat = np.zeros(draw.shape, bool)
        np.put_along_axis(repeat, order[:, 1:], srt[:, 1:] == srt[:, :-1], 1)
        distinct = ~repeat
        keep = distinct & (np.cumsum(distinct, axis=1) <= size[:, None])
        draw, keep = _shuffle_rows(rng, draw, keep)
        count = keep.sum(axis=1)
        gap = _session_gaps(rng, n, rng.random(n) < np.where(switch, 0.5, 0.04))
        if step:
            clock[users] += gap
        for j, u in enumerate(users):
            c = int(count[j])
            items[u].append(draw[j, :c])
            pages[u].append(np.full(c, step, np.int64))
            times[u].append(np.full(c, clock[u], np.int64))
        filled[users] += count
        anchor[users] = draw[np.arange(n), np.minimum((rng.random(n) * count).astype(np.int64), count - 1)]
        step += 1
    raw_seqs = [np.concatenate(x) + 1 for x in items]
    item_seqs, item_raw_ids = remap_items(raw_seqs)
    return SequenceStore(name="synthetic", user_ids=np.arange(1, num_users + 1, dtype=np.int64),
                         item_seqs=item_seqs, time_seqs=[np.concatenate(t) for t in times],
                         item_raw_ids=item_raw_ids, time_unit="ms",
                         page_seqs=[np.concatenate(p) for p in pages])


KUAIRAND_COLUMNS = ["user_id", "video_id", "date", "hourmin", "time_ms", "is_click", "is_like",
                    "is_follow", "is_comment", "is_forward", "is_hate", "long_view", "play_time_ms",
                    "duration_ms", "profile_stay_time", "comment_stay_time", "is_profile_enter",
                    "is_rand", "tab"]


def write_kuairand_csv(store, out_dir, files=2, seed=0):
    """Write the store as KuaiRand-style log_*.csv files; returns their paths.

    Store interactions become is_click=1 rows; extra is_click=0 rows are mixed in
    (a reader must filter them out) and each user's rows are spread over the files.
    An exact round trip needs strictly increasing times per user (ties may reorder).
    """
    import pyarrow as pa  # lazy: the generator itself does not need it
    import pyarrow.csv as pacsv

    if not store.has_timestamps:
        raise ValueError("write_kuairand_csv needs a store with timestamps")
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lens = store.lengths()
    users = np.repeat(store.user_ids, lens)
    videos = store.item_raw_ids[np.concatenate(store.item_seqs)]
    times = np.concatenate(store.time_seqs).astype(np.int64) * (1000 if store.time_unit == "s" else 1)

    # Non-clicks: shown around real interactions, with random videos.
    n_pos = len(users)
    n_neg = n_pos // 2
    anchor = rng.integers(0, len(users), size=n_neg)
    users = np.concatenate([users, users[anchor]])
    videos = np.concatenate([videos, store.item_raw_ids[rng.integers(1, store.num_items + 1, size=n_neg)]])
    times = np.concatenate([times, times[anchor] + rng.integers(1, 5000, size=n_neg)])
    click = np.concatenate([np.ones(n_pos, np.int64), np.zeros(n_neg, np.int64)])
    n = len(users)

    beijing = (times + 8 * 3600_000).astype("datetime64[ms]")
    day = beijing.astype("datetime64[D]")
    date = np.char.replace(np.datetime_as_string(day), "-", "").astype(np.int64)
    minute_of_day = (beijing - day).astype(np.int64) // 60_000
    duration = rng.integers(5_000, 120_000, size=n)
    play = np.where(click == 1, (duration * rng.uniform(0.1, 1.5, size=n)).astype(np.int64), 0)
    cols = {
        "user_id": users, "video_id": videos, "date": date,
        "hourmin": (minute_of_day // 60) * 100 + minute_of_day % 60, "time_ms": times, "is_click": click,
        "is_like": click * (rng.random(n) < 0.05), "is_follow": click * (rng.random(n) < 0.01),
        "is_comment": click * (rng.random(n) < 0.01), "is_forward": click * (rng.random(n) < 0.005),
        "is_hate": (rng.random(n) < 0.002).astype(np.int64), "long_view": (play > duration // 2).astype(np.int64),
        "play_time_ms": play, "duration_ms": duration, "profile_stay_time": np.zeros(n, np.int64),
        "comment_stay_time": np.zeros(n, np.int64), "is_profile_enter": click * (rng.random(n) < 0.02),
        "is_rand": np.zeros(n, np.int64), "tab": rng.integers(0, 6, size=n),
    }
    part = rng.integers(0, files, size=n)
    paths = []
    for k in range(files):
        rows = np.flatnonzero(part == k)
        rows = rows[np.lexsort((times[rows], users[rows]))]
        table = pa.table({c: pa.array(np.asarray(cols[c], dtype=np.int64)[rows]) for c in KUAIRAND_COLUMNS})
        path = out / f"log_synthetic_part{k + 1}.csv"
        with open(path, "wb") as f:  # plain header: pyarrow would quote the column names
            f.write((",".join(KUAIRAND_COLUMNS) + "\n").encode())
            pacsv.write_csv(table, f, write_options=pacsv.WriteOptions(include_header=False,
                                                                      quoting_style="none"))
        paths.append(path)
    return paths
