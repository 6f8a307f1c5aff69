"""Builds MindGR's C++ CPU kernels into one shared library, cached by a hash of sources and flags.

`build()` returns the path of the library, compiling it first if no build for the current sources,
compiler flags and machine exists yet. The cache directory is `mindgr/ops/cpu/_build/` when that is
writable, else `$MINDGR_CPU_BUILD_DIR`, else `$XDG_CACHE_HOME/mindgr/ops` (`~/.cache/mindgr/ops`).
`MINDGR_CPU_BUILD_DIR` set explicitly takes precedence. Concurrent builds are safe: each process
compiles to its own temporary file and renames it into place atomically.

Run `python -m mindgr.ops.cpu.build` to prebuild (setup.py does this at install time).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("hstu_attention.cc", "jagged.cc", "sampled_logits.cc", "shared_pool.cc", "bias_attention.cc")
HEADERS = ("common.h",)
LIB_PREFIX = "libmindgr_cpu_"
CXX_FLAGS = (
    "-O3", "-march=native", "-mprefer-vector-width=512", "-std=gnu++17", "-ffp-contract=fast",
    "-fno-math-errno", "-fno-tree-loop-distribute-patterns", "-fPIC", "-shared", "-pthread", "-Wall",
)
WAY_OUT = "set `ops.backend: reference` to run without the C++ kernels"


class BuildError(RuntimeError):
    """The kernels cannot be built here; the message says why and names the way out."""


def compiler() -> str | None:
    """The C++ compiler to use: $CXX if set, else g++ from PATH (None if there is none)."""
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _cpu_signature() -> str:
    """-march=native code only runs on a similar CPU: key the cache on the CPU's feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags") or line.startswith("Features"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def source_hash(cxx: str | None = None) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        with open(os.path.join(SOURCE_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    h.update(" ".join(CXX_FLAGS).encode())
    h.update((cxx or "").encode())
    h.update(platform.machine().encode())
    h.update(_cpu_signature().encode())
    return h.hexdigest()[:16]


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def cache_dir() -> str:
    explicit = os.environ.get("MINDGR_CPU_BUILD_DIR")
    if explicit:
        return explicit
    local = os.path.join(SOURCE_DIR, "_build")
    if _writable(local):
        return local
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mindgr", "ops")


def library_path(cxx: str | None = None) -> str:
    """Where the library for the current sources lives (whether or not it is built yet)."""
    return os.path.join(cache_dir(), f"{LIB_PREFIX}{source_hash(cxx or compiler())}.so")


def build(verbose: bool = False) -> str:
    """Compile the kernels if needed and return the path of the shared library."""
    cxx = compiler()
    if cxx is None:
        raise BuildError(f"{os.environ.get('CXX') or 'g++'} not found: cannot build the C++ kernels; {WAY_OUT}")
    out = library_path(cxx)
    if os.path.exists(out):
        return out
    directory = os.path.dirname(out)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the kernel cache directory {directory}: {exc}; {WAY_OUT}") from exc
    ignore = os.path.join(directory, ".gitignore")
    if not os.path.exists(ignore):
        try:
            with open(ignore, "w", encoding="utf-8") as f:
                f.write("# build output of mindgr/ops/cpu/build.py\n*\n")
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=".tmp_" + os.path.basename(out) + ".", suffix=".so", dir=directory)
    os.close(fd)
    cmd = [cxx, *CXX_FLAGS, *(os.path.join(SOURCE_DIR, s) for s in SOURCES), "-o", tmp]
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
            raise BuildError(f"compiling the C++ kernels failed ({' '.join(cmd)}):\n{tail}\n{WAY_OUT}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: a concurrent build of the same sources writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _remove_stale(directory, keep=os.path.basename(out))
    return out


def _remove_stale(directory: str, keep: str, min_age_s: float = 86400.0) -> None:
    """Delete libraries of other sources not touched for a day (best effort: another checkout
    sharing the cache may still use a recent one; a running process keeps its mapping anyway)."""
    import time
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        if name.startswith(LIB_PREFIX) and name.endswith(".so") and name != keep:
            path = os.path.join(directory, name)
            try:
                if now - os.path.getmtime(path) > min_age_s:
                    os.unlink(path)
            except OSError:
                pass


if __name__ == "__main__":
    try:
        print(build(verbose=True))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
