"""Request pages (items consumed in one request) and the page-level leave-one-out split.

Pages are a page id per item (SequenceStore.page_seqs: equal ids, consecutive). They come from a csv
page_column, from the synthetic generator (page_size > 0), or from equal timestamps
(`timestamp_pages`: the items of a user with the same time form one page; MovieLens users rate several
movies in the same second).

`page_leave_one_out` holds out whole pages: test = the user's last page, validation = the page before,
training = the items before the validation page (holdout 2) or before the test page (holdout 1). The
EvalSets' target is the first item of the held-out page (the item metrics), their `page_items` are all
its items (page recall), and the history ends before the page, so no page-mate of a held-out item is in
the history or in training.
"""
import dataclasses

import numpy as np

from .split import EvalSet, Split


def timestamp_pages(store):
    """The store with page ids from equal timestamps (a new page where a user's time changes). Users whose
    times are all 0 (no real times, e.g. the ML-1M sequences.txt users a data.timestamps file does not
    cover) are left out; returns (store, users left out)."""
    if store.time_seqs is None:
        raise ValueError(f"data.pages = timestamps: data '{store.name}' has no timestamps")
    if store.page_seqs is not None:
        raise ValueError(f"data.pages = timestamps: data '{store.name}' already has pages (a csv page_column)")
    keep = [u for u, t in enumerate(store.time_seqs) if len(t) and np.any(np.asarray(t) != 0)]
    if not keep:
        raise ValueError(f"data.pages = timestamps: every user of '{store.name}' has only zero times")
    pages = []
    for u in keep:
        t = np.asarray(store.time_seqs[u], np.int64)
        pages.append(np.concatenate([[0], np.cumsum(t[1:] != t[:-1])]).astype(np.int64))
    out = dataclasses.replace(store, user_ids=np.asarray(store.user_ids)[keep],
                              item_seqs=[store.item_seqs[u] for u in keep],
                              time_seqs=[store.time_seqs[u] for u in keep], page_seqs=pages,
                              value_seqs=None if store.value_seqs is None else [store.value_seqs[u] for u in keep])
    return out, store.num_users - len(keep)


def page_bounds(pages) -> np.ndarray:
    """Start of every page and the end: [P + 1] (page ids equal within a page, consecutive)."""
    pages = np.asarray(pages)
    cut = np.flatnonzero(pages[1:] != pages[:-1]) + 1
    return np.concatenate([[0], cut, [len(pages)]]).astype(np.int64)


def _page_eval_set(store, bounds, back):
    """Held-out page `back` from the end (1 = last) of users with at least back + 1 pages."""
    users, hist, htimes, targets, ttimes, page_items = [], [], [], [], [], []
    for u, b in enumerate(bounds):
        if len(b) - 1 <= back:
            continue
        lo, hi = int(b[-1 - back]), int(b[-back])
        seq = store.item_seqs[u]
        users.append(u)
        hist.append(seq[:lo])
        targets.append(seq[lo])
        page_items.append(np.asarray(seq[lo:hi], np.int32))
        if store.time_seqs is not None:
            htimes.append(store.time_seqs[u][:lo])
            ttimes.append(store.time_seqs[u][lo])
    timed = store.time_seqs is not None
    return EvalSet(hist, htimes if timed else None, np.array(targets, np.int32),
                   np.array(ttimes, np.int64) if timed else None, np.array(users, np.int64), page_items=page_items)


def page_leave_one_out(store, holdout=2, min_train_len=2):
    """Leave one PAGE out: test = last page, validation = the page before, train = the items before the
    validation page (holdout 2) or the test page (holdout 1); see the module docstring."""
    if store.page_seqs is None:
        raise ValueError(f"data.holdout_unit = page: data '{store.name}' has no pages (set data.pages, "
                        "data.synthetic.page_size or a csv page_column)")
    if holdout not in (1, 2):
        raise ValueError(f"holdout must be 1 or 2, got {holdout}")
    bounds = [page_bounds(p) for p in store.page_seqs]
    test, valid = _page_eval_set(store, bounds, 1), _page_eval_set(store, bounds, 2)
    cut = [int(b[-1 - holdout]) if len(b) - 1 > holdout else 0 for b in bounds]
    train_users = np.array([u for u, c in enumerate(cut) if c >= max(min_train_len, 1)], np.int64)
    train = [store.item_seqs[u][:cut[u]] for u in train_users]
    train_times = None if store.time_seqs is None else [store.time_seqs[u][:cut[u]] for u in train_users]
    dropped = {"train": int(store.num_users - len(train_users)), "valid": int(store.num_users - len(valid)),
               "test": int(store.num_users - len(test))}
    return Split(train=train, train_times=train_times, valid=valid, test=test, train_users=train_users,
                 dropped=dropped)


def page_stats(store) -> dict:
    """Pages per user and items per page (means), for logs and results."""
    if store.page_seqs is None:
        return {}
    sizes = np.concatenate([np.diff(page_bounds(p)) for p in store.page_seqs if len(p)])
    return {"pages": int(len(sizes)), "items_per_page_mean": float(sizes.mean()),
            "pages_per_user_mean": float(len(sizes) / max(store.num_users, 1)),
            "single_item_pages": float((sizes == 1).mean())}
