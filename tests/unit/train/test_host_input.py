"""Host input, bit for bit: the producer's StepInputs (RetrievalTask.inputs, what LocalExecutor.prepare returns: packed batch, per-token
negatives, dropout masks) equal those of a plain reference (below: the per-row packing, the one uniform
negative draw and the per-row mask conversion as they were before the producer was vectorised), over
every batch of two epochs of synthetic data; evaluation batches too; and the step's tensors share the
host arrays (no copy) with the same dtypes and values as copies."""
from types import SimpleNamespace

import numpy as np
import pytest

from mindgr.config import load_config
from mindgr.datasets import build_batch
from mindgr.train.data import Examples
from mindgr.train.step import StepInputs

pytestmark = pytest.mark.graph_mode("reference")

FIELDS = ("ids", "positions", "offsets", "timestamps", "request_times", "targets", "rows")


# ---- the reference: one example at a time, one (site, token) row at a time ------------------------------
def ref_pack(indices, inputs, times, targets, t_cap, b_cap, request_times=None) -> dict:
    out = {"ids": np.zeros(t_cap, np.int32), "targets": np.zeros(t_cap, np.int32),
           "timestamps": np.zeros(t_cap, np.int64), "positions": np.zeros(t_cap, np.int32),
           "offsets": np.zeros(b_cap + 1, np.int32), "rows": np.full(b_cap, -1, np.int64),
           "request_times": np.zeros(b_cap, np.int64)}
    at = 0
    for r, i in enumerate(indices):
        n = len(inputs[i])
        out["ids"][at: at + n] = inputs[i]
        out["targets"][at: at + n] = targets[i]
        out["positions"][at: at + n] = np.arange(n)
        if times is not None:
            out["timestamps"][at: at + n] = times[i]
        out["rows"][r] = i
        if request_times is not None:
            out["request_times"][r] = request_times[i]
        elif times is not None and n:
            out["request_times"][r] = times[i][-1]
        at += n
        out["offsets"][r + 1] = at
    out["offsets"][len(indices) + 1:] = at
    return out


def ref_negatives(seed, epoch, batch, num_items, t_cap, num_negatives):
    return np.random.default_rng([seed, epoch, batch, 7]).integers(1, num_items + 1, (t_cap, num_negatives),
                                                                  dtype=np.int32)


