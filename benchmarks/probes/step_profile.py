"""Where does a steady-state training step go? Build a config's training loop as `mindgr bench train` does, run
the compile step and the warm-up, then record `perf record -e cpu-clock` of this process over the timed steps
only, and print a per-part table: core-ms per step (the part's share of the samples times the process CPU time
per step), its share, and the part's wall ms per step if it ran alone on one core.

    cd SNAPSHOT && PYTHONPATH=$PWD python benchmarks/probes/step_profile.py --config configs/ml-1m/hstu.yaml \
        --steps 12 --warmup 3 [--top 40] [--keep /tmp/step.perf] [-- key=value ...]

Parts are assigned by the sampled function's name and library (`PARTS` below, first match wins); `--top N`
also prints the N hottest symbols with their part, so the rules can be checked. Only user-space samples are
seen (kernel time, e.g. page faults, is not attributed: the table says how much CPU time that leaves out).
Needs `perf` (linux-tools) allowed to attach to one's own process (perf_event_paranoid <= 2).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

# (part, regex on "dso symbol"), first match wins. The C++ kernels' symbols name their op (the threads of
# parallel_run carry the inner function's name); MindSpore's CPU kernels are nnacl functions or, in the
# stripped libmindspore_ops_cpu.so, bare addresses (per disassembly, on 2.10: the scalar index-array loops
# of broadcasting arithmetic, e.g. RealDiv [T, D] / [T, 1] and Add of a [D] bias, and BroadcastTo-style
# copies); MatMul runs oneDNN JIT code ("[JIT]", no symbols).
_MG = r"libmindgr_cpu\S*\.so .*"
PARTS = [
    ("SiLU split fwd+bwd (C++)", _MG + r"silu_split|SiluSplit"),
    ("LayerNorms, L2 norm fwd+bwd (C++)", _MG + r"layer_norm|LayerNorm|gated_(fwd|bwd)|l2_(fwd|bwd)|L2Normalize"),
    ("sampled softmax fwd (C++)", _MG + r"lse_forward|MindgrSampledLse$|logits_forward"),
    ("sampled softmax bwd (C++)", _MG + r"FromLse|backward_nv|SampledLseBwd|SampledLogitsBwd"),
    ("attention bwd (C++)", _MG + r"backward\(mindgr::\(anonymous namespace\)::Problem|run_backward|HstuBwd"),
    ("attention fwd (C++)", _MG + r"forward\(mindgr::\(anonymous namespace\)::Problem|run_forward|HstuFwd"),
    ("attention micro-kernels, fwd+bwd (C++)", _MG + r"micro_nt|rank_update|pack_t|transpose"),
    ("C++ kernels, other", r"libmindgr_cpu"),
    ("MatMul (oneDNN JIT)", r"^\[JIT\]|libdnnl|jit_"),
    ("Adam (MindSpore)", r"(?i)adam"),
    ("elementwise (MindSpore nnacl)", r"libnnacl.*(Element|Sigmoid|Relu|Exp|Sqrt|Div|Sub|Neg|Square|Fill|Cast)"),
    ("reduce/gather (MindSpore nnacl)", r"libnnacl.*(Reduce|Gather|Tile|Transpose|Concat|Slice|Pad)"),
    ("MindSpore nnacl, other", r"libnnacl"),
    ("broadcast/copy loops (MindSpore, stripped)", r"libmindspore_ops_cpu\.so 0x"),
    ("memcpy/memset (libc)", r"(?i)memcpy|memmove|memset"),
    ("host input (numpy)", r"_multiarray|numpy|_generator|_pcg64|bit_generator|_bounded|_common\.cpython"),
    ("python interpreter", r"libpython|python3"),
    ("OS kernel (scheduling, syscalls, faults)", r"^\[kernel"),
    ("MindSpore runtime, threads, allocator", r"mindspore|_c_expression|libstdc|libgomp|libc\.so|ld-linux"),
]
_RULES = [(name, re.compile(rx)) for name, rx in PARTS]


def part_of(dso: str, sym: str) -> str:
    key = f"{dso} {sym}"
    for name, rx in _RULES:
        if rx.search(key):
            return name
    return "other"


def parse_report(text: str):
    """[(samples, comm, dso, symbol)] from `perf report -t '|' -F sample,comm,dso,sym`."""
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cols = [c.strip() for c in line.split("|", 3)]
        if len(cols) == 4 and cols[0].isdigit():
            sym = re.sub(r"^\[[.k]\]\s*", "", cols[3])
            rows.append((int(cols[0]), cols[1], cols[2], sym))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/ml-1m/hstu.yaml")
    ap.add_argument("--steps", type=int, default=12, help="steady-state steps recorded")
    ap.add_argument("--warmup", type=int, default=3, help="steps before recording (the first one compiles)")
    ap.add_argument("--freq", type=int, default=999, help="perf sampling frequency (Hz)")
    ap.add_argument("--top", type=int, default=30, help="also print the N hottest symbols")
    ap.add_argument("--keep", help="keep perf.data at this path")
    ap.add_argument("--analyse", metavar="PERF_DATA", help="only re-classify a kept recording of --steps steps at "
                    "--freq (core-ms from the sample count; no training)")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    overrides = argv[cut + 1:]
    perf = shutil.which("perf") or "/usr/bin/perf"
    if not os.path.exists(perf):
        sys.exit("step_profile: perf not found (install linux-tools)")

    if args.analyse:
        table(args, args.analyse, args.steps, None, None, None, None)
        return 0
    from mindgr.bench import quiet_run
    from mindgr.config import load_config
    from mindgr.train.trainer import Trainer
    cfg = load_config(args.config, overrides)
    tmp = tempfile.mkdtemp(prefix="step_profile_")
    cfg.run.out_dir, cfg.run.name = tmp, "profile"
    quiet_run(cfg)
    trainer = Trainer(cfg, quiet=True)
    trainer.run_steps(max(args.warmup, 1))
    data_path = args.keep or os.path.join(tmp, "perf.data")
    rec = subprocess.Popen([perf, "record", "-q", "-e", "cpu-clock", "-F", str(args.freq), "-p", str(os.getpid()),
                            "-o", data_path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)                                    # let perf attach before the first recorded step
    if rec.poll() is not None:
        sys.exit(f"step_profile: perf record failed: {rec.stderr.read().decode().strip()[-300:]}")
    load0 = os.getloadavg()[0]
    c0, w0 = time.process_time(), time.perf_counter()
    block = trainer.run_steps(args.steps)
    cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - w0
    rec.send_signal(signal.SIGINT)
    rec.wait(timeout=60)
    load1 = os.getloadavg()[0]
    table(args, data_path, block["steps"], 1e3 * cpu_s / block["steps"], wall_s, block, (load0, load1))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def table(args, data_path, steps, core_ms, wall_s, block, loads):
    """Print the per-part, per-thread and per-symbol tables of a recording of `steps` steps; core_ms None:
    from the sample count."""
    perf = shutil.which("perf") or "/usr/bin/perf"
    report = subprocess.run([perf, "report", "-i", data_path, "--stdio", "-t", "|", "--sort", "comm,dso,sym",
                             "-F", "sample,comm,dso,sym"], capture_output=True, text=True).stdout
    rows = parse_report(report)
    total = sum(r[0] for r in rows) or 1.0
    sampled_ms = 1e3 * total / args.freq / steps
    core_ms = sampled_ms if core_ms is None else core_ms   # process CPU (user + sys) per step, all threads
    parts, threads = defaultdict(float), defaultdict(float)
    for pct, comm, dso, sym in rows:
        parts[part_of(dso, sym)] += pct / total
        threads[comm] += pct / total
    if block is not None:
        step_ms = sorted(1e3 * s for s in block["step_times"])
        print(f"step_profile: {args.config}: {steps} steady-state steps recorded after {args.warmup} (incl. the "
              f"compile step); load average {loads[0]:.1f} -> {loads[1]:.1f}")
        print(f"  wall ms per step: median {step_ms[len(step_ms) // 2]:.1f} [{step_ms[0]:.1f}-{step_ms[-1]:.1f}]; "
              f"block wall {1e3 * wall_s / steps:.1f} ms/step; process CPU {core_ms:.1f} core-ms/step "
              f"(input thread {1e3 * block['host_cpu_s'] / steps:.1f}); perf samples {total:.0f} at {args.freq} Hz = "
              f"{sampled_ms:.1f} core-ms/step")
    else:
        print(f"step_profile: {data_path}: {total:.0f} samples at {args.freq} Hz over {steps} steps = "
              f"{sampled_ms:.1f} core-ms/step")
    print(f"\n| part | core-ms per step | share |\n|---|---|---|")
    for name, share in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {share * core_ms:.1f} | {100 * share:.1f}% |")
    print(f"\n| thread | core-ms per step | share |\n|---|---|---|")
    for name, share in sorted(threads.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {name} | {share * core_ms:.1f} | {100 * share:.1f}% |")
    if args.top:
        syms = defaultdict(float)
        for pct, comm, dso, sym in rows:
            if dso.startswith("[JIT]"):
                dso, sym = "[JIT]", "(oneDNN JIT code, all addresses)"
            syms[(dso, sym)] += pct / total
        print(f"\n| symbol | library | part | core-ms per step | share |\n|---|---|---|---|---|")
        for (dso, sym), share in sorted(syms.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"| `{sym[:90]}` | {dso} | {part_of(dso, sym)} | {share * core_ms:.2f} | {100 * share:.1f}% |")


if __name__ == "__main__":
    raise SystemExit(main())
