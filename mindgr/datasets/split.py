"""Leave-one-out split into training sequences and valid/test evaluation sets.

holdout=2 is the standard protocol (train never sees valid or test items);
holdout=1 is the HSTU-paper protocol (train on everything but the test item).
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class EvalSet:
    histories: list  # int32 arrays: the full history before each target (not truncated)
    history_times: list | None  # int64 arrays, or None without timestamps
    targets: np.ndarray  # int32 [n]
    target_times: np.ndarray | None  # int64 [n]
    users: np.ndarray  # int64 [n], user index into the store
    page_items: list | None = None  # page holdout (mindgr.datasets.pages): every item of each held-out page
    history_values: list | None = None  # float32 arrays: the value of every history item (a store with values)
    target_values: np.ndarray | None = None  # float32 [n]: the target's value (a store with values)

    def __len__(self):
        return len(self.targets)


@dataclass
class Split:
    train: list  # int32 arrays: whole training prefixes (the packer truncates)
    train_times: list | None
    valid: EvalSet
    test: EvalSet
    train_users: np.ndarray = None  # int64 user index into the store of each train sequence
    train_values: list | None = None  # float32 arrays beside `train` (a store with values), or None
    dropped: dict = field(default_factory=dict)  # users left out of "train"/"valid"/"test"


def _eval_set(store, offset):
    """Target s[-offset] with history s[:-offset], for users whose history is non-empty."""
    users = np.flatnonzero(store.lengths() > offset).astype(np.int64)
    seqs, times, values = store.item_seqs, store.time_seqs, store.value_seqs
    histories = [seqs[u][:-offset] for u in users]
    targets = np.array([seqs[u][-offset] for u in users], dtype=np.int32)
    out = EvalSet(histories, None, targets, None, users)
    if times is not None:
        out.history_times = [times[u][:-offset] for u in users]
        out.target_times = np.array([times[u][-offset] for u in users], dtype=np.int64)
    if values is not None:
        out.history_values = [values[u][:-offset] for u in users]
        out.target_values = np.array([values[u][-offset] for u in users], dtype=np.float32)
    return out


def leave_one_out(store, holdout=2, min_train_len=2):
    """Split every user's sequence: test = last item, valid = second to last, train = s[:-holdout]."""
    if holdout not in (1, 2):
        raise ValueError(f"holdout must be 1 (HSTU protocol) or 2 (standard), got {holdout}")
    test = _eval_set(store, 1)
    valid = _eval_set(store, 2)
    lens = store.lengths()
    train_users = np.flatnonzero(lens - holdout >= max(min_train_len, 1)).astype(np.int64)
    train = [store.item_seqs[u][:-holdout] for u in train_users]
    train_times = None if store.time_seqs is None else [store.time_seqs[u][:-holdout] for u in train_users]
    train_values = None if store.value_seqs is None else [store.value_seqs[u][:-holdout] for u in train_users]
    dropped = {
        "train": int(store.num_users - len(train_users)),
        "valid": int(store.num_users - len(valid)),
        "test": int(store.num_users - len(test)),
    }
    return Split(train=train, train_times=train_times, valid=valid, test=test,
                 train_users=train_users, dropped=dropped, train_values=train_values)
