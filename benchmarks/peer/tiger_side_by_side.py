"""MindGR against a PyTorch TIGER (snap-research/GRID), side by side on Amazon Beauty at one code shape.

Run from the repository root with MindGR's Python; the peer runs in its own Python and checkout:

    python benchmarks/peer/tiger_side_by_side.py --peer-python PEER_VENV/bin/python --peer-src GRID_CHECKOUT

1. Data: Beauty (configs/beauty/gr.yaml's data section) and one semantic-ID table of MindGR's Beauty
   shape (3 x 2048 codes + the de-duplication digit): `--codes PARQUET` (from `mindgr ids build`), else a
   seeded synthetic table (mindgr.bench.train.synthetic_codes). MindGR reads it as ids.codes; the peer gets
   the same table and the same split (`beauty_for_peer`): each user's training items (all but the last
   two, as data.holdout 2) as its training rows, and the last data.max_len items before the test item as
   its decode prompts (grid_side.py writes GRID's TFRecords and id table from them).
2. Rounds (order rotated each round), one thread per side:
   - peer training: GRID's training (grid_train.py: its pipeline_launcher and trainer.fit, as its
     `src.train` does) with `experiment=tiger_train_flat` for --train-steps steps (overrides only: CPU,
     no validation or test, a history of data.max_len items, no gradient accumulation);
   - MindGR training: `mindgr bench train --config configs/beauty/gr.yaml ids.codes=TABLE`;
   - peer decode: GRID's own `src.inference experiment=tiger_inference_flat` of --decode-users prompts at
     top_k_for_generation = --beam, from the checkpoint its first training run left;
   - MindGR decode: `mindgr bench decode --shape beauty --beams BEAM` (the engine's default scoring,
     random weights and histories of Beauty's shape).
3. Figures: training target items/s (one (prompt, next item) pair = one item on both sides), tokens/s
   (each side's own tokens) and model GFLOP per item (MindGR: its bench's count; the peer: torch's
   FlopCounterMode over its untimed first step), decode users/s; ratios MindGR / peer per round, median [min, max], with each
   side's parameter count, the CPU model and the load average; JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/beauty/gr.yaml"


def beauty_for_peer(item_seqs, codes: np.ndarray, max_len: int, holdout: int = 2) -> dict:
    """The peer's view of MindGR's data: arrays for peer.npz.

    item_seqs: per user, dense item ids 1..V (chronological); codes: [V+1, L+1] (row 0 unused).
    train_*: each user's training items (all but the last `holdout`) as 0-based ids, flat with offsets;
    test_*: the last max_len items before each user's test item; sids: [L+1, V], column i = item i+1."""
    train, test = [], []
    for s in item_seqs:
        s = np.asarray(s, np.int64) - 1
        train.append(s[:-holdout])
        test.append(s[:-1][-max_len:])
    flat = lambda xs: (np.concatenate(xs), np.concatenate([[0], np.cumsum([len(x) for x in xs])]))
    (train_items, train_off), (test_items, test_off) = flat(train), flat(test)
    users = np.arange(len(item_seqs), dtype=np.int64)
    return {"train_items": train_items, "train_offsets": train_off, "train_users": users,
            "test_items": test_items, "test_offsets": test_off, "test_users": users,
            "sids": np.ascontiguousarray(np.asarray(codes, np.int64)[1:].T)}


def mindgr_items_per_token(item_seqs, levels: int, max_len: int, token_merger: str, holdout: int = 2) -> float:
    """Target items per GR token of MindGR's training rows over an epoch (its ntp rows of each user's last
    max_len + 1 training items): turns `mindgr bench train`'s real tokens/s into items/s."""
    from mindgr.train.gr_data import row_token_counts
    rows = tokens = 0
    for s in item_seqs:
        n = min(len(s) - holdout, max_len + 1)
        counts = row_token_counts(n, levels, "ntp", token_merger)
        rows, tokens = rows + len(counts), tokens + sum(counts)
    return rows / tokens


