"""`mindgr bench serve`: an open-loop HTTP load test of `mindgr serve` on loopback.

The server runs in its own process (`python -m mindgr serve`, a free 127.0.0.1 port); this process is
the load generator (httpx + asyncio). At each rate, requests are *scheduled* at Poisson arrival times
whether or not earlier ones have been answered (open loop: a slow server cannot slow the arrivals), and
a request's latency counts from its scheduled time, so client-side queueing is not hidden. Each rate is
bounded by --duration seconds and --max-requests requests; requests come from the run's test users
(their histories and timestamps, raw ids). Between rates, /metrics gives the batch sizes the batcher
formed and its compute time per batch shape.

Reported per rate: offered and achieved rate, p50 / p99 latency, 503s and other failures; then the
highest offered rate whose p99 stays within --p99-bound-ms with no failures. The load generator shares
the host with the server (and, on a shared host, with other jobs): the figures are a floor.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from mindgr.bench import write_result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run_dir, port: int, extra_args=(), timeout: float = 600.0, log_path=None, cwd=None):
    """A `mindgr serve` subprocess on 127.0.0.1:port, returned once /health says ok. Its output goes to
    log_path (default: a temporary file; proc.log_path names it), never to a pipe nobody reads."""
    run = ["--run", str(run_dir)] if run_dir is not None else []     # None: extra_args say what (--random-gr)
    proc = launch_server(port, [*run, *extra_args], cwd=cwd, log_path=log_path)
    wait_ready(proc, port, timeout)
    return proc


def server_log(proc) -> str:
    with open(proc.log_path) as f:
        return f.read()


def stop_server(proc, timeout: float = 60.0) -> int:
    """SIGTERM (uvicorn's graceful shutdown), then wait; kill only if it does not stop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def user_requests(run_dir, k: int, limit: int = 2000) -> list:
    """POST /recommend bodies from the run's test users (raw ids, the data's time unit)."""
    import yaml
    from mindgr.config import config_from_dict
    from mindgr.train.data import RunData
    with open(os.path.join(run_dir, "config.yaml")) as f:
        cfg = config_from_dict(yaml.safe_load(f))
    data = RunData(cfg)
    ev, raw = data.split.test, data.store.item_raw_ids
    bodies = []
    for u in range(min(limit, len(ev.targets))):
        body = {"history": [int(x) for x in raw[np.asarray(ev.histories[u])]], "k": k}
        if ev.history_times is not None:
            body["timestamps"] = [int(t) for t in ev.history_times[u]]
        bodies.append(body)
    return bodies


async def _one_rate(url: str, bodies: list, rate: float, duration: float, max_requests: int, seed: int,
                    timeout: float = 60.0):
    import httpx
    rng = np.random.default_rng(seed)
    n = max(1, min(max_requests, int(round(rate * duration))))
    starts = np.cumsum(rng.exponential(1.0 / rate, n))
    picks = rng.integers(0, len(bodies), n)
    latencies, statuses, server_ms, lags = [], [], [], []
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=2048)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as client:
        t0 = time.perf_counter()

        async def fire(i):
            delay = t0 + starts[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.perf_counter() - (t0 + starts[i]))  # a busy load generator sends late
            try:
                r = await client.post(url, json=bodies[picks[i]])
                status = r.status_code
                if status == 200:
                    server_ms.append(float(r.headers.get("x-server-ms", "nan")))
            except httpx.HTTPError:
                status = -1
            latencies.append(time.perf_counter() - (t0 + starts[i]))
            statuses.append(status)
            return time.perf_counter()

        ends = await asyncio.gather(*(fire(i) for i in range(n)))
        wall = max(ends) - t0
    lat, st = np.array(latencies), np.array(statuses)
    ok = lat[st == 200]
    return {
        "offered_rps": rate, "requests": n, "ok": int((st == 200).sum()), "status_503": int((st == 503).sum()),
        "failed": int(((st != 200) & (st != 503)).sum()),
        "achieved_rps": float((st == 200).sum() / wall) if wall > 0 else None,
        "p50_ms": float(np.percentile(ok, 50) * 1e3) if len(ok) else None,
        "p99_ms": float(np.percentile(ok, 99) * 1e3) if len(ok) else None,
        # the part spent inside the server process (queue wait + compute + response), from x-server-ms
        "server_p50_ms": float(np.percentile(server_ms, 50)) if server_ms else None,
        "server_p99_ms": float(np.percentile(server_ms, 99)) if server_ms else None,
        "send_lag_p99_ms": float(np.percentile(lags, 99) * 1e3),
        "wall_s": wall,
    }