def ref_masks(seed, epoch, batch, p, sites, t_cap, width):
    words = -(-width // 4)
    raw = np.random.PCG64(np.random.SeedSequence([seed, epoch, batch, 8])).random_raw(sites * t_cap * words)
    units = raw.view(np.uint16).reshape(sites, t_cap, 4 * words)
    out = np.empty((sites, t_cap, width), np.float32)
    keep, scale = np.uint16(min(round(p * 65536), 65535)), np.float32(1.0 / (1.0 - p))
    for s in range(sites):
        for t in range(t_cap):
            out[s, t] = (units[s, t, :width] >= keep) * scale
    return out


def assert_same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    assert np.array_equal(got, want), what


# ---- the producer against it ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def strategy():
    from mindgr.train.local import LocalExecutor
    from mindgr.train.task import RetrievalTask
    cfg = load_config(None, ["data.synthetic.num_users=300", "data.synthetic.num_items=200", "data.max_len=30",
                             "data.synthetic.max_len=30", "data.synthetic.median_len=12", "train.batch_size=16",
                             "loss.num_negatives=16", "model.dropout=0.3", "model.dim=10", "run.seed=3"])
    s = LocalExecutor(cfg, RetrievalTask(cfg))
    s.build_data(None, False)
    s.task.sampler = s.task.make_sampler(SimpleNamespace(dropout_sites=3, dropout_width=10))   # no model needed
    return s


def test_prepared_step_inputs_equal_the_reference(strategy):
    s, tr, cfg = strategy, strategy.data.train, strategy.cfg
    assert tr.times is not None and tr.request_times is not None
    n = 0
    for epoch in (0, 1):
        for b, indices in s.plan.iter_batches(epoch):
            inputs, info = s.prepare(epoch, b, indices)
            want = ref_pack(indices, tr.inputs, tr.times, tr.targets, tr.token_capacity, tr.row_capacity,
                            tr.request_times)
            for name in FIELDS[:-1]:
                assert_same(getattr(inputs, name), want[name], (epoch, b, name))
            assert_same(inputs.negatives[0], ref_negatives(cfg.run.seed, epoch, b, s.data.num_items,
                                                           tr.token_capacity, cfg.loss.num_negatives), "negatives")
            assert_same(inputs.drop, ref_masks(cfg.run.seed, epoch, b, cfg.model.dropout, 3, tr.token_capacity, 10),
                        "masks")
            assert info["tokens"] == want["offsets"][-1] and info["targets"] == int((want["targets"] > 0).sum())
            n += 1
    assert n >= 8


def test_evaluation_batches_equal_the_reference(strategy):
    for name, ex in strategy.data.eval.items():
        for indices in ex.plan():
            batch = ex.batch(indices)
            want = ref_pack(indices, ex.inputs, ex.times, ex.targets, ex.token_capacity, ex.row_capacity,
                            ex.request_times)
            for field in FIELDS:
                assert_same(getattr(batch, field), want[field], (name, field))


@pytest.mark.parametrize("with_times,with_request", [(True, True), (True, False), (False, False)])
def test_packing_edge_cases_equal_build_batch(with_times, with_request):
    rng = np.random.default_rng(0)
    lengths = [0, 1, 5, 0, 17, 3, 1, 9]                       # empty examples included
    inputs = [rng.integers(1, 50, n).astype(np.int32) for n in lengths]
    targets = [rng.integers(0, 50, n).astype(np.int32) for n in lengths]
    times = [np.sort(rng.integers(0, 10 ** 9, n)) for n in lengths] if with_times else None
    request = rng.integers(0, 10 ** 9, len(lengths)) if with_request else None
    ex = Examples(inputs, times, targets, 40, 6, request)
    for indices in ([], [3], [0, 3], [4, 2, 7, 1], [7, 6, 5, 4, 3, 0], [1, 1, 2]):
        got = ex.batch(indices)
        want = build_batch(indices, inputs, times, targets, 40, 6, request)
        for field in FIELDS:
            assert_same(getattr(got, field), getattr(want, field), (indices, field))
        assert (got.num_tokens, got.num_rows) == (want.num_tokens, want.num_rows)
    for bad, message in (([0, 1, 2, 3, 4, 5, 6], "exceed row_capacity"), ([4, 4, 7], "exceed token_capacity")):
        with pytest.raises(ValueError, match=message):
            ex.batch(bad)
    if with_times:                                             # ragged times: build_batch's own error
        ragged = times[:2] + [times[2][:-1]] + times[3:]
        with pytest.raises(ValueError):
            Examples(inputs, ragged, targets, 40, 6, request).batch([1, 2])
    targets[2] = targets[2][:-1]                               # build_batch's own error for a ragged example
    with pytest.raises(ValueError, match="example 2: 4 targets for 5 inputs"):
        Examples(inputs, times, targets, 40, 6, request).batch([1, 2])


def test_step_tensors_share_the_host_arrays():
    rng = np.random.default_rng(1)
    inputs = StepInputs(*(rng.integers(0, 9, 12).astype(np.int32) for _ in range(3)),
                        rng.integers(0, 9, 12), rng.integers(0, 9, 4), rng.integers(0, 9, 12).astype(np.int32),
                        (rng.integers(1, 9, (12, 3)).astype(np.int32),), rng.random((2, 12, 5)).astype(np.float32),
                        np.float32(0.5))
    from mindspore import Tensor
    for array, tensor in zip(inputs.as_tuple(), inputs.tensors()):
        copy = Tensor(array)
        assert tensor.dtype == copy.dtype and tensor.shape == copy.shape
        assert np.array_equal(tensor.asnumpy(), copy.asnumpy())
        if isinstance(array, np.ndarray):
            assert np.shares_memory(tensor.asnumpy(), array)
