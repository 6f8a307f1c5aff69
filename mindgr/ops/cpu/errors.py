"""Argument errors of the C++ kernels, named in one line.

A kernel that rejects its inputs returns a code from `arg_errors.def` (the list the C++ side compiles into
`enum class mindgr::ArgError`); MindSpore then raises a RuntimeError "Return value from CPU AOT kernel(...)'s
function(<symbol>) is N" with a C++ call stack. `explain` turns that into `KernelArgumentError`:
"<op>: <text> (code N)", the same form for every op; `kernel_errors()` does so around a block of code (the
error surfaces where MindSpore runs the op: at the call in GRAPH mode, at the first read in PyNative).
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from mindgr.ops.cpu.table import op_of_symbol

DEF_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arg_errors.def")

_DEF_LINE = re.compile(r'^MINDGR_ARG_ERROR\(\s*(k\w+)\s*,\s*(\d+)\s*,\s*"([^"\\]*)"\s*\)\s*$')
_AOT_ERROR = re.compile(r"Return value from CPU AOT kernel\(.*?\)'s function\((\w+)\) is (-?\d+)")


@dataclass(frozen=True)
class ArgError:
    name: str   # the C++ enumerator, e.g. "kShape"
    code: int
    text: str


def read_def(path: str = DEF_FILE) -> dict:
    """{code: ArgError} from the .def file; a malformed MINDGR_ARG_ERROR line or a repeated name or code
    is a ValueError (the C++ side would not compile or would be ambiguous)."""
    errors, names = {}, set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("MINDGR_ARG_ERROR"):
                continue
            m = _DEF_LINE.match(line)
            if m is None:
                raise ValueError(f"{path}:{n}: not a MINDGR_ARG_ERROR(kName, code, \"text\") line: {line}")
            err = ArgError(m.group(1), int(m.group(2)), m.group(3))
            if err.code in errors or err.name in names or err.code == 0:
                raise ValueError(f"{path}:{n}: {err.name} = {err.code} repeats a name or code (or is 0)")
            errors[err.code] = err
            names.add(err.name)
    return errors


ARG_ERRORS = read_def()


class KernelArgumentError(ValueError):
    """A C++ kernel rejected its arguments: "<op>: <text> (code N)"."""

    def __init__(self, op: str, code: int):
        err = ARG_ERRORS.get(code)
        self.op, self.code, self.name = op, code, err.name if err else None
        super().__init__(message(op, code))


def message(op: str, code: int) -> str:
    err = ARG_ERRORS.get(code)
    return f"{op}: {err.text if err else 'unknown kernel error'} (code {code})"


def explain(exc) -> KernelArgumentError | None:
    """The one-line error for MindSpore's report of a failing MindGR kernel (an exception or its text),
    None when it is not one."""
    m = _AOT_ERROR.search(str(exc))
    if m is None:
        return None
    op = op_of_symbol(m.group(1))
    if op is None:
        return None
    return KernelArgumentError(op, int(m.group(2)))


@contextlib.contextmanager
def kernel_errors():
    """Re-raise a failing kernel's RuntimeError inside the block as its one-line KernelArgumentError."""
    try:
        yield
    except RuntimeError as exc:
        clear = explain(exc)
        if clear is None:
            raise
        raise clear from None