def _batch_delta(before: dict, after: dict) -> dict:
    b, a = before["batches"], after["batches"]
    sizes = {s: a["size_histogram"].get(s, 0) - b["size_histogram"].get(s, 0) for s in a["size_histogram"]}
    sizes = {s: v for s, v in sizes.items() if v}
    batches = sum(sizes.values())
    return {"batches": batches, "mean_batch_size": (sum(int(s) * v for s, v in sizes.items()) / batches
                                                     if batches else None),
            "size_histogram": sizes}


def bench_serve(run_dir, rates=(25, 50, 100, 200, 400), duration: float = 8.0, max_requests: int = 2000,
                p99_bound_ms: float = 100.0, k: int = 10, shapes: str = "1,4,16,64", threads=None,
                index: str = "exact", out=None) -> dict:
    import httpx
    from mindgr.config import ConfigError
    if duration <= 0 or max_requests < 1 or not rates or min(rates) <= 0:
        raise ConfigError("bench serve: --rates must be positive, --duration > 0, --max-requests >= 1")
    bodies = user_requests(run_dir, k)
    port = free_port()
    args = ["--batch-shapes", shapes, "--index", index] + (["--threads", threads] if threads else [])
    t_start = time.perf_counter()
    proc = start_server(run_dir, port, args)
    startup_s = time.perf_counter() - t_start
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        health = httpx.get(f"{base}/health").json()
        asyncio.run(_one_rate(f"{base}/recommend", bodies, 20.0, 1.0, 20, seed=99))  # warm connections
        for i, rate in enumerate(rates):
            before = httpx.get(f"{base}/metrics").json()
            row = asyncio.run(_one_rate(f"{base}/recommend", bodies, rate, duration, max_requests, seed=i))
            after = httpx.get(f"{base}/metrics").json()
            row.update(_batch_delta(before, after))
            rows.append(row)
            print(_format_row(row), flush=True)
            if row["p99_ms"] is None or row["p99_ms"] > 10 * p99_bound_ms:
                break  # far past saturation: higher rates only queue more
        final = httpx.get(f"{base}/metrics").json()
    finally:
        code = stop_server(proc)
    within = [r for r in rows if r["p99_ms"] is not None and r["p99_ms"] <= p99_bound_ms
              and r["failed"] == 0 and r["status_503"] == 0]
    best = max(within, key=lambda r: r["offered_rps"]) if within else None
    result = {"run": str(run_dir), "server": health, "startup_s": startup_s, "p99_bound_ms": p99_bound_ms,
              "duration_s": duration, "max_requests": max_requests, "k": k, "rates": rows,
              "best_within_bound": best, "compute_ms_per_batch": final["batches"]["compute_ms_per_batch"],
              "batch_shape_histogram": final["batches"]["shape_histogram"], "server_exit_code": code,
              "host": {"cpus": os.cpu_count(), "note": "load generator and server share this host"}}
    print(f"batch compute (encode + top-k) ms per batch, by compiled rows: "
          f"{ {s: round(v, 2) for s, v in result['compute_ms_per_batch'].items()} }")
    if best:
        print(f"highest offered rate with p99 <= {p99_bound_ms:g} ms and no failures: {best['offered_rps']:g} req/s "
              f"(achieved {best['achieved_rps']:.1f}, p50 {best['p50_ms']:.1f} ms, p99 {best['p99_ms']:.1f} ms)")
    else:
        print(f"no rate kept p99 <= {p99_bound_ms:g} ms without failures")
    write_result(result, out)
    return result


def _format_row(r: dict) -> str:
    p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}"
    p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}"
    ach = "-" if r["achieved_rps"] is None else f"{r['achieved_rps']:.1f}"
    mean_b = "-" if r["mean_batch_size"] is None else f"{r['mean_batch_size']:.2f}"
    srv = "-" if r["server_p50_ms"] is None else f"{r['server_p50_ms']:.1f}/{r['server_p99_ms']:.1f}"
    return (f"offered {r['offered_rps']:7.1f} req/s  achieved {ach:>7} req/s  p50 {p50:>8} ms  p99 {p99:>8} ms  "
            f"in server p50/p99 {srv:>13} ms  send lag p99 {r['send_lag_p99_ms']:7.1f} ms  ok {r['ok']:5d}  503 {r['status_503']:4d}  failed {r['failed']:3d}  mean batch {mean_b:>5}  "
            f"batches {json.dumps(r['size_histogram'])}")


