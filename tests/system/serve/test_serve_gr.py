"""Serving a generative model over real HTTP: a small random-weight GR decoder behind `mindgr serve
--random-gr` (two servers on free 127.0.0.1 ports, always stopped at the end): the engine with overlap on
(two batcher workers, one model thread), and the naive baseline with a tiny queue and a test-only delay
per batch (for overload and drain). Lists are checked against direct engine calls in this process
(items equal; scores within 1e-5, the two processes may differ in the last float bits only through
thread scheduling of the kernels) and between the engine and the naive baseline.
"""
import asyncio

import httpx
import numpy as np
import pytest

from conftest import REPO
from mindgr.bench.serve import free_port, launch_server, server_log, stop_server, wait_ready

# slow: two real servers (~35 s on a quiet host, 90 s at load average 13)
pytestmark = [pytest.mark.slow, pytest.mark.graph_mode("auto")]

SPEC = "items=300,prompt=40,dim=16,blocks=2,heads=2,seed=0,levels=8x8x8x4"
BEAM = 8
RAW = 1000                                   # raw id of item i is 1000 + i (mindgr.bench.fixtures)


@pytest.fixture(scope="module")
def servers():
    procs = {}
    try:
        for name, args in (("engine", ["--decode", "engine", "--overlap", "on", "--batch-shapes", "1,2"]),
                           ("naive", ["--decode", "naive", "--batch-shapes", "1,2", "--queue-size", 2,
                                      "--max-wait-ms", 0, "--test-batch-delay-ms", 250])):
            port = free_port()
            procs[name] = launch_server(port, ["--random-gr", SPEC, "--beam", BEAM, "--threads", 1, *args], cwd=REPO)
            procs[name].url = f"http://127.0.0.1:{port}"
        for proc in procs.values():
            wait_ready(proc, int(proc.url.rsplit(":", 1)[1]), timeout=300)
        yield procs
    finally:
        for proc in procs.values():
            stop_server(proc)


def bodies(n, seed=0, k=5, exclude=False):
    rng = np.random.default_rng(seed)
    return [{"history": [int(RAW + i) for i in rng.integers(1, 301, int(rng.integers(1, 14)))], "k": k,
             "exclude_history": exclude} for _ in range(n)]


def post_all(url, reqs):
    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*(c.post(f"{url}/recommend", json=b) for b in reqs))
    return asyncio.run(go())


def test_gr_recommend_good_and_bad_requests(servers):
    url = servers["engine"].url
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["model"] == "generative" and health["beam"] == BEAM
    assert health["workers"] == 2 and health["batch_shapes"] == [1, 2]
    hist = [RAW + 3, RAW + 7, RAW + 11]
    r = httpx.post(f"{url}/recommend", json={"history": hist, "k": 5})
    assert r.status_code == 200, r.text
    got = r.json()
    assert len(got["items"]) == 5 == len(set(got["items"])) and not set(got["items"]) & set(hist)
    assert all(RAW < i <= RAW + 300 for i in got["items"])
    assert got["scores"] == sorted(got["scores"], reverse=True)
    bad = [({"history": [RAW + 1, 5], "k": 3}, 422, "history[1]: unknown item id 5"),
           ({"history": [], "k": 3}, 422, "history: empty"),
           ({"history": [RAW + 1] * 4097}, 422, "more than the limit 4096"),
           ({"history": [RAW + 1], "k": 0}, 422, "k: 0"),
           ({"history": [RAW + 1], "k": BEAM + 1}, 422, f"more than the beam width {BEAM}"),
           ({"history": [RAW + 1], "k": "5"}, 422, "k:"),
           ({"history": [RAW + 1], "beam": 4}, 422, "beam")]
    for body, status, words in bad:
        r = httpx.post(f"{url}/recommend", json=body)
        assert r.status_code == status and words in r.json()["error"], (body, r.status_code, r.text)
        assert "\n" not in r.json()["error"]
    r = httpx.post(f"{url}/recommend", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]


def test_gr_concurrent_requests_equal_direct_engine_calls(servers):
    from mindgr.bench import fixtures as fx
    from mindgr.serve import generative as gr
    reqs = bodies(10, seed=1)
    answers = post_all(servers["engine"].url, reqs)
    assert [a.status_code for a in answers] == [200] * len(reqs)
    rec = gr.GenerativeRecommender(fx.random_bundle(**fx.parse_random_spec(SPEC)), BEAM, "engine", (1, 2))
    for body, a in zip(reqs, answers):
        q = rec.parse(body["history"], k=body["k"], exclude_history=False)
        want = rec.to_response(*rec.recommend([q], 1)[0])
        assert a.json()["items"] == want["items"]
        np.testing.assert_allclose(a.json()["scores"], want["scores"], rtol=1e-5, atol=1e-5)
    m = httpx.get(f"{servers['engine'].url}/metrics").json()
    assert m["requests"]["by_status"]["200"] >= len(reqs)
    assert set(m["decode"]["ms_per_batch"]) >= {"prefill", "model", "masks", "select", "total"}
    assert sum(int(s) * n for s, n in m["batches"]["size_histogram"].items()) >= len(reqs)


def test_gr_engine_equals_naive_baseline_over_http(servers):
    reqs = bodies(4, seed=2, k=BEAM)
    for body in reqs:
        e = httpx.post(f"{servers['engine'].url}/recommend", json=body, timeout=60)
        n = httpx.post(f"{servers['naive'].url}/recommend", json=body, timeout=60)
        assert e.status_code == n.status_code == 200
        assert e.json()["items"] == n.json()["items"]
        np.testing.assert_allclose(e.json()["scores"], n.json()["scores"], rtol=1e-5, atol=2e-5)


def test_gr_overload_gets_503_and_recovers(servers):
    url = servers["naive"].url
    answers = post_all(url, bodies(8, seed=3))
    codes = sorted(a.status_code for a in answers)
    assert set(codes) == {200, 503} and codes.count(503) >= 3, codes
    assert all("queue full" in a.json()["error"] for a in answers if a.status_code == 503)
    assert httpx.post(f"{url}/recommend", json=bodies(1)[0], timeout=60).status_code == 200


def test_gr_shutdown_drains_in_flight_requests(servers):
    proc = servers["naive"]

    async def in_flight():
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = [asyncio.create_task(c.post(f"{proc.url}/recommend", json=b)) for b in bodies(2, seed=4)]
            for _ in range(200):              # SIGTERM once one computes and one waits in the queue
                if (await c.get(f"{proc.url}/health")).json()["queue_depth"] >= 1:
                    break
                await asyncio.sleep(0.02)
            proc.terminate()
            return await asyncio.gather(*tasks)

    answers = asyncio.run(in_flight())
    assert [a.status_code for a in answers] == [200, 200]
    stop_server(proc)
    log = server_log(proc)
    assert "drained and stopped" in log and "Traceback" not in log, log[-2000:]
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{proc.url}/recommend", json=bodies(1)[0])
