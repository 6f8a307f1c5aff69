"""What a decoder exposes to be generated from: the contract the decoding engine (mindgr.generate) relies on.

The engine runs trie-constrained beam search and never looks inside the model: it asks the decoder for
its decoding state and calls prefill once per batch of users, then step once per decoded level. How the
state is kept is the model's business: the HSTU GR decoder keeps the prompt's K/V once and each beam's
tokens in append-only records (mindgr.models.kv_cache); the linear-attention decoder keeps one recurrent
prompt state per user and the same kind of records (OneLA, mindgr.models.linear_decode). A new backbone
implements this in its own model file.

A generative decoder has
    num_levels, level_offsets [Lt + 1]       the code layout (global code id = level_offsets[l] + code)
    trie_softmax                             its scoring rule: renormalise each step over the trie's children
    prompts(histories, codes, max_prompt_tokens) -> [per user prompt]   (the input of prefill)
    decode_state(num_users, beam, max_prompt_tokens, runner=None) -> DecodeState
    (layout= one of the backbone's layouts, named by the engine's cache=: "shared" (the default) and
    "per_beam" for both backbones, "replay" for linear attention; a one-line ValueError for another)
and, for the engine's recompute baseline (mindgr.models.generative.RecomputeScorer), the plain forward
construct(slots, merged, offsets) -> hidden and logits(hidden).
"""
from __future__ import annotations

import abc
import time

import numpy as np

GENERATOR_ATTRIBUTES = ("num_levels", "level_offsets", "trie_softmax", "prompts", "decode_state")


def _inline(fn, *args):
    """The default runner: a model call on the calling thread."""
    return fn(*args)


class DecodeState(abc.ABC):
    """A decoder's serving state for a fixed batch capacity of users x beam.

    runner(fn, *args) -> fn(*args) is where the model calls run (the calling thread by default; a server
    passes one model thread so that the host work of one batch overlaps the model compute of another).
    `timings` holds the seconds spent in "prefill" and "step" model calls."""

    timings: dict

    def __init__(self, decoder, num_users: int, beam: int, p_cap: int, runner=None, bounded_positions: bool = True):
        """What every state holds: the decoder, the capacities (users x beam, prompt tokens), the runner and
        the timings. bounded_positions: the prompt and the decoded codes must fit the decoder's max_len
        positions (a ValueError otherwise)."""
        self.dec, self.u, self.b, self.p = decoder, num_users, beam, p_cap
        self.run = runner or _inline
        self.steps = max(decoder.num_levels - 1, 1)
        self.timings = {"prefill": 0.0, "step": 0.0}
        if bounded_positions and p_cap + decoder.num_levels - 1 > decoder.max_len:
            raise ValueError(f"prompt capacity {p_cap} + {decoder.num_levels - 1} decoded tokens exceeds the "
                             f"decoder's max_len {decoder.max_len}")

    def timed(self, phase: str, fn, *args):
        """fn(*args) on the state's runner, its wall seconds added to timings[phase]."""
        t0 = time.perf_counter()
        out = self.run(fn, *args)
        self.timings[phase] += time.perf_counter() - t0
        return out

    @abc.abstractmethod
    def prefill(self, prompts) -> np.ndarray:
        """Encode the users' prompts once (fewer prompts than users: the spare slots repeat one) ->
        level-0 logits [U, sum K]."""

    @abc.abstractmethod
    def step(self, level: int, codes: np.ndarray, parents: list) -> np.ndarray:
        """Level `level` >= 1: codes [U, Bm] chosen at level-1, one per beam; parents[t] [U, Bm] is the beam
        (among level t-1's) each level-t beam forked from, t = 1..level-1 -> logits [U, Bm, sum K]."""

    # Optional (the engine's fast scoring, mindgr.generate.children): a state whose `gives_hidden` is true
    # also has prefill_records(prompts) -> level-0 logits (a prefill for the next two), step_hidden(level,
    # codes, parents) -> the final normalised hidden vectors [U, Bm, D] instead of logits, and
    # head_weights() -> (w_t [sum K, D], bias [sum K]): the code head, applied by the engine to the allowed
    # codes only. Any other state is scored from its step's logits.

    @abc.abstractmethod
    def share_graphs(self, other: "DecodeState"):
        """Run `other`'s compiled graphs (same decoder and shapes): two states, one compile."""

    @abc.abstractmethod
    def nbytes(self) -> dict:
        """Bytes the state holds, by part (e.g. the shared prompt and the per-beam records)."""


def check_generator(decoder):
    """A one-line error when `decoder` does not expose the generation contract."""
    missing = [a for a in GENERATOR_ATTRIBUTES if not hasattr(decoder, a)]
    if missing:
        raise TypeError(f"{type(decoder).__name__} is not a generative decoder: it lacks {', '.join(missing)} "
                        "(mindgr.models.generation)")
