"""`mindgr bench sparse`: embedding traffic of the sharded layouts, modelled and measured, and the
semi-asynchronous exchange at staleness 0 / 1 / 2 side by side.

Modelled part (one process, no communication): the ids every rank of a `nodes x L` job would look up,
from the config's real batches, split over ranks by the trainer's own planner, with the trainer's
negatives (per-token rows, or the step's shared pool, which every rank of the job looks up). Weak scaling
from the measured 2 x 2 job: a rank of any topology trains what a rank of the 2 x 2 job trains (topology
with W ranks = W / 4 consecutive global batches, each split 4 ways; one pool per step, the trainer's pool
of the first of them); --measured-world 2 models a 2-process job's split instead.
mindgr.parallel.sparse.traffic.model_step turns the id sets into bytes per node for the hierarchical,
flat and data-parallel layouts (the msrun self-check verifies that it reproduces the trainer's byte
counters exactly) and the two-bandwidth model into seconds.

Measured part: 4-process training runs (2 node groups x 2 local ranks, parallel.sparse=hierarchical) at
each staleness, launched here (--train) or read from --runs: bytes counted by the trainer, step time,
exchange wait, HR@10 / NDCG@10 of the best validation checkpoint on the test split.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mindgr.bench import add_config_arguments, add_out_argument, config_overrides, load_bench_config, write_result
from mindgr.config import load_config


class _Batches:
    """The config's data, sampler and planners, built once for every modelled topology."""

    def __init__(self, cfg, measured_world: int = 4):
        import copy
        from mindgr.parallel.balance import CostModel
        from mindgr.parallel.plan import RankPlanner, rank_capacities
        from mindgr.train.data import RunData
        from mindgr.train.negatives import item_frequencies
        from mindgr.train.local import HostSampler
        cfg = copy.deepcopy(cfg)
        cfg.model.dropout = 0.0                                   # masks do not change the ids: skip them
        self.data = data = RunData(cfg)
        tr = data.train
        self.measured_world = measured_world
        self.tokens, rows = rank_capacities(tr.token_capacity, tr.row_capacity, measured_world,
                                            cfg.parallel.capacity_slack)
        self.planners = [RankPlanner(tr, measured_world, r, self.tokens, rows, CostModel(a=1.0, b=0.0), "cost",
                                     cfg.run.seed) for r in range(measured_world)]
        self.freq = item_frequencies(data.split.train, data.num_items)
        self.sampler = HostSampler(cfg, data.num_items, SimpleNamespace(dropout_sites=1, dropout_width=1),
                                   tr.token_capacity, self.freq)
        self.epoch_batches = [(0, b) for b in data.plan.iter_batches(0)]

    def batches(self, need: int):
        """`need` consecutive (epoch, (b, indices)) of the training schedule, epoch after epoch."""
        out, epoch = list(self.epoch_batches), 0
        while len(out) < need:
            epoch += 1
            if epoch > 64:
                raise ValueError(f"bench sparse: {need} batches need more than 64 epochs of this data")
            out += [(epoch, b) for b in self.data.plan.iter_batches(epoch)]
        return out[:need]


