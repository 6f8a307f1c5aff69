"""Fusion buckets of MindSpore's data-parallel reducer (mindgr.parallel.dp.bucket_splits) against a plain
reference: the fusion ids MindSpore assigns from a split list, rebuilt here in a loop."""
import numpy as np
import pytest

from mindgr.parallel.dp import bucket_splits


def fusion_ids(n: int, splits: list[int]) -> list[int]:
    """What nn.DistributedGradReducer does with all_reduce_fusion_config: tensor i keeps the current id,
    and a new id starts after every listed index."""
    ids, current, k = [], 0, 0
    for i in range(n):
        ids.append(current)
        if k < len(splits) and splits[k] <= i:
            current, k = current + 1, k + 1
    return ids


@pytest.mark.parametrize("seed", range(40))
def test_buckets_are_contiguous_nonempty_and_about_equal(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    sizes = rng.integers(1, 5000, n) * (rng.random(n) < 0.8) + 1     # some tensors of one element
    k = int(rng.integers(1, 9))
    splits = bucket_splits(sizes, k)
    want = min(k, n)
    assert len(splits) == want - 1
    assert splits == sorted(set(splits)) and all(0 <= s <= n - 2 for s in splits)
    ids = fusion_ids(n, splits)
    assert sorted(set(ids)) == list(range(want)) and ids == sorted(ids)      # contiguous, none empty
    totals = np.array([sizes[np.array(ids) == b].sum() for b in range(want)])
    # A bucket ends at the first tensor that reaches its share of the total, unless later buckets need the
    # tensors: no bucket overshoots the share by more than one tensor, except to keep the others non-empty.
    share = sizes.sum() / want
    if want >= 2 and n >= 2 * want:
        assert totals[:-1].max() <= share + sizes.max(), (sizes, splits, totals)


def test_one_bucket_and_the_model_shapes():
    assert bucket_splits([10, 20, 30], 1) == [] and bucket_splits([10, 20, 30], 0) == []
    assert bucket_splits([5], 4) == []
    # the benchmark model: item table, positions, two blocks, and the loss slot
    sizes = [128000, 65536] + [16384, 2047, 129, 4096, 64] * 2 + [1]
    splits = bucket_splits(sizes, 2)
    assert splits == [0]                        # the item table alone holds over half the floats
    assert fusion_ids(len(sizes), bucket_splits(sizes, 4))[-1] == 3
