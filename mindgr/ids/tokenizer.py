"""Semantic-ID tokenizer: residual k-means over item vectors, then a de-duplication digit.

Level l clusters the L2-normalised residual left by levels 0..l-1 into K codes; the vectors themselves are
normalised first too (on Beauty normalising cut the largest collision bucket from 168 items to 34, see
issue 17). Items whose L codes collide get a final digit: their rank inside the bucket, by item id, so
every item has a unique tuple of L+1 codes.

Two k-means back ends share one (greedy) k-means++ initialisation (ours, seeded): numpy (small inputs, tests) and
faiss-cpu (large inputs, single thread so that a fixed seed gives the same codes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

FAISS_MIN_POINTS = 5_000   # "auto" uses faiss from this many vectors on (3-4x faster than numpy at 12k)


class TokenizerError(ValueError):
    """Bad tokenizer input or settings; the message is one line."""


@dataclass
class Tokenization:
    """codes [V+1, L+1] int32 (row 0 = padding item, all zeros); level_sizes [L+1] (K per level, then the
    digit's range); stats: what `mindgr ids build` prints and codes.py saves beside the table."""
    codes: np.ndarray
    level_sizes: np.ndarray
    stats: dict = field(default_factory=dict)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)   # a zero row stays zero


def _sq_dists(x: np.ndarray, c: np.ndarray, xx: np.ndarray | None = None) -> np.ndarray:
    """[n, k] squared euclidean distances (clipped at 0 against round-off); xx: the rows' squared norms."""
    xx = (x * x).sum(1) if xx is None else xx
    d = xx[:, None] - 2.0 * (x @ c.T) + (c * c).sum(1)[None, :]
    return np.maximum(d, 0.0)


def kmeans_pp_init(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Greedy k-means++ seeding: each next centre is the best (lowest total D^2) of a few candidates drawn
    with probability proportional to D(x)^2; plain k-means++ (one candidate) often puts two centres in one
    cluster and leaves another without."""
    n = len(x)
    trials = 2 + int(np.log(k))
    centres = np.empty((k, x.shape[1]), x.dtype)
    centres[0] = x[rng.integers(n)]
    xx = (x * x).sum(1)
    closest = _sq_dists(x, centres[:1], xx)[:, 0]
    for j in range(1, k):
        total = closest.sum()
        if total <= 0:   # every point already sits on a centre (fewer distinct points than k)
            picks = rng.integers(n, size=1)
        else:
            picks = np.minimum(np.searchsorted(np.cumsum(closest), rng.random(trials) * total), n - 1)
        candidates = np.minimum(closest[None, :], _sq_dists(x, x[picks], xx).T)   # [trials, n]
        best = int(candidates.sum(1).argmin())
        centres[j] = x[picks[best]]
        closest = candidates[best]
    return centres


def lloyd_numpy(x: np.ndarray, centres: np.ndarray, iters: int) -> np.ndarray:
    """Plain Lloyd iterations from `centres`; an empty cluster keeps its centre. Returns the centres."""
    centres = centres.copy()
    k = len(centres)
    assign = None
    xx = (x * x).sum(1)
    for _ in range(iters):
        new = _sq_dists(x, centres, xx).argmin(1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        counts = np.bincount(assign, minlength=k)
        # per-dimension bincounts: much faster than np.add.at, no [n, k] one-hot
        sums = np.stack([np.bincount(assign, weights=x[:, d], minlength=k) for d in range(x.shape[1])], 1)
        filled = counts > 0
        centres[filled] = sums[filled] / counts[filled, None]
    return centres


def lloyd_faiss(x: np.ndarray, centres: np.ndarray, iters: int, seed: int) -> np.ndarray:
    """faiss-cpu's k-means from our centres, one thread (its multi-threaded sums are order dependent)."""
    import faiss
    faiss.omp_set_num_threads(1)
    k, d = centres.shape
    km = faiss.Kmeans(d, k, niter=iters, seed=seed, verbose=False, spherical=False,
                      max_points_per_centroid=max(256, len(x)),  # no subsampling: use every vector
                      min_points_per_centroid=1)
    km.train(np.ascontiguousarray(x, np.float32), init_centroids=np.ascontiguousarray(centres, np.float32))
    return np.asarray(km.centroids, np.float64)


def _have_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, num_points: int) -> str:
    """auto: faiss-cpu from FAISS_MIN_POINTS vectors on when it is installed (same seeding, same Lloyd
    steps: the codes agree with numpy's on Beauty), numpy otherwise."""
    if backend not in ("auto", "numpy", "faiss"):
        raise TokenizerError(f"ids: k-means backend {backend!r}: expected auto, numpy or faiss")
    if backend == "auto":
        return "faiss" if num_points >= FAISS_MIN_POINTS and _have_faiss() else "numpy"
    if backend == "faiss" and not _have_faiss():
        raise TokenizerError("ids: k-means backend faiss: faiss-cpu is not installed (pip install faiss-cpu, "
                             "or use --backend numpy)")
    return backend


