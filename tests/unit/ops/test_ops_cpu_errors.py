"""The kernels' argument errors: one list (mindgr/ops/cpu/arg_errors.def) read by the C++ build and by
Python, and one one-line message form "<op>: <text> (code N)" whatever op rejects its inputs. Also the
kernel table (mindgr/ops/cpu/table.py) against the primitives the package creates."""
import ctypes
import glob
import os
import re

import numpy as np
import pytest

from ops_fixtures import needs_compiler, pynative  # noqa: F401

pytestmark = [needs_compiler, pytest.mark.graph_mode("cpu")]

from mindspore import Tensor  # noqa: E402

from mindgr.ops import cpu  # noqa: E402
from mindgr.ops.cpu import errors, table  # noqa: E402

CPU_DIR = os.path.dirname(cpu.__file__)


def test_python_table_and_compiled_enum_agree():
    lib = ctypes.CDLL(cpu.library_path())
    for fn in (lib.mindgr_arg_error_name, lib.mindgr_arg_error_text):
        fn.argtypes, fn.restype = (ctypes.c_int,), ctypes.c_char_p
    compiled = {}
    for code in range(-1, 256):
        name = lib.mindgr_arg_error_name(code)
        if name is not None:
            compiled[code] = (name.decode(), lib.mindgr_arg_error_text(code).decode())
    assert compiled == {c: (e.name, e.text) for c, e in errors.ARG_ERRORS.items()}
    assert {10, 13, 17, 99} <= set(compiled)   # the codes MindSpore users have seen stay


def test_a_malformed_def_line_is_an_error(tmp_path):
    bad = tmp_path / "x.def"
    bad.write_text('MINDGR_ARG_ERROR(kA, 10, "a")\nMINDGR_ARG_ERROR(kB, 10, "b")\n')
    with pytest.raises(ValueError, match="repeats"):
        errors.read_def(str(bad))
    bad.write_text('MINDGR_ARG_ERROR(kA, ten, "a")\n')
    with pytest.raises(ValueError, match="not a MINDGR_ARG_ERROR"):
        errors.read_def(str(bad))


def test_entry_points_return_only_named_codes():
    """Every error code a kernel source returns (10 and up) goes through MINDGR_REJECT_IF / MINDGR_FAIL."""
    bare = []
    for path in sorted(glob.glob(os.path.join(CPU_DIR, "*.cc"))):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if re.search(r"\breturn\s+(?:[^;?]*\?\s*)?[1-9]\d+\s*[;:]", line):
                    bare.append(f"{os.path.basename(path)}:{n}: {line.strip()}")
    assert not bare, bare


def test_every_primitive_comes_from_the_table():
    """No kernel symbol is written by hand in the package: the primitives and bprops are the table's."""
    with open(os.path.join(CPU_DIR, "__init__.py"), encoding="utf-8") as f:
        assert not re.findall(r'"Mindgr\w+"', f.read())
    lib = ctypes.CDLL(cpu.library_path())
    for name in table.kernel_symbols() + table.HELPERS:
        getattr(lib, name)
    listing = table.describe().splitlines()
    assert len(listing) == len(table.TABLE) and all(row.forward in line for row, line in zip(table.TABLE, listing))
    for row in table.TABLE:
        assert set(row.grads) <= set(row.inputs) and set(row.cast_grads) <= set(row.grads), row.key
        assert row.op in cpu.PROVIDES, row.key
    assert {row.op for row in table.TABLE} == set(cpu.PROVIDES)


def _one_line_error(fn, op, code):
    with pytest.raises(errors.KernelArgumentError) as info:
        with errors.kernel_errors():
            out = fn()
            for o in out if isinstance(out, tuple) else (out,):
                o.asnumpy()
    text = str(info.value)
    assert text == f"{op}: {errors.ARG_ERRORS[code].text} (code {code})"
    assert "\n" not in text and info.value.code == code and info.value.op == op
    return text


@pynative
def test_bad_offsets_shapes_and_ids_give_one_line_from_every_op():
    rng = np.random.default_rng(0)
    T, H, D = 6, 2, 4
    q, k, v = (Tensor(rng.standard_normal((T, H, D)).astype(np.float32)) for _ in range(3))
    bad_off = Tensor(np.array([0, 4, 2], np.int32))          # not non-decreasing
    ts = Tensor(np.arange(T, dtype=np.int64))
    w_pos = Tensor(np.zeros(7, np.float32))
    w_ts = Tensor(np.zeros(5, np.float32))
    seen = [
        _one_line_error(lambda: cpu.hstu_attention(q, k, v, bad_off, ts, w_pos, w_ts, 4), "hstu_attention", 17),
        _one_line_error(lambda: cpu.hstu_attention(q, k, v, bad_off, ts, w_pos, None, 4), "hstu_attention", 17),
        _one_line_error(lambda: cpu.bias_attention(v, bad_off, ts, w_pos, None, 4), "bias_attention", 17),
        _one_line_error(lambda: cpu.softmax_attention(q, k, v, bad_off, 4), "softmax_attention", 17),
        _one_line_error(lambda: cpu.jagged_to_padded(v, bad_off, 4), "jagged_to_padded", 17),
        _one_line_error(lambda: cpu.linear_attention(q, k, v, bad_off, Tensor(np.zeros(H, np.float32)), None, None, None),
                        "linear_attention", 17),
        # a log_decay of the wrong length
        _one_line_error(lambda: cpu.linear_attention(q, k, v, Tensor(np.array([0, 3, 6], np.int32)),
                                                     Tensor(np.zeros(H + 1, np.float32)), None, None, None),
                        "linear_attention", 13),
        # w_pos shorter than 2 * max_len - 1
        _one_line_error(lambda: cpu.hstu_attention(q, k, v, Tensor(np.array([0, 3, 6], np.int32)), ts,
                                                   Tensor(np.zeros(3, np.float32)), None, 4), "hstu_attention", 18),
        # shapes that do not agree
        _one_line_error(lambda: cpu.gated_layer_norm(Tensor(np.ones((3, 4), np.float32)),
                                                     Tensor(np.ones((3, 5), np.float32))), "gated_layer_norm", 13),
        # an id outside [0, V]
        _one_line_error(lambda: cpu.sampled_logits(Tensor(np.ones((2, 4), np.float32)), Tensor(np.ones((3, 4), np.float32)),
                                                   Tensor(np.array([[0, 1], [2, 3]], np.int32))), "sampled_logits", 17),
    ]
    assert len({s.split(":", 1)[0] for s in seen}) >= 5


def test_explain_leaves_other_errors_alone():
    assert errors.explain(RuntimeError("something else is 17")) is None
    other = "Return value from CPU AOT kernel(/x/lib.so)'s function(NotOurs) is 13. Any return value"
    assert errors.explain(other) is None
    ours = "Return value from CPU AOT kernel(/x/lib.so)'s function(MindgrLayerNormBwd) is 22. Any return value\n..."
    assert str(errors.explain(ours)) == f"layer_norm backward: {errors.ARG_ERRORS[22].text} (code 22)"
    assert str(errors.explain(ours.replace("is 22", "is 55"))) == "layer_norm backward: unknown kernel error (code 55)"
