"""`mindgr bench ops`: the jagged HSTU attention op alone, C++ kernels vs the padded reference,
forward + backward, same inputs, same process (see mindgr.ops.cpu.bench for the method)."""
from __future__ import annotations

from mindgr.bench import add_out_argument, write_result

# The two sizes, on KuaiRand-like lengths (log-normal, median 0.25 N, clipped to [8, N], seed 0).
SIZES = {"small": dict(rows=128, H=2, d=32, N=200), "medium": dict(rows=32, H=4, d=64, N=1024)}


def bench_ops(sizes=("small", "medium"), repeats: int = 3, out: str | None = None, reference: bool = True) -> dict:
    unknown = [name for name in sizes if name not in SIZES]
    if unknown:
        raise ValueError(f"bench ops: --sizes {','.join(unknown)}: expected some of {', '.join(SIZES)}")
    import mindspore as ms
    from mindgr.ops.cpu.bench import bench_attention, lognormal_lengths
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    from mindgr.ops import cpu
    results = {"kernel_isa": cpu.isa()}
    print(f"C++ kernels: {results['kernel_isa']}, {cpu.kernel_threads()} threads")
    print(f"{'size':8s} {'rows':>5s} {'tokens':>7s} {'cpu fwd+bwd ms':>15s} {'ref rows':>8s} "
          f"{'ref fwd+bwd ms':>15s} {'cpu same rows':>13s} {'speed-up':>9s}")
    for name in sizes:
        s = SIZES[name]
        r = bench_attention(lognormal_lengths(s["rows"], s["N"], seed=0), H=s["H"], d=s["d"], N=s["N"],
                            repeats=repeats, reference=reference)
        results[name] = r
        ref = r["reference"] or {}
        same = r.get("cpu_same_rows", r["cpu"])
        print(f"{name:8s} {r['rows']:5d} {r['tokens']:7d} {r['cpu']['fwd_bwd_ms']:15.1f} "
              f"{ref.get('rows', 0):8d} {ref.get('fwd_bwd_ms', float('nan')):15.1f} "
              f"{same['fwd_bwd_ms']:13.1f} {r.get('speedup_fwd_bwd', float('nan')):8.1f}x")
    return write_result(results, out)


def add_arguments(parser):
    parser.add_argument("--sizes", default="small,medium", help="which sizes (small, medium)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (the best is kept)")
    parser.add_argument("--no-reference", action="store_true", help="time the C++ kernels only (no padded reference)")
    add_out_argument(parser)


def run(args) -> int:
    bench_ops(args.sizes.split(","), repeats=args.repeats, out=args.out, reference=not args.no_reference)
    return 0