def kmeans(x: np.ndarray, k: int, seed, iters: int = 25, backend: str = "auto") -> np.ndarray:
    """[k, d] centres of `x` [n, d]: k-means++ seeded by `seed` (an int or a tuple of ints), then Lloyd
    on the chosen back end."""
    backend = resolve_backend(backend, len(x))
    x = np.asarray(x, np.float64)
    rng = np.random.default_rng(seed)
    init = kmeans_pp_init(x, k, rng)
    if backend == "faiss":   # faiss draws from its seed only to split a big cluster into an empty one
        return lloyd_faiss(x, init, iters, int(rng.integers(2 ** 31)))
    return lloyd_numpy(x, init, iters)


def assign(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    return _sq_dists(np.asarray(x, np.float64), np.asarray(centres, np.float64)).argmin(1)


def check_vectors(vectors: np.ndarray, codes: int, where: str = "vectors") -> np.ndarray:
    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
        raise TokenizerError(f"ids: {where}: expected a non-empty [items, dim] table, got shape {v.shape}")
    if not np.issubdtype(v.dtype, np.number):
        raise TokenizerError(f"ids: {where}: vectors must be numbers, got dtype {v.dtype}")
    v = v.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(v).all(1))
    if len(bad):
        raise TokenizerError(f"ids: {where}: {len(bad)} vector(s) hold NaN or inf (first: row {int(bad[0])})")
    if codes > len(v):
        raise TokenizerError(f"ids: {codes} codes per level but only {len(v)} items: use --codes <= {len(v)}")
    return v


def dedup_digit(prefix: np.ndarray) -> tuple[np.ndarray, int, tuple]:
    """Rank of each row within its group of equal rows of `prefix` [V, L], in row order (= item id).
    Returns (digit [V], largest group size, codes of one largest group)."""
    _, group, counts = np.unique(prefix, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")          # rows of each group together, by item id
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    digit = np.empty(len(prefix), np.int64)
    digit[order] = np.arange(len(prefix)) - np.repeat(starts, counts)
    big = int(counts.argmax())
    return digit, int(counts[big]), tuple(int(c) for c in prefix[order[starts[big]]])


def tokenize(vectors: np.ndarray, levels: int = 3, codes: int = 256, seed: int = 0, dedup_range: int = 0,
             iters: int = 25, backend: str = "auto", normalize: bool = True) -> Tokenization:
    """Semantic IDs of items 1..V from `vectors` [V, D] (row i = item i+1).

    dedup_range: the de-duplication digit's range; 0 sizes it from the data (the largest collision bucket).
    normalize: L2-normalise the vectors and every level's residual before clustering it.
    """
    if levels < 1 or codes < 1 or iters < 1:
        raise TokenizerError(f"ids: levels = {levels}, codes = {codes}, iters = {iters}: each must be >= 1")
    if dedup_range < 0:
        raise TokenizerError(f"ids: de-duplication range {dedup_range}: must be >= 1, or 0 (from the data)")
    x = check_vectors(vectors, codes)
    backend = resolve_backend(backend, len(x))
    started = time.perf_counter()
    prefix = np.empty((len(x), levels), np.int64)
    usage, errors = [], []
    residual = x
    for level in range(levels):
        if normalize:
            residual = l2_normalize(residual)
        centres = kmeans(residual, codes, (seed, level), iters, backend)
        prefix[:, level] = assign(residual, centres)
        residual = residual - centres[prefix[:, level]]
        usage.append(int(len(np.unique(prefix[:, level]))))
        errors.append(float((residual * residual).sum(1).mean()))
    digit, largest, largest_codes = dedup_digit(prefix)
    distinct = int(len(np.unique(prefix, axis=0)))
    size = dedup_range or largest
    if largest > size:
        raise TokenizerError(f"ids: {largest} items share the codes {largest_codes}, more than the "
                             f"de-duplication digit's range {size}: raise --dedup-range to >= {largest} "
                             f"or use more codes/levels")
    table = np.zeros((len(x) + 1, levels + 1), np.int32)
    table[1:, :levels] = prefix
    table[1:, levels] = digit
    stats = {
        "items": int(len(x)), "dim": int(x.shape[1]), "levels": levels, "codes": codes, "seed": seed,
        "normalize": normalize, "backend": backend, "iters": iters,
        "distinct_tuples": distinct,                 # distinct L-code tuples before the digit
        "largest_bucket": largest,                   # the most items sharing one L-code tuple
        "dedup_range": int(size),
        "collided_items": int((digit > 0).sum()),    # items that needed a digit > 0
        "usage": usage,                              # codes used per level (of K)
        # mean squared distance of each level's (normalised) input to its code's centre
        "quantization_error": errors,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return Tokenization(table, np.array([codes] * levels + [size], np.int64), stats)
