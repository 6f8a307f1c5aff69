"""Fixed-capacity jagged batches of whole sequences.

Every batch has the same array shapes (a token budget T_cap and a row budget
B_cap) so the model compiles to ONE static graph; sequences are packed end to
end instead of padded, and a look-ahead first-fit keeps the budget nearly full.
"""
import math
from dataclasses import dataclass

import numpy as np


@dataclass
class JaggedBatch:
    ids: np.ndarray  # int32 [T_cap] input items, concatenated; 0 in the unused tail
    targets: np.ndarray  # int32 [T_cap] next item per position; 0 = no target
    timestamps: np.ndarray  # int64 [T_cap] time of each input item; 0 when unknown / tail
    offsets: np.ndarray  # int32 [B_cap+1] row starts; unused rows repeat the last offset
    positions: np.ndarray  # int32 [T_cap] position inside the (truncated) sequence; 0 in tail
    rows: np.ndarray  # int64 [B_cap] example index held by each row; -1 for empty rows
    num_tokens: int
    num_rows: int
    # int64 [B_cap] when each row's next item is requested: the time of the item its last position
    # predicts (training: the last target's time; evaluation: the held-out target's). Without request
    # times, the row's last input time; 0 for empty rows and without timestamps.
    request_times: np.ndarray = None

    @property
    def fill(self):
        return self.num_tokens / len(self.ids)

    @property
    def token_capacity(self):
        return len(self.ids)

    @property
    def row_capacity(self):
        return len(self.rows)


def training_examples(train_seqs, train_times, max_len):
    """Next-item examples: inputs s[:-1] and targets s[1:], both keeping the last max_len.

    Sequences shorter than 2 give no example and are skipped, so returned lists
    may be shorter than ``train_seqs``.
    """
    inputs, targets = [], []
    input_times = None if train_times is None else []
    for k, s in enumerate(train_seqs):
        if len(s) < 2:
            continue
        inputs.append(np.asarray(s[:-1][-max_len:], dtype=np.int32))
        targets.append(np.asarray(s[1:][-max_len:], dtype=np.int32))
        if input_times is not None:
            input_times.append(np.asarray(train_times[k][:-1][-max_len:], dtype=np.int64))
    return inputs, input_times, targets


def training_request_times(train_seqs, train_times):
    """The request time of each example training_examples makes (same order, same skipped sequences):
    the time of its last target, s[-1]. None without timestamps."""
    if train_times is None:
        return None
    return np.array([train_times[k][-1] for k, s in enumerate(train_seqs) if len(s) >= 2], dtype=np.int64)


def eval_examples(evalset, max_len):
    """Eval examples: the last max_len history items; only the last position has a target."""
    inputs, targets = [], []
    input_times = None if evalset.history_times is None else []
    for k, hist in enumerate(evalset.histories):
        if len(hist) == 0:
            raise ValueError(f"eval example {k} has an empty history")
        x = np.asarray(hist[-max_len:], dtype=np.int32)
        y = np.zeros(len(x), dtype=np.int32)
        y[-1] = evalset.targets[k]
        inputs.append(x)
        targets.append(y)
        if input_times is not None:
            input_times.append(np.asarray(evalset.history_times[k][-max_len:], dtype=np.int64))
    return inputs, input_times, targets


