"""Jagged <-> padded conversions, dispatched through the selected backend's
table (mindgr.ops.backend.ACTIVE).

jagged_to_padded(values [T, *F], offsets [B+1], max_len) -> [B, N, *F] (zeros past each length)
padded_to_jagged(padded [B, N, *F], offsets [B+1], num_tokens) -> [T, *F] (zeros in the unused tail)
"""
from mindgr.ops.backend import ACTIVE, ensure_backend

ensure_backend()  # the reference until the runtime selects a backend


def jagged_to_padded(values, offsets, max_len: int):
    return ACTIVE["jagged_to_padded"](values, offsets, max_len)


def padded_to_jagged(padded, offsets, num_tokens: int):
    return ACTIVE["padded_to_jagged"](padded, offsets, num_tokens)
