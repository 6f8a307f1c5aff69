"""Data pipeline: raw logs -> SequenceStore -> leave-one-out split -> fixed-shape jagged batches.

Pure numpy/pyarrow (no MindSpore) so it can be tested and run anywhere.
"""
from .errors import DataError, SkipCounter
from .packer import (EpochPlan, JaggedBatch, auto_capacities, build_batch, eval_examples,
                     plan_batches, training_examples, training_request_times)
from .prepare import KINDS, format_summary, prepare, read_any
from .readers import read_csv_log, read_kuairand, read_movielens_1m, read_movielens_100k, read_sequences
from .split import EvalSet, Split, leave_one_out
from .store import SequenceStore, read_store, remap_items, write_store
from .synthetic import generate_synthetic, write_kuairand_csv

__all__ = [
    "DataError", "SkipCounter",
    "SequenceStore", "remap_items", "write_store", "read_store",
    "read_movielens_1m", "read_movielens_100k", "read_kuairand", "read_sequences", "read_csv_log",
    "generate_synthetic", "write_kuairand_csv",
    "Split", "EvalSet", "leave_one_out",
    "JaggedBatch", "training_examples", "training_request_times", "plan_batches", "build_batch", "eval_examples",
    "auto_capacities", "EpochPlan",
    "prepare", "read_any", "format_summary", "KINDS",
]
