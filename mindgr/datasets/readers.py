"""Dataset readers -> SequenceStore (MovieLens-1M, MovieLens-100K, KuaiRand, users' own sequences / csv).

Every reader takes ``lenient``. Strict (default): the first bad line raises a
DataError naming the file and 1-based line. Lenient: bad lines are skipped,
counted by reason and the summary is printed to stderr; users left with no
item are dropped and reported too. Nothing is dropped silently.
"""
from .csvlog import read_csv_log
from .kuairand import read_kuairand
from .movielens import read_movielens_1m, read_movielens_100k
from .sequences import read_sequences

__all__ = ["read_movielens_1m", "read_movielens_100k", "read_kuairand", "read_sequences", "read_csv_log"]