def _rank_ids(src: _Batches, steps: int, world: int):
    """For each of `steps` steps, the distinct ids of each of `world` ranks (weak scaling from
    `measured_world` ranks per global batch); the table's rows; the (tokens, rows) capacities of the
    `world`-rank job's global batch (W / measured_world global batches of the config)."""
    from mindgr.parallel.plan import local_rows
    tr = src.data.train
    per_step = max(1, world // src.measured_world)
    batches = src.batches(steps * per_step)
    shared = src.sampler.negatives.shared
    out = []
    for s in range(steps):
        ranks = []
        step_batches = batches[s * per_step: (s + 1) * per_step]
        if shared:      # one pool per step for the whole job: the trainer's pool of the step's first batch
            epoch0, (b0, _) = step_batches[0]
            pool = src.sampler.draw_negatives(epoch0, b0)[0]
        for epoch, (b, indices) in step_batches:
            batch_ids = tr.batch(indices)
            negatives = None if shared else src.sampler.draw_negatives(epoch, b)
            for p in src.planners:
                share = p.share(epoch, b, indices)
                neg = pool if shared else local_rows(negatives, share.token_src, src.tokens, fill=1)
                ids = batch_ids.ids[share.token_src]
                tgt = batch_ids.targets[share.token_src]
                ranks.append(np.unique(np.concatenate([[0], ids, tgt, neg.ravel()]).astype(np.int64)))
        out.append(ranks[:world])
    return out, src.data.num_items + 1, (tr.token_capacity * per_step, tr.row_capacity * per_step)


LAYOUTS = ("flat", "hierarchical", "frequency", "dp")


def model_topologies(cfg, topologies, steps: int, measured_world: int = 4) -> list[dict]:
    from mindgr.parallel.sparse.layout import plan_table
    from mindgr.parallel.sparse.topology import Topology
    from mindgr.parallel.sparse.traffic import Bandwidth, model_step
    bw = Bandwidth(cfg.parallel.intra_gbps, cfg.parallel.inter_gbps)
    dim = cfg.model.dim
    src = _Batches(cfg, measured_world)
    rows = []
    for nodes, local in topologies:
        world = nodes * local
        per_step, num_rows, capacity = _rank_ids(src, steps, world)
        plans = {layout: plan_table(Topology(nodes, local, 0), cfg, num_rows - 1, *capacity, layout, freq=src.freq)
                 for layout in LAYOUTS if layout != "dp"}
        hot = plans["frequency"].hot
        acc = {}
        for ids in per_step:
            for layout, b in model_step(ids, nodes, local, dim, num_rows, hot=hot).items():
                a = acc.setdefault(layout, {"intra": 0.0, "inter": 0.0, "seconds": 0.0})
                a["intra"] += b["intra"].sum() / steps
                a["inter"] += b["inter"].sum() / steps
                a["seconds"] += bw.seconds(b["intra"], b["inter"]) / steps
        uniq = np.mean([np.mean([len(x) for x in ids]) for ids in per_step])
        node_uniq = np.mean([np.mean([len(np.unique(np.concatenate(ids[n * local:(n + 1) * local])))
                                      for n in range(nodes)]) for ids in per_step])
        step_uniq = np.mean([len(np.unique(np.concatenate(ids))) for ids in per_step])
        hot_set = np.zeros(num_rows, bool)
        hot_set[hot] = True
        hot_share = np.mean([np.mean([hot_set[x].mean() for x in ids]) for ids in per_step])
        for layout in LAYOUTS:
            a = acc[layout]
            plan = plans.get(layout)               # the trainer's plan for this topology (rank 0's)
            rows.append({"topology": f"{nodes}x{local}", "layout": layout,
                         "table_rows_per_rank": plan.rows if plan else num_rows,
                         "unique_capacity": plan.unique_capacity if plan else None,
                         "intra_MB": a["intra"] / 1e6, "inter_MB": a["inter"] / 1e6, "model_ms": a["seconds"] * 1e3,
                         "unique_ids_per_rank": float(uniq), "unique_ids_per_node": float(node_uniq),
                         "unique_ids_per_step": float(step_uniq), "table_rows": num_rows, "dim": dim,
                         **({"hot_rows": int(len(hot)), "hot_share_of_rank_ids": float(hot_share),
                             "hot_cut": plan.cut} if layout == "frequency" else {})})
    return rows


def _read_run(run: Path) -> dict:
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in metrics if "loss" in r][1:]          # the first window holds the compile
    ev = json.loads((run / "eval.json").read_text())
    import yaml
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    mean = (lambda k: float(np.mean([r[k] for r in windows])) if windows else float("nan"))
    par = cfg["parallel"]
    link = (lambda k: mean(k) if windows and k in windows[0] else 0.0)     # logged only with the link on
    return {"run": str(run), "staleness": par["staleness"], "seed": cfg["run"]["seed"], "steps": ev["step"],
            "link_latency_ms": par.get("link_latency_ms", 0.0), "link_gbps": par.get("link_gbps", 0.0),
            "link_delay_ms": link("sparse_link_delay_s") * 1e3, "link_wait_ms": link("sparse_link_wait_s") * 1e3,
            "step_time_ms": mean("step_time_s") * 1e3, "compute_ms": float(np.mean([np.mean(r["rank_step_s"])
                                                                                     for r in windows])) * 1e3,
            "lookup_ms": mean("sparse_lookup_s") * 1e3, "exchange_wait_ms": mean("sparse_exchange_wait_s") * 1e3,
            "intra_MB": mean("sparse_intra_bytes") / 1e6, "inter_MB": mean("sparse_inter_bytes") / 1e6,
            "staleness_max": max(r["staleness_max"] for r in windows) if windows else None,
            "test_hr@10": ev["test"].get("hr@10"), "test_ndcg@10": ev["test"].get("ndcg@10"),
            "valid_hr@10": ev["valid"].get("hr@10")}