def prepare(out: Path, codes_path: str | None, seed: int, decode_users: int) -> dict:
    """Write the code table (if synthetic) and peer.npz (the first `decode_users` users' decode prompts)
    into `out`; return what the rounds need."""
    from mindgr.config import load_config
    from mindgr.ids.codes import load_codes, save_codes
    from mindgr.train.data import load_store
    cfg = load_config(str(ROOT / CONFIG), [f"data.path={ROOT / '../shared/data/amazon-beauty/Beauty.txt'}"])
    store = load_store(cfg.data, cfg.run.seed)
    if codes_path:
        codes, sizes, _ = load_codes(codes_path)
        source = f"semantic IDs {codes_path}"
    else:
        from mindgr.bench.train import synthetic_codes
        codes, sizes = synthetic_codes(store.num_items, 3, 2048, seed)
        codes_path = str(save_codes(out / "codes.parquet", codes, sizes, store.item_raw_ids, {"synthetic": True}))
        source = f"synthetic codes {'x'.join(str(int(s)) for s in sizes)} (seed {seed})"
    z = beauty_for_peer(store.item_seqs, codes, cfg.data.max_len, cfg.data.holdout)
    n = min(decode_users, store.num_users)
    z["test_items"], z["test_offsets"] = z["test_items"][:z["test_offsets"][n]], z["test_offsets"][:n + 1]
    z["test_users"] = z["test_users"][:n]
    np.savez(out / "peer.npz", **z)
    ratio = mindgr_items_per_token(store.item_seqs, codes.shape[1], cfg.data.max_len, cfg.model.token_merger,
                                   cfg.data.holdout)
    from mindgr.models.generative import build_decoder
    dec = build_decoder(cfg.model, [int(s) for s in sizes], cfg.data.max_len, cfg.run.seed, store.num_items)
    return {"mindgr_params": int(sum(int(np.prod(p.shape)) for p in dec.trainable_params())),
            "codes": codes_path, "codes_source": source, "levels": int(codes.shape[1]),
            "max_len": cfg.data.max_len, "users": store.num_users, "items": store.num_items,
            "mindgr_items_per_token": ratio, "max_code": int(np.max(sizes))}


def _env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
               MS_COMPILER_CACHE_ENABLE="0", GLOG_v="3", HYDRA_FULL_ERROR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "benchmarks" / "peer")])
    return env