def plan_batches(lengths, token_capacity, row_capacity, rng=None, window=64):
    """Partition all example indices into batches of whole sequences.

    Each batch holds at most ``token_capacity`` tokens and ``row_capacity`` rows.
    The order is shuffled by ``rng`` (None keeps it); each batch takes the next
    example, then first-fits later ones from a look-ahead window to fill the gap.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if row_capacity < 1 or token_capacity < 1:
        raise ValueError("token_capacity and row_capacity must be >= 1")
    too_long = np.flatnonzero(lengths > token_capacity)
    if len(too_long):
        k = int(too_long[0])
        raise ValueError(f"example {k} has length {lengths[k]}, more than token_capacity {token_capacity}")
    if len(lengths) and lengths.min() < 0:
        raise ValueError("lengths must be >= 0")
    n = len(lengths)
    order = (np.arange(n) if rng is None else rng.permutation(n)).tolist()
    lens = lengths[order].tolist() if n else []
    window = max(1, int(window))
    batches = []
    pending, nxt = [], 0  # pending: positions into `order`, kept in order
    while nxt < n or pending:
        while len(pending) < window and nxt < n:
            pending.append(nxt)
            nxt += 1
        room, batch, j = token_capacity, [], 0
        while j < len(pending) and len(batch) < row_capacity:
            p = pending[j]
            if lens[p] <= room:
                batch.append(order[p])
                room -= lens[p]
                del pending[j]  # earlier entries did not fit and room only shrinks: keep j
                if nxt < n:
                    pending.append(nxt)
                    nxt += 1
            else:
                j += 1
        batches.append(np.asarray(batch, dtype=np.int64))
    return batches


def batch_frame(indices, lens, token_capacity, row_capacity):
    """The fixed-shape arrays of a batch of `indices` (lens: their lengths), capacity-checked: zeroed token
    arrays (ids, targets, times, positions), offsets and rows filled in -> (total, ids, tgt, times,
    positions, offsets, rows). Shared by build_batch and the gathering packer (mindgr.train.data)."""
    nrows = len(indices)
    if nrows > row_capacity:
        raise ValueError(f"{nrows} examples exceed row_capacity {row_capacity}")
    total = int(lens.sum())
    if total > token_capacity:
        raise ValueError(f"{total} tokens exceed token_capacity {token_capacity}")
    ids = np.zeros(token_capacity, dtype=np.int32)
    tgt = np.zeros(token_capacity, dtype=np.int32)
    times = np.zeros(token_capacity, dtype=np.int64)
    positions = np.zeros(token_capacity, dtype=np.int32)
    offsets = np.full(row_capacity + 1, total, dtype=np.int32)
    rows = np.full(row_capacity, -1, dtype=np.int64)
    offsets[0] = 0
    offsets[1:nrows + 1] = np.cumsum(lens)
    rows[:nrows] = indices
    return total, ids, tgt, times, positions, offsets, rows


def row_request_times(indices, lens, offsets, times, row_capacity, request_times=None, has_times=True):
    """int64 [row_capacity]: each row's request time (request_times[example], else its last input time when
    the data has times, else 0); padding rows 0."""
    nrows = len(indices)
    req = np.zeros(row_capacity, dtype=np.int64)
    if nrows:
        if request_times is not None:
            req[:nrows] = np.asarray(request_times, dtype=np.int64)[indices]
        elif has_times:
            req[:nrows] = np.where(lens > 0, times[np.maximum(offsets[1:nrows + 1] - 1, 0)], 0)
    return req


def build_batch(indices, inputs, input_times, targets, token_capacity, row_capacity, request_times=None):
    """Pack the given examples into fixed-shape arrays (see JaggedBatch). request_times: int64 per
    example (None: each row's last input time, or 0 without times)."""
    indices = np.asarray(indices, dtype=np.int64)
    lens = np.array([len(inputs[i]) for i in indices], dtype=np.int64)
    total, ids, tgt, times, positions, offsets, rows = batch_frame(indices, lens, token_capacity, row_capacity)
    for i in indices:
        if len(targets[i]) != len(inputs[i]):
            raise ValueError(f"example {i}: {len(targets[i])} targets for {len(inputs[i])} inputs")
    nrows = len(indices)
    if total:
        ids[:total] = np.concatenate([inputs[i] for i in indices])
        tgt[:total] = np.concatenate([targets[i] for i in indices])
        if input_times is not None:
            times[:total] = np.concatenate([input_times[i] for i in indices])
        positions[:total] = np.arange(total) - np.repeat(offsets[:nrows], lens)
    req = row_request_times(indices, lens, offsets, times, row_capacity, request_times, input_times is not None)
    return JaggedBatch(ids=ids, targets=tgt, timestamps=times, offsets=offsets, positions=positions,
                       rows=rows, num_tokens=total, num_rows=nrows, request_times=req)


def _round_up(x, multiple):
    return int(math.ceil(x / multiple) * multiple)


def auto_capacities(lengths, batch_size, max_len):
    """(token_capacity, row_capacity) for ~batch_size sequences per batch.

    Rows are sized so the token budget, not the row count, is what fills up.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        raise ValueError("auto_capacities: no examples")
    token_capacity = _round_up(max(batch_size * lengths.mean(), max_len, lengths.max(), 1), 64)
    p5 = max(float(np.percentile(lengths, 5)), 1.0)
    rows = max(min(math.ceil(token_capacity / p5), 4 * batch_size), batch_size)
    return token_capacity, _round_up(rows, 8)


class EpochPlan:
    """The batch plan of any epoch, reproducible from (seed, epoch) alone.

    A resumed run calls ``iter_batches(epoch, start=k)`` to continue exactly at batch k.
    """

    def __init__(self, lengths, token_capacity, row_capacity, seed=0, shuffle=True, window=64):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.token_capacity, self.row_capacity = token_capacity, row_capacity
        self.seed, self.shuffle, self.window = seed, shuffle, window
        self._cache = (None, None)

    def batches(self, epoch):
        if self._cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
            self._cache = (epoch, plan_batches(self.lengths, self.token_capacity, self.row_capacity,
                                               rng=rng, window=self.window))
        return self._cache[1]

    def num_batches(self, epoch):
        return len(self.batches(epoch))

    def iter_batches(self, epoch, start=0):
        """Yield (batch_number, indices) from batch ``start`` of ``epoch``."""
        plan = self.batches(epoch)
        for k in range(start, len(plan)):
            yield k, plan[k]
