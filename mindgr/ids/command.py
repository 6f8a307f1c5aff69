"""`mindgr ids build`: item vectors (a run's item table or a file) -> semantic-ID table + statistics."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub):
    """The `ids` command group on the top-level subparsers (called from mindgr.cli.build_parser)."""
    i = sub.add_parser("ids", help="semantic IDs of items for generative retrieval")
    isub = i.add_subparsers(dest="ids_command", required=True)
    b = isub.add_parser("build", help="residual k-means semantic IDs (+ a de-duplication digit) of every item")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run directory: use its checkpoint's item table (rows 1..V)")
    src.add_argument("--vectors", help="item vectors file: .npy [V, D], .csv `item_id,v0,...`, or .parquet")
    b.add_argument("--checkpoint", default="best", choices=["best", "latest"], help="--run: which checkpoint")
    b.add_argument("--out", help="output Parquet (default RUN/ids/codes.parquet; needed with --vectors)")
    b.add_argument("--levels", type=int, default=3, help="L, residual k-means levels")
    b.add_argument("--codes", type=int, default=256, help="K, codes per level")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--dedup-range", type=int, default=0,
                   help="range of the final de-duplication digit; 0 = the largest collision bucket")
    b.add_argument("--iters", type=int, default=25, help="Lloyd iterations per level")
    b.add_argument("--backend", default="auto", choices=["auto", "numpy", "faiss"],
                   help="k-means back end (auto: faiss-cpu for large inputs, numpy below)")
    b.add_argument("--no-normalize", action="store_true",
                   help="cluster the raw vectors and residuals (default: L2-normalise them first)")
    b.set_defaults(func=build)


def build(args) -> int:
    from mindgr.ids.codes import format_stats, save_codes
    from mindgr.ids.tokenizer import TokenizerError, tokenize
    from mindgr.ids.vectors import file_item_vectors, run_item_vectors
    if args.run:
        vectors, raw_ids = run_item_vectors(args.run, args.checkpoint)
        out = Path(args.out) if args.out else Path(args.run) / "ids" / "codes.parquet"
        source = {"run": str(args.run), "checkpoint": args.checkpoint}
    else:
        if not args.out:
            raise TokenizerError("ids build: --vectors needs --out (where to write the table)")
        vectors, raw_ids = file_item_vectors(args.vectors)
        out = Path(args.out)
        source = {"vectors": str(args.vectors)}
    result = tokenize(vectors, levels=args.levels, codes=args.codes, seed=args.seed,
                      dedup_range=args.dedup_range, iters=args.iters, backend=args.backend,
                      normalize=not args.no_normalize)
    save_codes(out, result.codes, result.level_sizes, raw_ids, dict(result.stats, source=source))
    print(format_stats(result.stats))
    print(f"wrote {out} (+ {out.with_suffix('.json').name})")
    return 0