def bench_index_recall(run_dir, k: int = 10, nprobes=(1, 2, 4, 8, 16), users: int = 2000, threads=None,
                       out=None) -> dict:
    """recall@k of the faiss IVF index against exact top-k on the run's test users (history excluded),
    and the search time per batch of 64 users of each (measured alternately, best of 3 rounds)."""
    from mindgr.serve.index import ExactIndex, FaissIVFIndex, recall_at_k
    from mindgr.train.trainer import load_run
    from mindgr.serve.retrieval import Recommender
    run = load_run(run_dir, threads=threads)
    rec = Recommender.from_run(run, shapes=(64,))
    raw = rec.catalogue.raw
    ev = run.data.split.test
    n = min(users, len(ev.targets))
    times = ev.history_times if ev.history_times is not None else [None] * n
    queries = [rec.parse(raw[np.asarray(ev.histories[u])].tolist(),
                         None if times[u] is None else np.asarray(times[u]).tolist(), k=k) for u in range(n)]
    vecs = np.concatenate([rec.encode(queries[s:s + 64], 64) for s in range(0, n, 64)])
    excl = [q.items for q in queries]
    table = run.model.item_table()
    exact = ExactIndex(table)
    want = exact.top_k(vecs, [k] * n, excl)
    indexes = {"exact": exact}
    for p in nprobes:
        indexes[f"faiss-ivf nprobe {p}"] = FaissIVFIndex(table, nprobe=p)
    timing = {name: [] for name in indexes}
    for _ in range(3):  # alternate the indexes, so machine noise hits them alike
        for name, idx in indexes.items():
            t0 = time.perf_counter()
            for s in range(0, n, 64):
                idx.top_k(vecs[s:s + 64], [k] * len(vecs[s:s + 64]), excl[s:s + 64])
            timing[name].append((time.perf_counter() - t0) / ((n + 63) // 64))
    rows = []
    for name, idx in indexes.items():
        got = idx.top_k(vecs, [k] * n, excl)
        rows.append({"index": name, "recall_at_k": recall_at_k(got, want), "ms_per_64_users": min(timing[name]) * 1e3,
                     "nlist": getattr(idx, "nlist", None)})
        print(f"{name:22s} recall@{k} {rows[-1]['recall_at_k']:.4f}  {rows[-1]['ms_per_64_users']:.3f} ms per 64 users")
    same = _ranks_equal_eval(run, exact, vecs, ev, n)
    print(f"exact top-k vs mindgr eval: the target's served rank equals eval's for {same} of {n} test users")
    result = {"run": str(run_dir), "k": k, "users": n, "items": rec.catalogue.num_items, "indexes": rows,
              "eval_rank_equal_users": same}
    write_result(result, out)
    return result


def _ranks_equal_eval(run, exact, vecs, ev, n: int) -> int:
    """How many of the first n test users get, from the served full ranking (history items other than
    the target removed, as eval removes them), the target rank that mindgr.train.evaluate computes (its
    count of items scored above the target; with t items tied with it, eval's rank is tie-aware and any
    place among the t + 1 equal scores counts as equal)."""
    from mindgr.train.evaluate import evaluate
    _, ranks, ties = evaluate(run.model.encode_last, run.model.item_table(), run.data.eval["test"], ev, [10],
                              per_user=True)
    full = exact.top_k(vecs, [exact.table.shape[0] - 1] * n, [None] * n)
    same = 0
    for u, (ids, _) in enumerate(full):
        target, hist = ev.targets[u], set(np.asarray(ev.histories[u]).tolist())
        ranking = [i for i in ids.tolist() if i == target or i not in hist]
        same += int(ranks[u] <= ranking.index(target) <= ranks[u] + ties[u])
    print(f"({int((np.asarray(ties[:n]) > 0).sum())} of the {n} targets tie with other items' scores)")
    return same


# ---- generative (GR) serving: engine vs naive baseline over HTTP -------------------------------------------

def gr_requests(num_items: int, history_items: int, count: int = 256, k: int = 10, seed: int = 7) -> list:
    """POST /recommend bodies for a random GR model (raw ids RAW_ID_BASE + 1..V): full-length histories."""
    from mindgr.bench.fixtures import RAW_ID_BASE
    rng = np.random.default_rng(seed)
    return [{"history": [int(RAW_ID_BASE + i) for i in rng.integers(1, num_items + 1, history_items)], "k": k,
             "exclude_history": False} for _ in range(count)]


async def _closed_loop(url: str, bodies: list, n: int, enough_s: float = float("inf")) -> list:
    """n requests one after another (fewer if the first took over enough_s): the unloaded latency (s) of each."""
    import httpx
    out = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(7200.0)) as client:
        for i in range(n):
            if out and out[0] > enough_s:
                break
            t0 = time.perf_counter()
            r = await client.post(url, json=bodies[i % len(bodies)])
            if r.status_code != 200:
                raise RuntimeError(f"probe request: HTTP {r.status_code}: {r.text[:200]}")
            out.append(time.perf_counter() - t0)
    return out


def _shape_ms(before: dict, after: dict) -> dict:
    """Mean compute ms per batch, by compiled shape, of the batches run between two /metrics snapshots."""
    b, a = before["batches"], after["batches"]
    out = {}
    for shape, count in a["shape_histogram"].items():
        n = count - b["shape_histogram"].get(shape, 0)
        if n > 0:
            total = a["compute_ms_per_batch"][shape] * count - b["compute_ms_per_batch"].get(shape, 0.0) * (count - n)
            out[int(shape)] = total / n
    return out


def capacity_bound(shape_ms: dict) -> tuple:
    """(requests/s, shape): max over user-batch shapes b of b / t_b. With one batcher worker a server runs
    one batch at a time and a batch of shape b answers at most b requests in at least t_b of compute, so no
    arrival rate above this can be sustained: an upper bound on its throughput within any latency bound."""
    return max(((b * 1e3 / t, b) for b, t in shape_ms.items()), default=(None, None))


async def _burst(url: str, bodies: list, b: int, lead_s: float):
    """One request, then, while it computes (after lead_s), b requests at once: they queue behind the first
    and the batcher (max_rows >= b) takes them as one full batch of b users."""
    import httpx
    async with httpx.AsyncClient(timeout=httpx.Timeout(7200.0)) as client:
        async def post(i):
            r = await client.post(url, json=bodies[i % len(bodies)])
            if r.status_code != 200:
                raise RuntimeError(f"capacity burst: HTTP {r.status_code}: {r.text[:200]}")
        first = asyncio.create_task(post(0))
        await asyncio.sleep(lead_s)
        await asyncio.gather(first, *(post(1 + j) for j in range(b)))


def measure_capacity(url: str, bodies: list, shapes, probe_ms: float, budget_s: float = 90.0) -> dict:
    """Unloaded service time t_b of each user-batch shape b (the batcher's own compute time per batch from
    /metrics, around bursts of 1 + b requests: each burst gives one 1-user batch and one full b-user batch),
    the fastest of 3 bursts per shape (or of 1 if 3 would not fit budget_s: the most generous capacity, so
    a ratio bounded by it stays conservative when the shared host is noisy); the capacity max_b b / t_b."""
    import httpx
    base = url.rsplit("/", 1)[0]
    big = [b for b in shapes if b > 1] or [1]
    reps = 3 if 3 * sum(1 + b for b in big) * probe_ms / 1e3 <= budget_s else 1
    samples = {}
    for _ in range(reps):
        for b in big:
            before = httpx.get(f"{base}/metrics").json()
            asyncio.run(_burst(url, bodies, b, lead_s=max(0.005, 0.2 * probe_ms / 1e3)))
            after = httpx.get(f"{base}/metrics").json()
            for shape, ms in _shape_ms(before, after).items():
                samples.setdefault(shape, []).append(ms)
    t_ms = {b: float(min(v)) for b, v in sorted(samples.items())}
    rps, at = capacity_bound(t_ms)
    return {"t_ms": t_ms, "samples_ms": samples, "bursts_per_shape": reps, "rps": rps, "at_shape": at}


def side_parts(side: str, backbone: str):
    """(backbone, --decode mode) of a side: "BACKBONE:DECODE" (e.g. "linear:engine"), a --decode mode alone
    (the grid's backbone), or an overlap side (the engine)."""
    from mindgr.serve.generative import DECODES
    if ":" in side:
        b, d = side.split(":", 1)
        return b, d
    return backbone, side if side in DECODES else "engine"


def _ok(row, bound_ms):
    return row["p99_ms"] is not None and row["p99_ms"] <= bound_ms and row["failed"] == 0 and row["status_503"] == 0


def bench_serve_gr(beams=(16, 64, 256), prompts=(50, 200, 1000), items: int = 12101, dim: int = 128,
                   blocks: int = 4, heads: int = 2, k: int = 10, multiples=(0.25, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12),
                   duration: float = 6.0, max_requests: int = 400, min_requests: int = 6,
                   bound_factor: float = 5.0, p99_bound_ms: float | None = None, cell_budget_s: float = 240.0,
                   shapes: str = "1,2,4", big_shapes: str = "1,2", threads=None, overlap: str = "off",
                   sides=("engine", "naive"), memory_fraction: float = 0.6, out=None,
                   backbone: str = "hstu") -> dict:
    """Per (prompt, beam) cell: one server per side (`--decode engine` / `--decode naive`, or overlap on /
    off when sides = ("overlap-on", "overlap-off"), or two of mindgr serve's --decode choices, e.g. ("engine",
    "per_beam"): OneLA vs the per-beam recurrent state with backbone "linear"; or two backbones, each side
    "BACKBONE:DECODE", e.g. ("linear:engine", "hstu:engine"): the same shape and prompts, each decoder with its
    own engine), both up at once on the same random-weight model (of each side's backbone);
    an unloaded probe (sequential requests) of each; then open-loop rates at multiples of each side's
    1 / probe latency, the two sides alternating rate by rate in one window (host noise hits both alike).
    The p99 bound of a cell is p99_bound_ms if given, else bound_factor x the slower side's probe p50
    (so the slower side can meet it at low load); a side's throughput is the highest achieved rate with
    p99 within the bound and no 503 / failure. A side stops climbing once a rate misses the bound, or
    when the cell's time budget is spent (a side too slow for its first rate is not load-tested); every
    rate measured is recorded. Each side's capacity (measure_capacity: max over shapes b of b / t_b, the
    unloaded compute time of a full b-user batch) bounds its throughput from above, so the first side's
    throughput within the bound / the second side's capacity is a firm lower bound on their ratio.
    Each server is killed once its resident memory exceeds memory_fraction x the host's available memory
    at the cell's start; that cell records which side and how much, and the grid goes on."""
    import httpx
    from mindgr.config import ConfigError
    if duration <= 0 or max_requests < 1 or min_requests < 1 or not multiples or min(multiples) <= 0:
        raise ConfigError("bench serve --gr: --duration > 0, --max-requests >= 1 and positive rate multiples")
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stopped: still stop the servers (finally)
    cells = []
    for prompt in prompts:
        for beam in beams:
            cell_shapes = big_shapes if beam * prompt >= 256 * 1000 else shapes
            spec = f"items={items},prompt={prompt},dim={dim},blocks={blocks},heads={heads},seed=0,backbone={backbone}"
            servers, ports = {}, {}
            load_before = os.getloadavg()
            avail = available_bytes()
            budget = int(memory_fraction * avail) if avail else None
            print(f"== prompt {prompt} beam {beam}: load average before {load_before}", flush=True)
            t_start = time.perf_counter()
            try:
                for side in sides:                    # start both, then wait for both (compiles overlap)
                    side_backbone, decode = side_parts(side, backbone)
                    ov = {"overlap-on": "on", "overlap-off": "off"}.get(side, overlap)
                    ports[side] = free_port()
                    side_spec = spec.replace(f"backbone={backbone}", f"backbone={side_backbone}")
                    args = ["--random-gr", side_spec, "--beam", beam, "--decode", decode, "--overlap", ov,
                            "--batch-shapes", cell_shapes, "--queue-size", 64, "--max-wait-ms", 2] + \
                        (["--threads", threads] if threads else [])
                    servers[side] = launch_server(ports[side], args, memory_budget=budget)
                for side in sides:
                    wait_ready(servers[side], ports[side])
                startup = time.perf_counter() - t_start
                urls = {s: f"http://127.0.0.1:{ports[s]}" for s in sides}
                health = httpx.get(f"{urls[sides[0]]}/health").json()
                bodies = gr_requests(items, health["prompt_items"], k=min(k, beam))
                # 3 sequential requests, the first dropped (the servers compiled and ran each shape at start-up);
                # a side whose first one took over 30 s keeps that one only (minutes a request at 1000 x 256)
                probe = {s: asyncio.run(_closed_loop(f"{urls[s]}/recommend", bodies, 3, enough_s=30.0)) for s in sides}
                probe = {s: v[1:] or v for s, v in probe.items()}
                probe_ms = {s: float(np.median(v)) * 1e3 for s, v in probe.items()}
                bound = p99_bound_ms or bound_factor * max(probe_ms.values())
                shape_list = [int(x) for x in cell_shapes.split(",")]
                cap = {s: measure_capacity(f"{urls[s]}/recommend", bodies, shape_list, probe_ms[s]) for s in sides}
                for s in sides:
                    print(f"prompt {prompt:5d} beam {beam:4d} {s:11s} unloaded ms per batch by users "
                          f"{ {b: round(t, 1) for b, t in cap[s]['t_ms'].items()} } ({cap[s]['bursts_per_shape']} "
                          f"burst(s) a shape): capacity {cap[s]['rps']:.3f} req/s at {cap[s]['at_shape']} users",
                          flush=True)
                rows = {s: [] for s in sides}
                climbing = {s: True for s in sides}
                skipped = {s: [] for s in sides}
                t_cell = time.perf_counter()
                # a side too slow for even the first rate within the budget is not load-tested: its
                # capacity (above) bounds its throughput
                slow = {s: (min_requests / multiples[0] + 2) * probe_ms[s] / 1e3 > cell_budget_s for s in sides}
                for i, mult in enumerate(multiples):
                    for side in sides:
                        if slow[side] or not climbing[side] or time.perf_counter() - t_cell > cell_budget_s:
                            climbing[side] = False
                            continue
                        rate = mult * 1e3 / probe_ms[side]
                        n = max(min_requests, min(max_requests, int(round(rate * duration))))
                        need = n / rate + 2 * probe_ms[side] / 1e3       # arrivals + the last answers
                        if time.perf_counter() - t_cell + need > cell_budget_s:
                            climbing[side] = False                        # would overrun the cell's budget
                            skipped[side].append(mult)
                            continue
                        before = httpx.get(f"{urls[side]}/metrics").json()
                        row = asyncio.run(_one_rate(f"{urls[side]}/recommend", bodies, rate, n / rate, n, seed=i,
                                                    timeout=max(60.0, 3 * bound / 1e3)))
                        after = httpx.get(f"{urls[side]}/metrics").json()
                        row.update(_batch_delta(before, after), multiple=mult, decode_ms_per_batch=_decode_delta(before, after))
                        rows[side].append(row)
                        print(f"prompt {prompt:5d} beam {beam:4d} {side:11s} x{mult:<4g} " + _format_row(row), flush=True)
                        if not _ok(row, bound):
                            climbing[side] = False
                final = {s: httpx.get(f"{urls[s]}/metrics").json() for s in sides}
            except Exception:
                over = {s: p.memory_exceeded for s, p in servers.items() if getattr(p, "memory_exceeded", None)}
                if not over:
                    raise
                error = "; ".join(f"{s} server killed at {rss / 1e9:.1f} GB resident" for s, rss in over.items()) + \
                    f" (budget {budget / 1e9:.1f} GB = {memory_fraction} x the {avail / 1e9:.1f} GB available)"
                print(f"== prompt {prompt} beam {beam}: {error}", flush=True)
                cells.append({"prompt_tokens": prompt, "beam": beam, "error": error, "loadavg_before": load_before})
                write_result({"partial": True, "cells": cells}, out)
                continue
            finally:
                codes = {s: stop_server(p) for s, p in servers.items()}
            best = {}
            for s in sides:
                within = [r for r in rows[s] if _ok(r, bound)]
                # a rate's throughput: the achieved rate, but never above the offered one (with a handful of
                # requests the realised arrivals can run ahead of the offered rate by chance)
                best[s] = max((min(r["achieved_rps"], r["offered_rps"]) for r in within), default=None)
            a, b = sides
            ratio = best[a] / best[b] if best[a] and best[b] else None
            # firm: b's throughput within the bound <= its capacity, so a's measured throughput / b's capacity
            # is a lower bound on the ratio, whether or not b's ladder ran
            ratio_lb = best[a] / cap[b]["rps"] if best[a] and cap[b]["rps"] else None
            cell = {"prompt_tokens": prompt, "beam": beam, "batch_shapes": cell_shapes, "startup_s": round(startup, 1),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "probe_ms": probe_ms, "p99_bound_ms": bound, "rates": rows, "throughput_within_bound": best,
                    "ratio": ratio, "capacity": cap, "ratio_lower_bound": ratio_lb,
                    "capacity_ratio": (cap[a]["rps"] / cap[b]["rps"] if cap[a]["rps"] and cap[b]["rps"] else None),
                    "skipped_multiples": skipped, "ladder_skipped_too_slow": slow,
                    "unloaded_latency_ratio": probe_ms[b] / probe_ms[a], "decode_ms_per_batch": {s: final[s].get("decode", {}) for s in sides},
                    "server_exit_codes": codes}
            cells.append(cell)
            write_result({"partial": True, "cells": cells}, out)      # what ran so far, if stopped early
            rtxt = "-" if ratio is None else f"{ratio:.2f}x"
            lbtxt = "-" if ratio_lb is None else f">= {ratio_lb:.2f}x"
            print(f"== prompt {prompt} beam {beam}: unloaded latency {b}/{a} {probe_ms[b] / probe_ms[a]:.2f}x, probe ms {json.dumps({s: round(v, 1) for s, v in probe_ms.items()})}, "
                  f"p99 bound {bound:.0f} ms, req/s within it {json.dumps(best)}, {a}/{b} {rtxt} (ladders); "
                  f"{a} within bound / {b} capacity {lbtxt}; load average after {cell['loadavg_after']}", flush=True)
    result = {"model": {"items": items, "dim": dim, "blocks": blocks, "heads": heads,
                        "levels": "256 x 256 x 256 + de-dup 32", "weights": "random",
                        "backbone": {s: side_parts(s, backbone)[0] for s in sides}},
              "sides": list(sides), "k": k, "multiples": list(multiples), "duration_s": duration,
              "max_requests": max_requests, "min_requests": min_requests, "bound_factor": bound_factor,
              "cells": cells, "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                                       "note": "load generator and both servers share this host"}}
    write_result(result, out)
    return result


def _decode_delta(before: dict, after: dict) -> dict:
    b, a = before.get("decode"), after.get("decode")
    if not a:
        return {}
    nb = a["batches"] - (b["batches"] if b else 0)
    if nb <= 0:
        return {}
    return {key: (a["ms_per_batch"][key] * a["batches"] - (b["ms_per_batch"].get(key, 0.0) * b["batches"] if b else 0.0)) / nb
            for key in a["ms_per_batch"]}


def launch_server(port: int, args, cwd=None, log_path=None, memory_budget: int | None = None):
    """A `mindgr serve` subprocess (not waited for: start several, then wait_ready each, so their compiles
    overlap). memory_budget (bytes): the server is killed once its resident memory exceeds it (see
    guard_memory), rather than letting the kernel's OOM killer pick a victim among the host's jobs."""
    cmd = [sys.executable, "-m", "mindgr", "serve", "--host", "127.0.0.1", "--port", str(port), *[str(a) for a in args]]
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="mindgr-serve-", suffix=".log")
        os.close(fd)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    proc.log_path = log_path
    if memory_budget:
        guard_memory(proc, memory_budget)
    return proc


def _proc_bytes(path: str, key: str) -> int | None:
    """A `key: N kB` line of a /proc file, in bytes (None: no such file, e.g. the process is gone)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def resident_bytes(pid: int) -> int | None:
    """VmRSS of a process (None: gone, or no /proc on this system)."""
    return _proc_bytes(f"/proc/{pid}/status", "VmRSS")


def guard_memory(proc, budget: int, every_s: float = 0.2):
    """Kill `proc` (SIGKILL) if its resident memory exceeds `budget` bytes; proc.memory_exceeded is then the
    resident size seen (else None). A daemon thread polls until the process ends."""
    import threading
    proc.memory_exceeded = None

    def watch():
        while proc.poll() is None:
            rss = resident_bytes(proc.pid)
            if rss is not None and rss > budget:
                proc.memory_exceeded = rss
                proc.kill()
                return
            time.sleep(every_s)
    threading.Thread(target=watch, daemon=True, name=f"memory-guard-{proc.pid}").start()


def available_bytes() -> int | None:
    """MemAvailable of the host (None without /proc)."""
    return _proc_bytes("/proc/meminfo", "MemAvailable")


def wait_ready(proc, port: int, timeout: float = 900.0):
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mindgr serve exited with {proc.returncode}: {server_log(proc)[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"mindgr serve: not ready after {timeout:.0f} s")


# ---- `mindgr bench serve`: its arguments and its run --------------------------------------------------

def add_arguments(parser):
    parser.add_argument("--run", help="run directory to serve")
    parser.add_argument("--rates", default="25,50,100,200,400", help="open-loop arrival rates (requests/s)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate")
    parser.add_argument("--max-requests", type=int, default=2000, help="at most this many requests per rate")
    parser.add_argument("--p99-bound-ms", type=float, default=100.0, help="the p99 latency bound")
    parser.add_argument("--k", type=int, default=10, help="items per request")
    parser.add_argument("--batch-shapes", default="1,4,16,64", help="the server's batch shapes")
    parser.add_argument("--threads", type=int, help="the server's MindSpore threads")
    parser.add_argument("--index", default="exact", choices=["exact", "faiss-ivf"], help="the server's index")
    parser.add_argument("--index-recall", action="store_true",
                        help="instead of the load test, recall@k of faiss-ivf vs exact on the test users")
    gr = parser.add_argument_group("--gr: a random-weight GR model of Beauty's shape, the decoding engine vs "
                                   "the naive baseline side by side (no --run)")
    gr.add_argument("--gr", action="store_true", help="run this grid instead of the load test of a run")
    gr.add_argument("--beams", default="16,64,256", help="beam widths")
    gr.add_argument("--prompts", default="50,200,1000", help="prompt lengths (tokens)")
    gr.add_argument("--items", type=int, default=12101, help="catalogue size")
    gr.add_argument("--dim", type=int, default=128, help="decoder width")
    gr.add_argument("--blocks", type=int, default=4, help="decoder blocks")
    gr.add_argument("--min-requests", type=int, default=6, help="at least this many requests per rate")
    gr.add_argument("--bound-factor", type=float, default=5.0,
                    help="p99 bound = this x the slower side's unloaded p50 (unless --gr-p99-bound-ms)")
    gr.add_argument("--gr-p99-bound-ms", type=float, help="one fixed p99 bound for every cell")
    gr.add_argument("--cell-budget", type=float, default=240.0, help="seconds of load per cell")
    gr.add_argument("--rate-multiples", default="0.25,0.5,1,1.5,2,3,4,6,8,12",
                    help="rates as multiples of each side's 1 / unloaded latency")
    gr.add_argument("--gr-batch-shapes", default="1,2,4", help="user-batch shapes of both servers")
    gr.add_argument("--gr-big-batch-shapes", default="1,2", help="shapes where beam x prompt >= 256 x 1000")
    gr.add_argument("--memory-fraction", type=float, default=0.6,
                    help="kill a server whose resident memory exceeds this fraction of the host's available "
                         "memory (that cell records it; the grid goes on)")
    gr.add_argument("--overlap-ab", action="store_true",
                    help="engine with overlap on vs off, instead of engine vs naive")
    gr.add_argument("--gr-backbone", default="hstu", choices=["hstu", "linear"], help="the decoder's blocks")
    gr.add_argument("--gr-sides", default="engine,naive",
                    help="the two --decode modes compared (engine, per_beam, replay, naive), e.g. engine,per_beam; "
                         "a side BACKBONE:DECODE has its own backbone, e.g. linear:engine,hstu:engine")
    parser.add_argument("--out", help="also write the figures as JSON to this path")


def _sides(text: str) -> tuple:
    from mindgr.config import ConfigError
    from mindgr.serve.generative import DECODES
    from mindgr.models.generative import BACKBONES
    sides = tuple(x.strip() for x in text.split(",") if x.strip())
    ok = all(s in DECODES or (":" in s and s.split(":", 1)[0] in BACKBONES and s.split(":", 1)[1] in DECODES)
             for s in sides)
    if len(sides) != 2 or len(set(sides)) != 2 or not ok:
        raise ConfigError(f"bench serve --gr-sides {text!r}: two different of {', '.join(DECODES)}, each "
                          f"optionally BACKBONE:DECODE with BACKBONE one of {', '.join(BACKBONES)}")
    return sides


def run(args) -> int:
    if args.gr:
        ints = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
        bench_serve_gr(beams=ints(args.beams), prompts=ints(args.prompts), items=args.items, dim=args.dim,
                       blocks=args.blocks, k=args.k, duration=args.duration, max_requests=args.max_requests,
                       min_requests=args.min_requests, bound_factor=args.bound_factor,
                       p99_bound_ms=args.gr_p99_bound_ms, cell_budget_s=args.cell_budget,
                       shapes=args.gr_batch_shapes, big_shapes=args.gr_big_batch_shapes, threads=args.threads,
                       sides=("overlap-on", "overlap-off") if args.overlap_ab else _sides(args.gr_sides),
                       backbone=args.gr_backbone,
                       multiples=[float(x) for x in args.rate_multiples.split(",")],
                       memory_fraction=args.memory_fraction, out=args.out)
        return 0
    if not args.run:
        raise ValueError("bench serve: --run RUN is required")
    if args.index_recall:
        bench_index_recall(args.run, k=args.k, threads=args.threads, out=args.out)
        return 0
    bench_serve(args.run, rates=[float(r) for r in args.rates.split(",")], duration=args.duration,
                max_requests=args.max_requests, p99_bound_ms=args.p99_bound_ms, k=args.k,
                shapes=args.batch_shapes, threads=args.threads, index=args.index, out=args.out)
    return 0
