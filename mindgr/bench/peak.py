"""`mindgr bench peak`: this machine's fp32 GEMM rate through MindSpore MatMul, the MFU denominator
(mindgr.train.peak measures it and caches a quiet measurement per machine)."""
from __future__ import annotations

from mindgr.bench import add_out_argument, write_result


def add_arguments(parser):
    parser.add_argument("--refresh", action="store_true", help="re-measure the peak even if cached")
    add_out_argument(parser)


def run(args) -> int:
    from mindgr.train.peak import peak_flops
    p = peak_flops(refresh=args.refresh)
    print(f"peak fp32 GEMM (MindSpore MatMul): {p['flops_per_s'] / 1e9:.1f} GFLOP/s  [{p['method']}]")
    if p.get("busy"):
        print(f"  not cached: the host was busy ({p['busy']})")
    write_result(p, args.out, default=str)
    return 0