def _train_rounds(config, overrides, taus: list[int], seeds: list[int], out_dir: Path) -> list[Path]:
    """One round per seed, every tau in it, the order of the taus reversed every other round (so drifting
    load on a shared host does not favour one tau); runs seed{S}/tau{T} under out_dir."""
    dirs = []
    for i, seed in enumerate(seeds):
        order = taus if i % 2 == 0 else taus[::-1]
        for tau in order:
            print(f"round {i + 1}: training tau={tau} seed={seed} on 4 processes (2 x 2) ...", flush=True)
            dirs.append(_train_with_config(config, [*overrides, f"run.seed={seed}"], tau, out_dir / f"seed{seed}",
                                           f"tau{tau}"))
    return dirs


def summarize(measured: list[dict]) -> dict:
    """Per tau over its runs (seeds): step time median and range, exchange and link waits, the metrics;
    step time relative to tau = 0 (ratio of medians)."""
    out = {}
    for tau in sorted({m["staleness"] for m in measured}):
        ms = [m for m in measured if m["staleness"] == tau]
        st = [m["step_time_ms"] for m in ms]
        out[tau] = {"runs": len(ms), "step_ms_median": float(np.median(st)), "step_ms_min": float(min(st)),
                    "step_ms_max": float(max(st)),
                    **{f"{k}_median": float(np.median([m[k] for m in ms]))
                       for k in ("compute_ms", "exchange_wait_ms", "link_delay_ms", "link_wait_ms")},
                    "test_hr@10_mean": float(np.mean([m["test_hr@10"] for m in ms])),
                    "test_ndcg@10_mean": float(np.mean([m["test_ndcg@10"] for m in ms]))}
    if 0 in out:
        for tau, v in out.items():
            v["step_time_vs_tau0"] = v["step_ms_median"] / out[0]["step_ms_median"]
            # paired: each run against the tau 0 run of its round (its directory), trained just before or after
            base = {Path(m["run"]).parent: m["step_time_ms"] for m in measured if m["staleness"] == 0}
            ratios = [m["step_time_ms"] / base[Path(m["run"]).parent] for m in measured
                      if m["staleness"] == tau and Path(m["run"]).parent in base]
            if ratios:
                v.update({"paired_ratio_median": float(np.median(ratios)), "paired_ratio_min": float(min(ratios)),
                          "paired_ratio_max": float(max(ratios)), "paired_rounds": len(ratios)})
    return out