def _run(cmd, cwd, env, log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(["nice", "-n", "5", *cmd], cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = log.read_text().strip().splitlines()[-5:]
        raise SystemExit(f"command failed ({rc}): {' '.join(map(str, cmd))}\n  " + "\n  ".join(tail))
    return time.perf_counter() - t0


def peer_common(data: Path, prep: dict, run_dir: Path, timer: Path) -> list:
    return [f"data_dir={data}", f"semantic_id_path={data / 'sids.pt'}", f"num_hierarchies={prep['levels']}",
            "trainer.accelerator=cpu", "trainer.devices=1", "trainer.strategy=auto", "trainer.precision=32-true",
            f"hydra.run.dir={run_dir}", "+callbacks.peer_timer._target_=grid_side.Timer",
            f"+callbacks.peer_timer.out={timer}"]


def peer_train_cmd(py, data, prep, run_dir, timer, steps: int) -> list:
    dl = "data_loading.train_dataloader_config.dataloader"
    # history of max_len items plus the target item's codes, as MindGR's rows (GRID's default: 30 items)
    seq = (prep["max_len"] + 1) * prep["levels"]
    return [py, str(ROOT / "benchmarks" / "peer" / "grid_train.py"), "experiment=tiger_train_flat",
            *peer_common(data, prep, run_dir, timer),
            f"sequence_length={seq}", f"trainer.max_steps={steps}", "trainer.accumulate_grad_batches=1",
            "trainer.val_check_interval=1000000", "trainer.log_every_n_steps=1000000", "test=false",
            f"{dl}.num_workers=1", "callbacks.early_stopping=null", "callbacks.model_summary=null",
            "callbacks.restart_job=null",
            "callbacks.model_checkpoint.monitor=null", f"callbacks.model_checkpoint.every_n_train_steps={steps}",
            "callbacks.model_checkpoint.save_top_k=-1"]


def peer_decode_cmd(py, data, prep, run_dir, timer, ckpt, beam: int, batch: int) -> list:
    dl = "data_loading.predict_dataloader_config.dataloader"
    return [py, "-m", "src.inference", "experiment=tiger_inference_flat", *peer_common(data, prep, run_dir, timer),
            f"ckpt_path={ckpt}", f"sequence_length={prep['max_len'] * prep['levels']}",
            f"model.top_k_for_generation={beam}", f"{dl}.batch_size_per_device={batch}", f"{dl}.num_workers=1",
            "callbacks.pickle_writer=null"]     # its predictions are not needed (and its merge wants a process group)


def read_timer(path: Path) -> dict:
    rec = json.loads(path.read_text())
    rows = rec["rows"][rec["skip"]:]        # the first step / batch: allocator and lazy set-up
    s = sum(r["s"] for r in rows)
    out = {"params": rec["params"], "torch": rec["torch"], "threads": rec["threads"], "timed": len(rows), "s": s}
    if rec["kind"] == "train":
        if rec.get("first_step_flops"):
            f = rec["first_step_flops"]
            out["gflop_per_item"] = f["flops"] / f["examples"] / 1e9
        out["items_per_s"] = sum(r["examples"] for r in rows) / s
        out["tokens_per_s"] = sum(r["tokens"] for r in rows) / s
        out["step_s_median"] = float(np.median([r["s"] for r in rows]))
    else:
        out["users_per_s"] = sum(r["users"] for r in rows) / s
    return out


def mindgr_train(args, prep, tmp: Path, env, r: int) -> dict:
    out = tmp / f"mindgr-train-{r}.json"
    cmd = [sys.executable, "-m", "mindgr", "bench", "train", "--config", CONFIG, f"ids.codes={prep['codes']}",
           f"parallel.threads={args.threads}", "--steps", str(args.mindgr_steps), "--warmup", "3", "--out", str(out)]
    wall = _run(cmd, ROOT, env, tmp / f"mindgr-train-{r}.log")
    rec = json.loads(out.read_text())
    tps = rec["real_tokens_per_s"]
    flops_per_token = rec["mfu"] * rec["peak_gflops"] * 1e9 / tps       # the bench's model FLOPs per real token
    return {"tokens_per_s": tps, "items_per_s": tps * prep["mindgr_items_per_token"],
            "gflop_per_item": flops_per_token / prep["mindgr_items_per_token"] / 1e9,
            "step_s_median": rec["step_time_s_median"], "wall_s": wall}


def mindgr_decode(args, tmp: Path, env, r: int) -> dict:
    out = tmp / f"mindgr-decode-{r}.json"
    cmd = [sys.executable, "-m", "mindgr", "bench", "decode", "--shape", "beauty", "--beams", str(args.beam),
           "--users", str(args.mindgr_users), "--repeats", "2", "--threads", str(args.threads), "--out", str(out)]
    wall = _run(cmd, ROOT, env, tmp / f"mindgr-decode-{r}.log")
    return {"raw": json.loads(out.read_text()), "wall_s": wall}


def mindgr_decode_users_per_s(raw: dict, beam: int) -> float:
    """The engine's default scoring (children) at `beam` from `mindgr bench decode --shape beauty`'s JSON."""
    for cell in raw["results"]:
        if cell["beam"] == beam:
            return float(cell["children"]["users_s"])
    raise KeyError(f"no children cell at beam {beam}")


def summary(values) -> dict:
    v = np.asarray(values, np.float64)
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "rounds": [float(x) for x in v]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer-python", required=True, help="the peer's Python (with torch, lightning, tensorflow)")
    p.add_argument("--peer-src", required=True, help="a checkout of snap-research/GRID")
    p.add_argument("--codes", help="a semantic-ID table (mindgr ids build); default: synthetic, Beauty's shape")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="compute threads per side")
    p.add_argument("--train-steps", type=int, default=4, help="peer training steps (the first is untimed)")
    p.add_argument("--mindgr-steps", type=int, default=30, help="MindGR timed training steps (after 3 warm-up)")
    p.add_argument("--beam", type=int, default=40)
    p.add_argument("--decode-users", type=int, default=160, help="peer prompts decoded (the first batch untimed)")
    p.add_argument("--decode-batch", type=int, default=32, help="peer users per decode batch (GRID's default; "
                   "its per-user cost is flat in the batch, and its cross-attention caches grow with batch x beam)")
    p.add_argument("--mindgr-users", type=int, default=256, help="MindGR users per decode batch (eval.batch_size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", help="keep the data and logs here (default: a temporary directory)")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    peer_py, peer_src = str(Path(args.peer_python).absolute()), Path(args.peer_src).resolve()
    tmp = Path(args.work or tempfile.mkdtemp(prefix="tiger-peer-")).resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    env = _env(args.threads)

    prep = prepare(tmp, args.codes, args.seed, args.decode_users)
    print(f"data: Beauty, {prep['users']} users, {prep['items']} items; {prep['codes_source']}; MindGR "
          f"{prep['mindgr_items_per_token']:.4f} target items per token", flush=True)
    _run([peer_py, str(ROOT / "benchmarks" / "peer" / "grid_side.py"), "write", str(tmp)], ROOT, env, tmp / "write.log")

    ckpt = None
    rounds = []
    jobs = ["peer_train", "mindgr_train", "peer_decode", "mindgr_decode"]
    for r in range(args.rounds):
        order = jobs[r % 4:] + jobs[:r % 4] if r else jobs   # rotated; round 0 trains the peer first (checkpoint)
        got, load = {}, []
        for job in order:
            load.append(os.getloadavg()[0])
            if job == "peer_train":
                run_dir, timer = tmp / f"peer-train-{r}", tmp / f"peer-train-{r}.json"
                shutil.rmtree(run_dir, ignore_errors=True)
                wall = _run(peer_train_cmd(peer_py, tmp, prep, run_dir, timer, args.train_steps), peer_src, env,
                            tmp / f"peer-train-{r}.log")
                got[job] = dict(read_timer(timer), wall_s=wall)
                if ckpt is None:        # (its name has '=' in it, which Hydra's override parser refuses)
                    ckpt = tmp / "peer.ckpt"
                    shutil.copy(sorted((run_dir / "checkpoints").glob("*.ckpt"))[-1], ckpt)
            elif job == "peer_decode":
                run_dir, timer = tmp / f"peer-decode-{r}", tmp / f"peer-decode-{r}.json"
                shutil.rmtree(run_dir, ignore_errors=True)
                wall = _run(peer_decode_cmd(peer_py, tmp, prep, run_dir, timer, ckpt, args.beam, args.decode_batch),
                            peer_src, env, tmp / f"peer-decode-{r}.log")
                got[job] = dict(read_timer(timer), wall_s=wall)
            elif job == "mindgr_train":
                got[job] = mindgr_train(args, prep, tmp, env, r)
            else:
                rec = mindgr_decode(args, tmp, env, r)
                got[job] = {"users_per_s": mindgr_decode_users_per_s(rec["raw"], args.beam), "wall_s": rec["wall_s"]}
        load.append(os.getloadavg()[0])
        got["load"] = [min(load), max(load)]
        got["ratio_train_items"] = got["mindgr_train"]["items_per_s"] / got["peer_train"]["items_per_s"]
        got["ratio_decode_users"] = got["mindgr_decode"]["users_per_s"] / got["peer_decode"]["users_per_s"]
        rounds.append(got)
        print(f"round {r + 1}: train items/s MindGR {got['mindgr_train']['items_per_s']:.0f} "
              f"(tokens/s {got['mindgr_train']['tokens_per_s']:.0f}) vs peer {got['peer_train']['items_per_s']:.1f} "
              f"(tokens/s {got['peer_train']['tokens_per_s']:.0f}) = {got['ratio_train_items']:.2f}x | decode users/s "
              f"MindGR {got['mindgr_decode']['users_per_s']:.1f} vs peer {got['peer_decode']['users_per_s']:.2f} = "
              f"{got['ratio_decode_users']:.2f}x | load {got['load'][0]:.1f}-{got['load'][1]:.1f}", flush=True)

    result = {
        "what": "MindGR vs snap-research/GRID TIGER on Amazon Beauty, alternated rounds",
        "cpu": _cpu_model(), "python": platform.python_version(), "threads_per_side": args.threads,
        "codes": prep["codes_source"], "beam": args.beam, "peer_decode_batch": args.decode_batch,
        "mindgr_decode_batch": args.mindgr_users,
        "peer_decode_users": args.decode_users, "peer_train_steps": args.train_steps,
        "mindgr_train_steps": args.mindgr_steps, "mindgr_items_per_token": prep["mindgr_items_per_token"],
        "peer_params": rounds[0]["peer_train"]["params"], "mindgr_params": prep["mindgr_params"], "peer_torch": rounds[0]["peer_train"]["torch"],
        "peer_commit": _git_head(peer_src), "mindgr_commit": _git_head(ROOT),
        "ratio_train_items": summary([g["ratio_train_items"] for g in rounds]),
        "ratio_decode_users": summary([g["ratio_decode_users"] for g in rounds]),
        "load": [min(g["load"][0] for g in rounds), max(g["load"][1] for g in rounds)],
        "rounds": rounds,
    }
    for key, name in (("ratio_train_items", "training target items/s"), ("ratio_decode_users", f"decode users/s, beam {args.beam}")):
        s = result[key]
        print(f"MindGR / peer, {name}: {s['median']:.2f}x [{s['min']:.2f}, {s['max']:.2f}] over {args.rounds} rounds")
    print(f"params: MindGR {result['mindgr_params']:,}, peer {result['peer_params']:,} (torch {result['peer_torch']}, GRID {result['peer_commit'][:7]}); "
          f"CPU {result['cpu']}; load {result['load'][0]:.1f}-{result['load'][1]:.1f}; {args.threads} thread(s) per side")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def _git_head(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
