"""Per-step decode time, engine vs naive baseline, for a random-weight GR decoder of a Beauty-like shape.

mindgr bench decode [--beams 16 64] [--prompts 50 200] [--users 2] [--repeats 3] [--dim 64]
    [--blocks 2] [--heads 2] [--threads N] [--shape random|beauty] [--backbone hstu|linear]
                                                    (also as python -m mindgr.bench.decode ...)

Per configuration both searches run on the same users, alternating, `repeats` times after a warm-up
(compiles); figures are medians per decode step (the Lt-1 steps after the prefill):
  model   decoder time per step (engine: the decode-step graph; naive: the whole-sequence recompute),
  prompt  / beam: the engine's step graph with only the prompt / only the ancestry attention part
          (same shapes, same inputs: each includes the token's projections),
  select  selection per step (engine: partial top-k; naive: full sort),
  masks   valid-next masks per step (engine: reused trie masks; naive: rebuilt from the code table),
  request the whole search for the batch (engine: prefill + steps + selection), ms.
The host is shared and noisy: compare the two columns of one run (ratios), not absolute times.

--shape beauty: the GR decoder of configs/beauty/gr.yaml (D 128, 2 blocks, 2 heads, item merger, trie
softmax, prompts of up to 20 items) on a synthetic code table of Beauty's shape (12,101 items, 3 x 2048
codes + the de-dup digit, first codes Zipf-skewed as mindgr.bench.train draws them), random weights and
random histories of 5-20 items; `--users` users per batch (the evaluation's eval.batch_size). Per beam the
engine's two scorings run alternately on the same users, `repeats` rounds after a warm-up (compiles) that
checks they return the same lists: children (the default: only the trie's allowed codes scored, the step
graph without the code head) and full (every code of the level scored by the graph, log-softmax, masks and
selection over the whole level: the path before). Printed per beam and path: users/s (median [min-max]),
the peak resident memory of a fresh process that builds the decoder and runs that path's searches of the
batch (so one path's freed memory pools do not count against the other), and the
time per user by part: prefill graph, step graphs, head (children: the allowed codes' logits and their
softmax; full: the host log-softmax of the level), masks (children: the (beam, code) pairs from the trie),
selection, other (prompts, ancestry, item lookup: the rest of the search).

--backbone linear: a linear-attention decoder (mindgr.models.linear_attention) decoded in its three layouts
side by side (mindgr.models.linear_decode): onela (one prompt state per user, per-beam records, ancestry
index), per_beam_state (a full state per beam, gathered by parent) and replay (each beam's state rebuilt
from the prompt state and its records every step). Per cell the modes run alternately (the order rotated
each round), `repeats` rounds after a warm-up that also checks they return the same lists; printed: end-to-end
decode throughput (users/s: prefill + steps + selection of the batch) median and range per mode, the ratio
OneLA / per-beam state (median of the rounds' ratios, and their range), and the recurrent-state bytes per
request each mode holds (replay also rebuilds every beam's full state for one block during a step).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def build(args):
    if getattr(args, "backbone", "hstu") == "linear":
        return build_linear(args)
    return build_hstu(args)


def build_hstu(args):
    import mindspore as ms
    from mindspore import Tensor

    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.ops import set_backend
    from mindgr.runtime import select_device
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()
    backend = set_backend(args.backend)
    rng, sizes, codes = _fixture(args)
    dec = GRDecoder(sizes, args.dim, args.blocks, args.heads, args.dim // args.heads, args.dim // args.heads,
                    max_len=max(args.prompts) + 8, seed=0)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.1).astype(np.float32)))
    return dec, PrefixTrie(codes, sizes), codes, backend, rng


def _fixture(args):
    """The random catalogue of the benchmark: 4 levels (256, 256, 256, 32), first level clustered."""
    rng = np.random.default_rng(0)
    sizes = [256, 256, 256, 32]
    seen, rows = set(), []
    while len(rows) < args.items:
        t = (int(rng.integers(64)), int(rng.integers(256)), int(rng.integers(256)), int(rng.integers(4)))
        if t not in seen:
            seen.add(t)
            rows.append(t)
    return rng, sizes, np.concatenate([np.zeros((1, 4), np.int64), np.asarray(rows)])


def build_linear(args):
    """A random-weight linear-attention GR decoder and the random catalogue (as build_hstu's)."""
    import mindspore as ms
    from mindspore import Tensor

    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.ops import set_backend
    from mindgr.runtime import select_device
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()
    backend = set_backend(args.backend)
    rng, sizes, codes = _fixture(args)
    d = args.dim // args.heads
    dec = GRDecoder(sizes, args.dim, args.blocks, args.heads, d, d, max_len=max(args.prompts) + 8, seed=0,
                    backbone="linear")
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.1).astype(np.float32)))
    return dec, PrefixTrie(codes, sizes), codes, backend, rng


