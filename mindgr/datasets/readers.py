"""Dataset readers -> SequenceStore (MovieLens-1M, MovieLens-100K, KuaiRand).

Every reader takes ``lenient``. Strict (default): the first bad line raises a
DataError naming the file and 1-based line. Lenient: bad lines are skipped,
counted by reason and the summary is printed to stderr; users left with no
item are dropped and reported too. Nothing is dropped silently.
"""
from .kuairand import read_kuairand
from .movielens import read_movielens_1m, read_movielens_100k

__all__ = ["read_movielens_1m", "read_movielens_100k", "read_kuairand"]
