"""Builds MindGR's C++ CPU kernels into one shared library, cached by a hash of sources and flags.

`build()` returns the path of the library, compiling it first if no build for the current sources,
compiler flags and machine exists yet (one compiler per source, in parallel over the cores, then a
link). The cache directory is `mindgr/ops/cpu/_build/` when that is
writable, else `$MINDGR_CPU_BUILD_DIR`, else `$XDG_CACHE_HOME/mindgr/ops` (`~/.cache/mindgr/ops`).
`MINDGR_CPU_BUILD_DIR` set explicitly takes precedence. Concurrent builds are safe: each process
compiles to its own temporary file and renames it into place atomically.

The vector ISA is chosen here, on the user's machine, from the compiler's predefined macros under
-march=native: AVX-512F (16 lanes), AVX2 + FMA (8 lanes), NEON (4 lanes) or generic portable code
(4 lanes, no -march). `MINDGR_CPU_ISA=avx512|avx2|neon|generic` forces one (a narrower one than the
machine's, e.g. to test every path; one the machine cannot run is a BuildError); it is part of the
cache key. `isa()` says which ISA a build would use.

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
import time
from concurrent.futures import ThreadPoolExecutor

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("hstu_attention.cc", "jagged.cc", "sampled_logits.cc", "shared_pool.cc", "bias_attention.cc",
           "layernorm.cc", "silu.cc", "softmax_attention.cc", "linear_attention.cc", "workers.cc",
           "arg_errors.cc")
HEADERS = ("common.h", "arg_errors.def")
LIB_PREFIX = "libmindgr_cpu_"
CXX_FLAGS = (
    "-O3", "-std=gnu++17", "-ffp-contract=fast",
    "-fno-math-errno", "-fno-tree-loop-distribute-patterns", "-fPIC", "-shared", "-pthread", "-Wall",
)
# Per ISA: the code-generation flags and the macro that sizes the kernels' vectors (common.h).
ISA_FLAGS = {
    "avx512": ("-march=native", "-mprefer-vector-width=512", "-DMINDGR_ISA_AVX512"),
    "avx2": ("-march=native", "-mno-avx512f", "-mprefer-vector-width=256", "-DMINDGR_ISA_AVX2"),
    "neon": ("-march=native", "-DMINDGR_ISA_NEON"),
    "generic": ("-DMINDGR_ISA_GENERIC",),
}
ISA_ENV = "MINDGR_CPU_ISA"
WAY_OUT = "set `ops.backend: reference` to run without the C++ kernels"


class BuildError(RuntimeError):
    """The kernels cannot be built here; the message says why and names the way out."""


def compiler() -> str | None:
    """The C++ compiler to use: $CXX if set, else g++ from PATH (None if there is none)."""
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


_native_cache: dict = {}


def native_isas(cxx: str | None = None) -> tuple[str, ...]:
    """The ISAs this compiler can target on this machine under -march=native, widest first
    ("generic" always last), from its predefined macros (-dM -E)."""
    cxx = cxx or compiler()
    if cxx is None:
        return ("generic",)
    if cxx not in _native_cache:
        try:
            proc = subprocess.run([cxx, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False)
            macros = set(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define "))
        except OSError:
            macros = set()
        found = []
        if "__AVX512F__" in macros:
            found.append("avx512")
        if "__AVX2__" in macros and "__FMA__" in macros:
            found.append("avx2")
        if "__ARM_NEON" in macros:
            found.append("neon")
        _native_cache[cxx] = tuple(found) + ("generic",)
    return _native_cache[cxx]


def isa(cxx: str | None = None) -> str:
    """The ISA a build uses: $MINDGR_CPU_ISA if set (checked against the machine), else the widest."""
    available = native_isas(cxx)
    wanted = (os.environ.get(ISA_ENV) or "").strip().lower()
    if not wanted or wanted == "auto":
        return available[0]
    if wanted not in ISA_FLAGS:
        raise BuildError(f"{ISA_ENV}={wanted!r} is not one of auto, {', '.join(ISA_FLAGS)}")
    if wanted not in available:
        raise BuildError(f"{ISA_ENV}={wanted} cannot run here (this machine and compiler offer "
                         f"{', '.join(available)}); unset it or choose one of those")
    return wanted


def flags(cxx: str | None = None) -> tuple[str, ...]:
    """All compiler flags of a build for the current ISA choice."""
    return CXX_FLAGS + ISA_FLAGS[isa(cxx)]


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
    h.update(" ".join(flags(cxx)).encode())
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
    # First use (or new sources, compiler, CPU): say so, the build is a minute of silence otherwise. On
    # stderr: stdout of the commands that print results stays theirs.
    print(f"building the C++ kernels (first use, a minute or more; cached in {directory})...", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    fd, tmp = tempfile.mkstemp(prefix=".tmp_" + os.path.basename(out) + ".", suffix=".so", dir=directory)
    os.close(fd)
    objects = tempfile.mkdtemp(prefix=".tmp_objects.", dir=directory)
    compile_flags = [f for f in flags(cxx) if f != "-shared"]
    try:
        # one compiler per source, as many at a time as there are cores, the largest sources first (they
        # compile longest), then one link
        by_size = sorted(SOURCES, key=lambda s: -os.path.getsize(os.path.join(SOURCE_DIR, s)))
        jobs = [[cxx, *compile_flags, "-c", os.path.join(SOURCE_DIR, s), "-o", os.path.join(objects, s + ".o")]
                for s in by_size]
        _run_all(jobs, os.cpu_count() or 1, verbose)
        _run_all([[cxx, *flags(cxx), *(j[-1] for j in jobs), "-o", tmp]], 1, verbose)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: a concurrent build of the same sources writes the same bytes
        print(f"built the C++ kernels in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        shutil.rmtree(objects, ignore_errors=True)
    _remove_stale(directory, keep=os.path.basename(out))
    return out


def _run_all(cmds: list, parallel: int, verbose: bool) -> None:
    """Run compiler commands, up to `parallel` at once; the first failure is a BuildError with its output."""
    def one(cmd):
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        return cmd, subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(cmds)))) as pool:
        done = list(pool.map(one, cmds))
    for cmd, proc in done:
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-20:])
            raise BuildError(f"compiling the C++ kernels failed ({' '.join(cmd)}):\n{tail}\n{WAY_OUT}")


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
