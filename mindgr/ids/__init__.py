"""Semantic IDs for generative retrieval, numpy only: item vectors -> residual k-means codes + a
de-duplication digit, and the prefix trie decoding searches over.

tokenizer.py (the clustering), codes.py (the Parquet table and its stats), vectors.py (item vectors from a
user file; a run's item table is read a layer above, mindgr.train.item_table), trie.py (the prefix trie's
keys and valid-next masks). No MindSpore here (tests/unit/repo/test_layers.py checks it): decoding, which runs the
model, is mindgr.generate.
"""
from mindgr.ids.codes import load_codes, save_codes
from mindgr.ids.tokenizer import Tokenization, TokenizerError, tokenize

__all__ = ["load_codes", "save_codes", "tokenize", "Tokenization", "TokenizerError"]