def bench_sparse(config, overrides, topologies: str = "2x2,8x8,64x8", steps: int = 5, runs: str = "",
                 train: bool = False, out_dir: str = "runs/bench-sparse", taus: str = "0,1,2", seeds: str = "",
                 out=None, measured_world: int = 4) -> dict:
    from mindgr.bench.distributed_common import machine_load
    cfg = load_config(config, overrides)
    topo = [tuple(int(x) for x in t.split("x")) for t in topologies.split(",") if t]
    t0 = time.perf_counter()
    modelled = model_topologies(cfg, topo, steps, measured_world)
    negatives = (f"shared pool of {cfg.loss.pool_size} ids per step" if cfg.loss.negatives == "shared_pool"
                 else f"{cfg.loss.num_negatives} per-token negatives")
    print(f"modelled traffic per step (weak scaling from a {measured_world}-rank job; {steps} steps; {negatives}; "
          f"intra {cfg.parallel.intra_gbps:g} GB/s, inter {cfg.parallel.inter_gbps:g} GB/s per node) "
          f"[{time.perf_counter() - t0:.0f}s]")
    print("MB summed over nodes; distinct ids per rank / per node group / in the whole step")
    print("layouts: flat; hierarchical (every row replicated per node group); frequency (hot rows replicated, "
          "cold rows flat, two-stage exchange); dp (replicated table, dense all-reduce)")
    print(f"{'topology':>8} {'layout':>12} {'intra MB':>10} {'inter MB':>10} {'model ms':>9} {'ids/rank':>9} "
          f"{'ids/node':>9} {'ids/step':>9} {'rows/rank':>10} {'U_cap':>7}")
    for r in modelled:
        print(f"{r['topology']:>8} {r['layout']:>12} {r['intra_MB']:10.2f} {r['inter_MB']:10.2f} "
              f"{r['model_ms']:9.3f} {r['unique_ids_per_rank']:9.0f} {r['unique_ids_per_node']:9.0f} "
              f"{r['unique_ids_per_step']:9.0f} {r['table_rows_per_rank']:10d} {r['unique_capacity']!s:>7}")
    ratios = {}
    for t in dict.fromkeys(r["topology"] for r in modelled):
        by = {r["layout"]: r for r in modelled if r["topology"] == t}
        inter = {k: max(v["inter_MB"], 1e-12) for k, v in by.items()}
        ratios[t] = {"flat_over_frequency_inter": inter["flat"] / inter["frequency"],
                     "flat_over_hierarchical_inter": inter["flat"] / inter["hierarchical"],
                     "dp_over_frequency_inter": inter["dp"] / inter["frequency"]}
        f = by["frequency"]
        print(f"{t}: frequency layout: {f['hot_rows']} hot rows ({f['hot_cut']['rule']}), "
              f"{f['hot_share_of_rank_ids']:.1%} of a rank's distinct ids; inter-node bytes flat / frequency = "
              f"{ratios[t]['flat_over_frequency_inter']:.2f}x, flat / hierarchical = "
              f"{ratios[t]['flat_over_hierarchical_inter']:.2f}x, data parallel / frequency = "
              f"{ratios[t]['dp_over_frequency_inter']:.2f}x")
    measured = []
    run_dirs = [Path(p.split("=", 1)[-1]) for p in runs.split(",") if p]
    if train and seeds:
        run_dirs += _train_rounds(config, overrides, [int(t) for t in taus.split(",")],
                                  [int(s) for s in seeds.split(",")], Path(out_dir))
    elif train:
        for tau in taus.split(","):
            print(f"training tau={tau} on 4 processes (2 x 2) ...", flush=True)
            run_dirs.append(_train_with_config(config, overrides, int(tau), Path(out_dir), f"tau{tau}"))
    for run in run_dirs:
        measured.append(_read_run(run))
    if measured:
        links = {(m["link_latency_ms"], m["link_gbps"]) for m in measured}
        print("measured, 4 processes (2 node groups x 2 local ranks), per step; modelled link "
              + ", ".join(f"{lat:g} ms per cross-node message + bytes / {gb:g} GB/s per node" if lat or gb else "off"
                          for lat, gb in sorted(links)))
        print(f"{'tau':>4} {'seed':>4} {'steps':>6} {'step ms':>8} {'compute':>8} {'lookup':>7} {'wait':>7} "
              f"{'link':>6} {'l.wait':>6} {'intra MB':>9} {'inter MB':>9} {'max lag':>7} {'HR@10':>7} {'NDCG@10':>8}")
        for m in measured:
            print(f"{m['staleness']:>4} {m['seed']:>4} {m['steps']:>6} {m['step_time_ms']:8.1f} {m['compute_ms']:8.1f} "
                  f"{m['lookup_ms']:7.1f} {m['exchange_wait_ms']:7.1f} {m['link_delay_ms']:6.1f} "
                  f"{m['link_wait_ms']:6.1f} {m['intra_MB']:9.3f} {m['inter_MB']:9.3f} "
                  f"{m['staleness_max']!s:>7} {m['test_hr@10']:7.4f} {m['test_ndcg@10']:8.4f}")
        base = [m for m in measured if m["staleness"] == 0]
        if len({m["seed"] for m in measured}) > 1:        # several seeds: per-tau summary, no per-run ratios
            summary = summarize(measured)
            print("per tau over seeds: step ms median [min, max], medians of compute / exchange wait / link "
                  "delay / link wait, mean test HR@10 / NDCG@10")
            for tau, v in summary.items():
                print(f"tau={tau}: {v['step_ms_median']:.1f} [{v['step_ms_min']:.1f}, {v['step_ms_max']:.1f}] ms"
                      f" ({v.get('step_time_vs_tau0', float('nan')):.3f}x tau 0); compute {v['compute_ms_median']:.1f}"
                      f", wait {v['exchange_wait_ms_median']:.1f}, link {v['link_delay_ms_median']:.1f}"
                      f" / {v['link_wait_ms_median']:.1f} ms; HR@10 {v['test_hr@10_mean']:.4f}, NDCG@10 "
                      f"{v['test_ndcg@10_mean']:.4f} ({v['runs']} runs)")
                if tau and "paired_rounds" in v:
                    print(f"       step time / tau 0's in the same round: median {v['paired_ratio_median']:.3f}x "
                          f"[{v['paired_ratio_min']:.3f}, {v['paired_ratio_max']:.3f}] over {v['paired_rounds']} rounds")
            base = []
        for m in measured:
            if base and m["staleness"]:
                rel = (m["test_hr@10"] - base[0]["test_hr@10"]) / base[0]["test_hr@10"]
                m["hr@10_rel_to_tau0"] = rel
                print(f"tau={m['staleness']}: HR@10 {rel * 100:+.2f}% relative to tau=0 "
                      f"({'within' if abs(rel) <= 0.01 else 'NOT within'} 1%), step time "
                      f"{(m['step_time_ms'] / base[0]['step_time_ms'] - 1) * 100:+.1f}%")
    result = {"modelled": modelled, "ratios": ratios, "measured": measured, "machine": machine_load(),
              "negatives": cfg.loss.negatives, "pool_size": cfg.loss.pool_size if cfg.loss.negatives == "shared_pool"
              else 0, "measured_world": measured_world}
    if len({m["seed"] for m in measured}) > 1:
        result["by_tau"] = summarize(measured)
    return write_result(result, out)


