"""The ops backend registry (mindgr.ops.backend): backends declare the ops they provide, the dispatch
modules read one table, a missing op is one logged line (or an error under strict), a new backend is one
registration, and graph-mode cells bind the selected backend's function when they compile."""
import inspect
import logging
import sys
import types

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn

from mindgr.ops import backend, jagged, reference

pytestmark = pytest.mark.graph_mode("reference")   # the graph test binds backends when its cells compile


@pytest.fixture
def restore_backend():
    previous = backend.get_backend()
    yield
    backend.set_backend(previous)


def _doubling_to_padded(values, offsets, max_len):
    return reference.jagged_to_padded(values, offsets, max_len) * 2


@pytest.fixture
def fake_backend(monkeypatch):
    """A registered backend `fake` that provides one op (jagged_to_padded, doubled so it is visible)."""
    mod = types.ModuleType("mindgr_fake_backend")
    mod.PROVIDES = {"jagged_to_padded": _doubling_to_padded}
    mod.unavailable_reason = lambda: None
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    backend.register_backend("fake", mod.__name__)
    yield mod
    backend.unregister_backend("fake")


def test_reference_provides_every_op_without_fallback(restore_backend):
    assert backend.set_backend("reference") == "reference"
    assert set(backend.ACTIVE) == set(backend.OPS)
    assert backend.fallbacks() == ()
    assert backend.ACTIVE["hstu_attention"] is reference.hstu_attention


def test_builtin_backends_declare_known_ops_with_the_documented_signatures():
    import importlib
    for path in ("mindgr.ops.reference", "mindgr.ops.cpu", "mindgr.ops.ascend"):   # importing builds nothing
        mod = importlib.import_module(path)
        assert set(mod.PROVIDES) <= set(backend.OPS), path
        for op, fn in mod.PROVIDES.items():
            want = backend.OPS[op].split(")")[0].strip("(").split(", ")
            got = list(inspect.signature(fn).parameters)
            assert got == want, f"{path}.{op}{got} != {want}"
    import mindgr.ops.ascend as ascend
    assert set(backend.OPS) - set(ascend.PROVIDES) == {"bias_attention", "softmax_attention", "jagged_to_padded",
                                                         "padded_to_jagged", "sampled_logits", "sampled_lse",
                                                         "shared_pool_lse", "layer_norm", "gated_layer_norm",
                                                         "l2_normalize", "silu_split", "linear_attention"}


def test_missing_ops_fall_back_with_one_logged_line(fake_backend, restore_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="mindgr.ops"):
        assert backend.set_backend("fake") == "fake"
    lines = [r.getMessage() for r in caplog.records if r.name == "mindgr.ops"]
    assert len(lines) == 1
    missing = sorted(set(backend.OPS) - {"jagged_to_padded"})
    # the attention ops are named when a model that calls them is built, not when the backend is set
    assert all(op in lines[0] for op in set(missing) - backend.NOTED_AT_USE) and "jagged_to_padded" not in lines[0]
    assert not any(op in lines[0] for op in backend.NOTED_AT_USE)
    assert "reference" in lines[0]
    assert sorted(backend.fallbacks()) == missing
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mindgr.ops"):
        backend.note_uses("softmax_attention")
        backend.note_uses("softmax_attention")          # once per process
    lines = [r.getMessage() for r in caplog.records if r.name == "mindgr.ops"]
    assert lines == ["ops backend fake: softmax_attention not provided, using the reference"]
    assert backend.ACTIVE["jagged_to_padded"] is _doubling_to_padded
    assert backend.ACTIVE["hstu_attention"] is reference.hstu_attention


def test_strict_backend_names_the_missing_ops(fake_backend, restore_backend):
    with pytest.raises(backend.BackendUnavailable, match="fake does not provide hstu_attention, bias_attention, softmax"):
        backend.set_backend("fake", strict=True)


def test_unknown_unavailable_and_malformed_backends_are_one_line_errors(monkeypatch, restore_backend):
    with pytest.raises(backend.BackendUnavailable, match="unknown backend \\(expected one of reference, cpu, "):
        backend.set_backend("tpu")
    with pytest.raises(backend.BackendUnavailable, match="ops.backend = ascend: the device is CPU, not Ascend"):
        backend.set_backend("ascend")
    bad = types.ModuleType("mindgr_bad_backend")
    bad.PROVIDES = {"flash_attention": _doubling_to_padded}
    bad.unavailable_reason = lambda: None
    monkeypatch.setitem(sys.modules, bad.__name__, bad)
    backend.register_backend("bad", bad.__name__)
    try:
        with pytest.raises(backend.BackendUnavailable, match="provides unknown ops flash_attention"):
            backend.set_backend("bad")
    finally:
        backend.unregister_backend("bad")
    assert backend.get_backend() != "bad"
    with pytest.raises(ValueError):
        backend.unregister_backend("reference")


class _ToPadded(nn.Cell):
    def construct(self, values, offsets):
        return jagged.jagged_to_padded(values, offsets, 4)


def test_graph_cells_bind_the_backend_selected_when_they_compile(fake_backend, restore_backend):
    values = ms.Tensor(np.arange(1, 7, dtype=np.float32).reshape(6, 1))
    offsets = ms.Tensor(np.array([0, 2, 6], np.int32))
    backend.set_backend("reference")
    plain = _ToPadded()(values, offsets).asnumpy()
    backend.set_backend("fake")
    doubled = _ToPadded()(values, offsets).asnumpy()
    np.testing.assert_array_equal(doubled, 2 * plain)
    np.testing.assert_array_equal(plain[0, :2, 0], [1, 2])


def test_an_attention_fallback_is_named_only_when_a_model_calls_it(fake_backend, restore_backend, caplog):
    """The fake backend lacks every attention op: building HSTU names hstu_attention only, SASRec then adds
    softmax_attention; setting the backend names neither."""
    import numpy as np
    from mindgr.models.hstu import HSTUBlock
    from mindgr.models.sasrec import SASRecBlock
    with caplog.at_level(logging.WARNING, logger="mindgr.ops"):
        backend.set_backend("fake")
        caplog.clear()
        HSTUBlock(np.random.default_rng(0), 8, 1, 8, 8, 10, 16, True, "b")
        SASRecBlock(np.random.default_rng(0), 8, 1, 8, 10, "s")
    lines = [r.getMessage() for r in caplog.records if r.name == "mindgr.ops"]
    assert lines == ["ops backend fake: hstu_attention not provided, using the reference",
                     "ops backend fake: softmax_attention not provided, using the reference"]
