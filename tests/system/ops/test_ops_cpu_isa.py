"""The C++ kernels' build-time ISA choice (mindgr.ops.cpu.build) and every ISA this machine can run.

build.py reads the compiler's predefined macros under -march=native to pick AVX-512 / AVX2+FMA /
NEON / generic code; MINDGR_CPU_ISA forces a narrower one. The default ISA is exercised by every
other kernel test; here each other ISA the machine offers re-runs the kernel-vs-reference tests in a
subprocess with MINDGR_CPU_ISA set (one library per ISA, cached by its flags), all ISAs side by side.

The SiLU's reciprocal is an ISA estimate plus Newton steps (common.h vrecip): its relative error is
checked against the stated bound 4e-7 over [1, 6e37] (the range of 1 + exp(-x) after clamping),
and SiLU itself against float64 within 5e-7 of max(|SiLU(x)|, 1).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from ops_fixtures import needs_compiler

pytestmark = [needs_compiler, pytest.mark.slow]  # a kernel build per forced ISA (~100 s)

from mindgr.ops import cpu  # noqa: E402
from mindgr.ops.cpu import build as cpu_build  # noqa: E402

RECIP_BOUND = 4e-7
SILU_BOUND = 5e-7


def test_isa_is_detected_and_reported(monkeypatch):
    monkeypatch.delenv(cpu_build.ISA_ENV, raising=False)
    native = cpu_build.native_isas()
    assert native[-1] == "generic" and set(native) <= set(cpu_build.ISA_FLAGS)
    assert cpu_build.isa() == native[0]
    name = cpu.isa()
    assert name.split()[0] == cpu_build.isa()
    lanes = {"avx512": 16, "avx2": 8, "neon": 4, "generic": 4}[name.split()[0]]
    assert name.endswith(f"({lanes} lanes)")


def test_bench_train_reports_the_kernel_isa():
    from mindgr.bench.train import _kernel_isa
    assert _kernel_isa("reference") is None
    assert _kernel_isa("cpu") == cpu.isa()


def test_forced_isa_changes_the_cache_key(monkeypatch):
    native = cpu_build.native_isas()
    keys = set()
    for isa in native:
        monkeypatch.setenv(cpu_build.ISA_ENV, isa)
        assert cpu_build.isa() == isa
        keys.add(cpu_build.source_hash(cpu_build.compiler()))
    assert len(keys) == len(native)


def test_bad_or_unavailable_isa_is_one_clear_line(monkeypatch):
    monkeypatch.setenv(cpu_build.ISA_ENV, "sse9")
    with pytest.raises(cpu_build.BuildError) as err:
        cpu_build.isa()
    assert "MINDGR_CPU_ISA='sse9'" in str(err.value) and "\n" not in str(err.value)
    missing = [i for i in cpu_build.ISA_FLAGS if i not in cpu_build.native_isas()]
    if missing:
        monkeypatch.setenv(cpu_build.ISA_ENV, missing[0])
        with pytest.raises(cpu_build.BuildError) as err:
            cpu_build.isa()
        assert "cannot run here" in str(err.value) and "\n" not in str(err.value)


def test_reciprocal_and_silu_error_bounds():
    x = np.geomspace(1.0, 6e37, 400001).astype(np.float32)
    y, _ = cpu.recip_probe(x)
    rel = np.abs(y.astype(np.float64) * x.astype(np.float64) - 1.0)
    assert rel.max() <= RECIP_BOUND, (cpu.isa(), rel.max())
    xs = np.concatenate([np.linspace(-90, 90, 200001), [0.0, -1e-30, 1e-30]]).astype(np.float32)
    _, z = cpu.recip_probe(xs)
    x64 = xs.astype(np.float64)
    ref = x64 / (1.0 + np.exp(-x64))
    err = np.abs(z - ref) / np.maximum(np.abs(ref), 1.0)
    assert err.max() <= SILU_BOUND, (cpu.isa(), err.max())


# Kernel-vs-reference tests re-run per ISA (attention forward/backward incl. lengths 0, 1, N and
# long tails, thread-count invariance, scoring, shared pool).
PER_ISA_TESTS = [
    "tests/unit/ops/test_ops_cpu.py::test_attention_matches_reference_graph",
    "tests/unit/ops/test_ops_cpu.py::test_attention_thread_count_invariance",
    "tests/unit/ops/test_ops_cpu.py::test_attention_rows_without_time_data_match_reference",
    "tests/unit/ops/test_ops_cpu_scoring.py",
    "tests/unit/ops/test_ops_cpu_pool.py::test_pool_lse_matches_reference",
    "tests/system/ops/test_ops_cpu_isa.py::test_reciprocal_and_silu_error_bounds",
    "tests/unit/ops/test_ops_cpu_layernorm.py",
    "tests/unit/ops/test_ops_cpu_glue.py::test_silu_split_matches_reference_pynative",
    "tests/unit/ops/test_ops_cpu_glue.py::test_l2_normalize_matches_reference",
    "tests/unit/models/test_linear_attention.py::test_cpu_kernel_matches_the_chunked_form",
]


def test_narrower_isas_match_reference():
    """Every narrower ISA at once (one subprocess each, side by side on the cores: each is a kernel build
    plus the per-ISA tests, mostly single-threaded)."""
    isas = list(cpu_build.native_isas()[1:])
    if not isas:
        pytest.skip("this machine offers only the generic ISA")
    procs = {isa: subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *PER_ISA_TESTS],
                                   cwd=REPO, env=dict(os.environ, MINDGR_CPU_ISA=isa), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
             for isa in isas}
    outs = {}
    try:
        for isa, proc in procs.items():
            outs[isa] = proc.communicate(timeout=1200)[0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for isa, proc in procs.items():
        assert proc.returncode == 0, (isa, outs[isa][-3000:])
        assert " passed" in outs[isa] and " failed" not in outs[isa], (isa, outs[isa][-3000:])
