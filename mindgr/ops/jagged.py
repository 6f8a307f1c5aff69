"""Jagged <-> padded conversions, dispatched to the configured backend (see mindgr.ops.backend).

jagged_to_padded(values [T, *F], offsets [B+1], max_len) -> [B, N, *F] (zeros past each length)
padded_to_jagged(padded [B, N, *F], offsets [B+1], num_tokens) -> [T, *F] (zeros in the unused tail)
"""
from mindgr.ops import backend, reference


def jagged_to_padded(values, offsets, max_len: int):
    if backend._current == "cpu":
        return backend._cpu.jagged_to_padded(values, offsets, max_len)
    return reference.jagged_to_padded(values, offsets, max_len)


def padded_to_jagged(padded, offsets, num_tokens: int):
    if backend._current == "cpu":
        return backend._cpu.padded_to_jagged(padded, offsets, num_tokens)
    return reference.padded_to_jagged(padded, offsets, num_tokens)