def _train_with_config(config, overrides, tau, out_dir: Path, name: str) -> Path:
    """`mindgr train --config C --nproc 4` with the sharded table at staleness tau."""
    import sys
    from mindgr.parallel.launch import run_job
    cmd = [sys.executable, "-m", "mindgr", "train", *(["--config", str(config)] if config else []), "--nproc", "4",
           *overrides,
           "parallel.sparse=hierarchical", "parallel.nodes=2", "parallel.local_ranks=2",
           f"parallel.staleness={tau}", f"run.out_dir={out_dir}", f"run.name={name}"]
    code, out, err, timed_out = run_job(cmd, 7200)
    if timed_out or code != 0:
        raise RuntimeError(f"bench sparse: run {name} failed (exit {code}):\n{err[-3000:]}")
    return out_dir / name


def add_arguments(parser):
    add_config_arguments(parser)
    parser.add_argument("--topologies", default="2x2,8x8,64x8", help="modelled nodes x local ranks")
    parser.add_argument("--model-steps", type=int, default=5, help="steps whose ids the traffic model uses")
    parser.add_argument("--measured-world", type=int, default=4,
                        help="ranks of the job a modelled rank trains like (weak scaling; 2 for a 2-process run)")
    parser.add_argument("--runs", default="", help="measured run directories to report (comma separated)")
    parser.add_argument("--train", action="store_true", help="train the staleness runs on 4 processes first")
    parser.add_argument("--taus", default="0,1,2", help="--train: staleness values")
    parser.add_argument("--seeds", default="", help="--train: run.seed values, one round of every tau each, the "
                                                     "taus' order reversed every other round (e.g. 0,1,2)")
    parser.add_argument("--out-dir", default="runs/bench-sparse", help="--train: where the runs go")
    add_out_argument(parser)


def run(args) -> int:
    load_bench_config(args)
    bench_sparse(args.config, config_overrides(args), topologies=args.topologies, steps=args.model_steps,
                 runs=args.runs, train=args.train, out_dir=args.out_dir, taus=args.taus, seeds=args.seeds,
                 out=args.out, measured_world=args.measured_world)
    return 0
