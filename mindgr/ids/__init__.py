"""Semantic IDs for generative retrieval: item vectors -> residual k-means codes + a de-duplication digit.

tokenizer.py (the clustering), codes.py (the Parquet table and its stats), vectors.py (a run's item table
or a user file), command.py (`mindgr ids build`). Sits above train (it reads checkpoints), below cli.
"""
from mindgr.ids.codes import load_codes, save_codes
from mindgr.ids.tokenizer import Tokenization, TokenizerError, tokenize

__all__ = ["load_codes", "save_codes", "tokenize", "Tokenization", "TokenizerError"]
