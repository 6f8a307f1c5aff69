"""Semantic-ID tokenizer: k-means back ends agree, codes are deterministic and unique, bad input is one line."""
import numpy as np
import pytest

from mindgr.ids.tokenizer import (TokenizerError, dedup_digit, kmeans, kmeans_pp_init, l2_normalize, lloyd_faiss,
                                  lloyd_numpy, tokenize)


def clustered(num_clusters=8, per_cluster=40, dim=16, spread=0.05, seed=0):
    """Points around well-separated unit centres, and each point's true cluster."""
    rng = np.random.default_rng(seed)
    centres = l2_normalize(rng.normal(size=(num_clusters, dim)))
    labels = np.repeat(np.arange(num_clusters), per_cluster)
    x = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    perm = rng.permutation(len(x))
    return x[perm], labels[perm]


def same_partition(a, b):
    """True when the two labelings group the points identically (labels may be renamed)."""
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_numpy_and_faiss_agree_on_an_easy_clustered_case():
    x, labels = clustered()
    init = kmeans_pp_init(x, 8, np.random.default_rng(3))
    c_np, c_fa = lloyd_numpy(x, init, 25), lloyd_faiss(x, init, 25, seed=1)
    a_np = ((x[:, None] - c_np[None]) ** 2).sum(-1).argmin(1)
    a_fa = ((x[:, None] - c_fa[None]) ** 2).sum(-1).argmin(1)
    assert np.array_equal(a_np, a_fa)
    np.testing.assert_allclose(c_np, c_fa, atol=1e-5)   # faiss works in float32
    assert same_partition(a_np, labels)                 # and both found the true clusters
    t_np = tokenize(x, levels=2, codes=8, seed=5, backend="numpy")
    t_fa = tokenize(x, levels=2, codes=8, seed=5, backend="faiss")
    assert np.array_equal(t_np.codes, t_fa.codes)


def test_faiss_is_deterministic_with_a_fixed_seed():
    x = np.random.default_rng(1).normal(size=(600, 12))
    a = kmeans(x, 16, seed=(4, 0), backend="faiss")
    b = kmeans(x, 16, seed=(4, 0), backend="faiss")
    assert np.array_equal(a, b)


@pytest.mark.parametrize("backend", ["numpy", "faiss"])
def test_same_seed_same_codes_different_seed_differs(backend):
    x = np.random.default_rng(2).normal(size=(500, 16))
    a = tokenize(x, levels=3, codes=8, seed=0, backend=backend)
    b = tokenize(x, levels=3, codes=8, seed=0, backend=backend)
    c = tokenize(x, levels=3, codes=8, seed=1, backend=backend)
    assert np.array_equal(a.codes, b.codes) and a.stats["distinct_tuples"] == b.stats["distinct_tuples"]
    assert not np.array_equal(a.codes, c.codes)


def test_every_item_gets_one_unique_tuple_and_the_digit_ranks_by_item_id():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 8))
    x[[10, 50, 120, 199]] = x[10]          # four identical vectors: one bucket of (at least) four
    t = tokenize(x, levels=2, codes=4, seed=0)
    codes = t.codes
    assert codes.shape == (201, 3) and codes.dtype == np.int32 and not codes[0].any()
    assert len(np.unique(codes[1:], axis=0)) == 200
    assert np.array_equal(codes[[11, 51, 121, 200], :2], np.repeat(codes[11:12, :2], 4, 0))
    bucket = np.flatnonzero((codes[1:, :2] == codes[11, :2]).all(1)) + 1    # items in increasing id order
    assert list(codes[bucket, 2]) == list(range(len(bucket)))
    assert t.stats["largest_bucket"] == t.level_sizes[-1] == (codes[1:, 2].max() + 1)
    assert list(t.level_sizes[:2]) == [4, 4]
    assert t.stats["distinct_tuples"] == len(np.unique(codes[1:, :2], axis=0))
    assert t.stats["collided_items"] == int((codes[1:, 2] > 0).sum())
    assert t.stats["usage"] == [len(np.unique(codes[1:, j])) for j in range(2)]


def test_level_statistics_match_a_direct_computation():
    x, _ = clustered(num_clusters=6, per_cluster=30, dim=10, spread=0.2, seed=4)
    t = tokenize(x, levels=1, codes=6, seed=0, backend="numpy")
    u = l2_normalize(x)
    level = t.codes[1:, 0]
    means = np.stack([u[level == c].mean(0) for c in range(6)])
    assert t.stats["quantization_error"][0] == pytest.approx(((u - means[level]) ** 2).sum(1).mean(), rel=1e-9)


def test_dedup_digit_reference():
    prefix = np.array([[1, 2], [0, 0], [1, 2], [3, 1], [1, 2], [0, 0]])
    digit, largest, codes = dedup_digit(prefix)
    assert list(digit) == [0, 0, 1, 0, 2, 1] and largest == 3 and codes == (1, 2)


def test_a_configured_range_is_kept_and_overflow_is_one_line():
    x = np.random.default_rng(5).normal(size=(100, 6))
    x[:5] = x[0]                                                   # a bucket of (at least) five
    sized = tokenize(x, levels=2, codes=4)
    largest = sized.stats["largest_bucket"]
    assert largest >= 5 and sized.level_sizes[-1] == largest
    wide = tokenize(x, levels=2, codes=4, dedup_range=largest + 4)
    assert wide.level_sizes[-1] == largest + 4 and np.array_equal(wide.codes, sized.codes)
    with pytest.raises(TokenizerError, match=rf"{largest} items share the codes .* range {largest - 1}: "
                                             rf"raise --dedup-range to >= {largest}") as e:
        tokenize(x, levels=2, codes=4, dedup_range=largest - 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("vectors, codes, words", [
    (np.array([[0.0, 1.0], [np.nan, 1.0], [1.0, 0.0]]), 2, "NaN or inf (first: row 1)"),
    (np.ones((5, 3)), 8, "8 codes per level but only 5 items"),
    (np.zeros((0, 4)), 2, "non-empty [items, dim]"),
    (np.ones(7), 2, "non-empty [items, dim]"),
])
def test_bad_inputs_are_one_line_errors(vectors, codes, words):
    with pytest.raises(TokenizerError) as e:
        tokenize(vectors, levels=2, codes=codes)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bad_settings_are_one_line_errors():
    x = np.ones((10, 2))
    with pytest.raises(TokenizerError, match="levels = 0"):
        tokenize(x, levels=0, codes=2)
    with pytest.raises(TokenizerError, match="backend 'gpu'"):
        kmeans(x, 2, 0, backend="gpu")


def test_normalising_makes_codes_independent_of_vector_lengths():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(300, 8))
    scaled = x * rng.uniform(0.1, 10.0, size=(300, 1))
    assert np.array_equal(tokenize(x, levels=2, codes=6).codes, tokenize(scaled, levels=2, codes=6).codes)
    raw = tokenize(scaled, levels=2, codes=6, normalize=False)
    assert not np.array_equal(raw.codes, tokenize(x, levels=2, codes=6).codes) and raw.stats["normalize"] is False
