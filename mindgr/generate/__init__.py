"""Generation from a decoder: trie-constrained beam search (beam.py, the plain reference) and the decoding
engine (engine.py, its fast path: the decoder's own decoding state, partial top-k, reused trie masks).

Both reach the model only through its generation contract (mindgr.models.generation: prompts,
decode_state -> prefill / step); the semantic-ID pieces they search over (the code table, the prefix trie)
are numpy-only, in mindgr.ids.
"""
from mindgr.generate.beam import BeamError, beam_ranks, beam_search
from mindgr.generate.engine import DecodingEngine

__all__ = ["BeamError", "DecodingEngine", "beam_ranks", "beam_search"]