LINEAR_MODES = (("onela", "shared"), ("per_beam_state", "per_beam"), ("replay", "replay"))   # (name, cache=)


def measure_linear(args):
    """The three linear-attention layouts side by side per (prompt, beam) cell (module docstring)."""
    from mindgr.generate.engine import DecodingEngine
    dec, trie, codes, backend, rng = build(args)
    results = []
    for prompt in args.prompts:
        hist = [rng.integers(1, codes.shape[0], prompt // dec.num_levels) for _ in range(args.users)]
        for beam in args.beams:
            engines = {name: DecodingEngine(dec, trie, codes, beam, prompt, args.users, cache=cache)
                       for name, cache in LINEAR_MODES}
            t0 = time.perf_counter()
            lists = {name: e.search(hist, 10) for name, e in engines.items()}
            warm = time.perf_counter() - t0
            for name, (items, scores) in lists.items():
                assert (items == lists["onela"][0]).all(), f"{name} and onela lists differ"
                np.testing.assert_allclose(scores, lists["onela"][1], rtol=1e-4, atol=1e-4)
            secs = {name: [] for name in engines}
            decode = {name: [] for name in engines}                 # the same searches after the prefill
            names = list(engines)
            for r in range(args.repeats):
                for name in names[r % 3:] + names[:r % 3]:            # rotate who goes first
                    e = engines[name]
                    e.timings["prefill"] = 0.0
                    t1 = time.perf_counter()
                    e.search(hist, 10)
                    secs[name].append(time.perf_counter() - t1)
                    decode[name].append(secs[name][-1] - e.timings["prefill"])
            row = dict(prompt=prompt, beam=beam, users=args.users, warmup_s=round(warm, 1))
            for name, e in engines.items():
                rate = args.users / np.asarray(secs[name])
                held = e.cache_nbytes()
                row[name] = dict(users_s=round(float(np.median(rate)), 2), min=round(float(rate.min()), 2),
                                 max=round(float(rate.max()), 2),
                                 decode_ms=round(float(np.median(decode[name])) * 1e3, 1),
                                 state_bytes=(held["prompt"] + held["beams"]) // args.users,
                                 rebuilt_bytes=held.get("rebuilt", 0) // args.users)
            for key, t in (("ratio", secs), ("decode_ratio", decode)):
                ratio = np.asarray(t["per_beam_state"]) / np.asarray(t["onela"])   # round by round
                row[key] = round(float(np.median(ratio)), 2)
                row[key + "_range"] = [round(float(ratio.min()), 2), round(float(ratio.max()), 2)]
            row["bytes_ratio"] = round(row["per_beam_state"]["state_bytes"] / row["onela"]["state_bytes"], 1)
            results.append(row)
            print(json.dumps(row), flush=True)
    return dict(backend=backend, items=int(codes.shape[0] - 1), dim=args.dim, heads=args.heads,
                blocks=args.blocks, backbone="linear", results=results)


def print_linear(out):
    print("users/s: whole search (prefill + steps + selection), median [min-max] over the rounds; onela / "
          "per-beam: the rounds' ratio of search times, median [range], whole search and after the prefill "
          "(decode ms: median per search after the prefill); bytes: recurrent state held per request")
    print(f"{'prompt':>6} {'beam':>4} | {'users/s onela':<20} {'per_beam_state':<20} {'replay':<20} | "
          f"{'onela / per-beam: search':<24} {'decode':<19} | decode ms o / p / r | bytes onela, per-beam, "
          "replay (+rebuilt)")
    for r in out["results"]:
        cells = [f"{r[m]['users_s']:.2f} [{r[m]['min']:.2f}-{r[m]['max']:.2f}]" for m, _ in LINEAR_MODES]
        o, p, y = (r[m] for m, _ in LINEAR_MODES)
        print(f"{r['prompt']:>6} {r['beam']:>4} | {cells[0]:<20} {cells[1]:<20} {cells[2]:<20} | "
              f"{r['ratio']:5.2f}x [{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}]{'':>6} "
              f"{r['decode_ratio']:5.2f}x [{r['decode_ratio_range'][0]:.2f}-{r['decode_ratio_range'][1]:.2f}] | "
              f"{o['decode_ms']:.0f} / {p['decode_ms']:.0f} / {y['decode_ms']:.0f} | "
              f"{o['state_bytes']:,}, {p['state_bytes']:,} ({r['bytes_ratio']}x less), {y['state_bytes']:,} "
              f"(+{y['rebuilt_bytes']:,})")


def measure(args):
    from mindgr.generate.engine import DecodingEngine
    from mindgr.models.kv_cache import DecodeStepCell
    dec, trie, codes, backend, rng = build(args)
    steps = dec.num_levels - 1
    results = []
    for prompt in args.prompts:
        hist = [rng.integers(1, codes.shape[0], prompt // dec.num_levels) for _ in range(args.users)]
        for beam in args.beams:
            eng = DecodingEngine(dec, trie, codes, beam, prompt, args.users)
            naive = DecodingEngine(dec, trie, codes, beam, prompt, args.users, cache="recompute",
                                   selection="full_sort", masks="rebuild")
            parts = {name: DecodeStepCell(dec, args.users, beam, prompt, steps, name) for name in ("prompt", "beam")}
            # the attention-part probes run the stacked step graph's inputs (the engine's own graphs have none)
            probe = DecodingEngine(dec, trie, codes, beam, prompt, args.users, head="full")
            t0 = time.perf_counter()
            a = eng.search(hist, 10)
            b = naive.search(hist, 10)
            probe.search(hist, 10)
            for net in parts.values():
                net.set_train(False)
                net(*probe.state.last_step_inputs)
            warm = time.perf_counter() - t0
            assert (a[0] == b[0]).all(), "engine and naive lists differ"
            rec = {k: [] for k in ("e_model", "e_prompt", "e_beam", "e_select", "e_masks", "e_prefill",
                                   "n_model", "n_select", "n_masks", "e_request", "n_request")}
            for _ in range(args.repeats):
                for side, e in (("e", eng), ("n", naive)):
                    for key in e.timings:
                        e.timings[key] = 0.0
                    t1 = time.perf_counter()
                    e.search(hist, 10)
                    rec[f"{side}_request"].append(time.perf_counter() - t1)
                    # model time of the decode steps only: the engine's level 0 comes from the prefill
                    rec[f"{side}_model"].append(e.timings["model"] / (steps if side == "e" else steps + 1))
                    rec[f"{side}_select"].append(e.timings["select"] / (steps + 1))
                    rec[f"{side}_masks"].append(e.timings["masks"] / (steps + 1))
                    if side == "e":
                        rec["e_prefill"].append(e.timings["prefill"])
                for name, net in parts.items():
                    t1 = time.perf_counter()
                    net(*probe.state.last_step_inputs)[0].asnumpy()
                    rec[f"e_{name}"].append(time.perf_counter() - t1)
            med = {k: float(np.median(v)) * 1e3 for k, v in rec.items()}
            bytes_ = eng.cache_nbytes()
            blk = dec.blocks[0]
            replicated = dec.num_blocks * blk.h * (blk.dqk + blk.dv) * 4 * args.users * beam * (prompt + steps)
            row = dict(prompt=prompt, beam=beam, users=args.users, warmup_s=round(warm, 1), **{k: round(v, 3) for k, v in med.items()},
                       step_ratio=round((med["n_model"] + med["n_select"] + med["n_masks"]) /
                                        (med["e_model"] + med["e_select"] + med["e_masks"]), 2),
                       request_ratio=round(med["n_request"] / med["e_request"], 2),
                       cache_bytes=bytes_["prompt"] + bytes_["beams"], replicated_bytes=replicated)
            results.append(row)
            print(json.dumps(row), flush=True)
    return dict(backend=backend, items=int(codes.shape[0] - 1), dim=args.dim, results=results)


SHAPE_PATHS = ("children", "full")          # the engine's head= option: new path, the path before


def build_beauty_shape(args):
    """The GR decoder of configs/beauty/gr.yaml with random weights on a synthetic Beauty-shaped code table."""
    import mindspore as ms
    from mindspore import Tensor

    from mindgr.bench.train import synthetic_codes
    from mindgr.ids.trie import PrefixTrie
    from mindgr.models.generative import GRDecoder
    from mindgr.ops import set_backend
    from mindgr.runtime import select_device
    ms.set_context(mode=ms.GRAPH_MODE)
    select_device()
    backend = set_backend(args.backend)
    codes, sizes = synthetic_codes(args.items, 3, 2048, 0)
    max_history = 20
    dec = GRDecoder(sizes, 128, 2, 2, 64, 64, max_len=max_history + len(sizes) - 1, token_merger="item",
                    trie_softmax=True, seed=0)
    rng = np.random.default_rng(0)
    for p in dec.trainable_params():
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.1).astype(np.float32)))
    dec.set_train(False)
    hist = [rng.integers(1, codes.shape[0], int(rng.integers(5, max_history + 1))) for _ in range(args.users)]
    return dec, PrefixTrie(codes, sizes), codes, backend, hist, max_history


def measure_shape(args):
    """Children vs full scoring at the Beauty shape, alternated per beam (module docstring)."""
    from mindgr.generate.engine import DecodingEngine
    dec, trie, codes, backend, hist, p_cap = build_beauty_shape(args)
    u = args.users
    results = []
    for beam in args.beams:
        engines = {path: DecodingEngine(dec, trie, codes, beam, p_cap, u, head=path) for path in SHAPE_PATHS}
        engines["full"].state.share_graphs(engines["children"].state)
        t0 = time.perf_counter()
        lists = {path: e.search(hist, beam) for path, e in engines.items()}
        warm = time.perf_counter() - t0
        assert (lists["children"][0] == lists["full"][0]).all(), f"beam {beam}: children and full lists differ"
        rec = {path: {"users_s": [], "peak_mb": [], "parts": []} for path in SHAPE_PATHS}
        for r in range(args.repeats):
            for path in (SHAPE_PATHS if r % 2 == 0 else SHAPE_PATHS[::-1]):
                e = engines[path]
                for key in e.timings:
                    e.timings[key] = 0.0
                e.state.timings = {k: 0.0 for k in e.state.timings}
                t1 = time.perf_counter()
                e.search(hist, beam)
                total = time.perf_counter() - t1
                graph = e.state.timings["step"]
                tm = e.timings
                head = tm["head"] if path == "children" else tm["model"] - graph   # full: host log-softmax
                parts = {"prefill": tm["prefill"], "step": graph, "head": head, "masks": tm["masks"],
                         "select": tm["select"]}
                parts["other"] = total - sum(parts.values())
                rec[path]["users_s"].append(u / total)
                rec[path]["parts"].append({k: v / u * 1e3 for k, v in parts.items()})      # ms per user
        row = dict(beam=beam, users=u, warmup_s=round(warm, 1))
        if not args.rss_child:           # each path's peak in a fresh process: one path's freed pools are
            for path in SHAPE_PATHS:     # not counted against the other
                rec[path]["peak_mb"] = [_child_peak(args, beam, path)]
        for path in SHAPE_PATHS:
            rate = np.asarray(rec[path]["users_s"])
            parts = {k: round(float(np.median([p[k] for p in rec[path]["parts"]])), 3)
                     for k in rec[path]["parts"][0]}
            row[path] = dict(users_s=round(float(np.median(rate)), 1), min=round(float(rate.min()), 1),
                             max=round(float(rate.max()), 1),
                             peak_mb=round(float(np.median(rec[path]["peak_mb"])), 0), ms_per_user=parts)
        ratio = np.asarray(rec["children"]["users_s"]) / np.asarray(rec["full"]["users_s"])
        row["ratio"] = round(float(np.median(ratio)), 1)
        row["ratio_range"] = [round(float(ratio.min()), 1), round(float(ratio.max()), 1)]
        results.append(row)
        print(json.dumps(row), flush=True)
        del engines, lists
    return dict(backend=backend, items=int(codes.shape[0] - 1), level_sizes=[int(x) for x in trie.level_sizes],
                shape="beauty", threads=args.threads, results=results)


def _child_peak(args, beam: int, path: str) -> float:
    """Peak resident MB of a fresh process that builds the same decoder and runs one path's searches."""
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "mindgr.bench.decode", "--shape", "beauty", "--beams", str(beam), "--users",
           str(args.users), "--items", str(args.items), "--threads", str(args.threads), "--backend", args.backend,
           "--rss-child", path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["peak_mb"])


def shape_child(args):
    """--rss-child PATH: one path's two searches of one batch in this (fresh) process; prints its peak."""
    from mindgr.generate.engine import DecodingEngine
    from mindgr.train.gr_eval import peak_rss_mb
    dec, trie, codes, _, hist, p_cap = build_beauty_shape(args)
    e = DecodingEngine(dec, trie, codes, args.beams[0], p_cap, args.users, head=args.rss_child)
    for _ in range(2):
        e.search(hist, args.beams[0])
    print(json.dumps({"path": args.rss_child, "beam": args.beams[0], "peak_mb": round(peak_rss_mb(), 0)}))


def print_shape(out):
    print("Beauty shape: users/s of a batch's search, median [min-max] over the rounds; peak MB: the resident "
          "high-water mark of a fresh process running that path's searches; ms per user by part (prefill / step graphs / head / "
          "masks / select / other)")
    print(f"{'beam':>4} | {'path':<8} | {'users/s':<22} | {'peak MB':>8} | ms/user: prefill   step   head  masks "
          f"select  other | new / old")
    for r in out["results"]:
        for path in SHAPE_PATHS:
            c = r[path]
            p = c["ms_per_user"]
            ratio = f"{r['ratio']:.1f}x [{r['ratio_range'][0]:.1f}-{r['ratio_range'][1]:.1f}]" if path == "children" else ""
            print(f"{r['beam']:>4} | {path:<8} | {c['users_s']:7.1f} [{c['min']:.1f}-{c['max']:.1f}]{'':<4} | "
                  f"{c['peak_mb']:8.0f} | {p['prefill']:14.3f} {p['step']:6.3f} {p['head']:6.3f} {p['masks']:6.3f} "
                  f"{p['select']:6.3f} {p['other']:6.3f} | {ratio}")


def add_arguments(ap):
    ap.add_argument("--beams", type=int, nargs="+", default=[16, 64], help="beam widths")
    ap.add_argument("--prompts", type=int, nargs="+", default=[50, 200], help="prompt lengths (tokens)")
    ap.add_argument("--users", type=int, default=2, help="users decoded together")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (medians)")
    ap.add_argument("--items", type=int, default=12101, help="catalogue size")
    ap.add_argument("--dim", type=int, default=64, help="decoder width")
    ap.add_argument("--blocks", type=int, default=2, help="decoder blocks")
    ap.add_argument("--heads", type=int, default=2, help="attention heads")
    ap.add_argument("--threads", type=int, default=0, help="MindSpore CPU threads (0: its default)")
    ap.add_argument("--backend", default="auto", help="ops backend")
    ap.add_argument("--shape", choices=("random", "beauty"), default="random",
                    help="beauty: the decoder and code-table shape of configs/beauty/gr.yaml, children vs full "
                         "scoring (users/s, peak memory, time by part)")
    ap.add_argument("--rss-child", choices=SHAPE_PATHS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backbone", choices=("hstu", "linear"), default="hstu",
                    help="decoder blocks: hstu (engine vs naive) or linear (onela, per_beam_state, replay)")
    ap.add_argument("--out", default=None, help="also write the JSON here")


def run(args) -> int:
    if args.threads:
        from mindgr.runtime import limit_threads, select_device
        select_device()
        limit_threads(args.threads)
    if args.rss_child:
        shape_child(args)
        return 0
    if args.shape == "beauty":
        measure_fn, print_fn = measure_shape, print_shape
    elif args.backbone == "linear":
        measure_fn, print_fn = measure_linear, print_linear
    else:
        measure_fn, print_fn = measure, print_engine_vs_naive
    out = measure_fn(args)
    print_fn(out)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def print_engine_vs_naive(out):
    print(f"{'prompt':>6} {'beam':>4} | {'engine ms/step: model (prompt, beam) select masks':<52} | "
          f"{'naive ms/step: model select masks':<36} | step ratio | request ms engine / naive (ratio)")
    for r in out["results"]:
        print(f"{r['prompt']:>6} {r['beam']:>4} | {r['e_model']:8.2f} ({r['e_prompt']:7.2f}, {r['e_beam']:7.2f})"
              f" {r['e_select']:8.3f} {r['e_masks']:8.3f}{'':>8} | {r['n_model']:9.2f} {r['n_select']:8.3f}"
              f" {r['n_masks']:8.2f}{'':>7} | {r['step_ratio']:9.1f}x | {r['e_request']:8.1f} / "
              f"{r['n_request']:8.1f} ({r['request_ratio']:.1f}x)")


def main(argv=None):
    """`python -m mindgr.bench.decode`, as recorded in benchmarks/results: the same as `mindgr bench decode`."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
