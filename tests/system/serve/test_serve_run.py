"""Serving a tiny trained run: export round trip, `mindgr recommend`, and `mindgr serve` over real HTTP.

The servers are `mindgr serve` subprocesses on free 127.0.0.1 ports, always stopped at the end.
"""
import asyncio
import json

import httpx
import numpy as np
import pytest

from conftest import REPO

from serve_fixtures import tiny_run  # noqa: E402,F401

from mindgr.bench.serve import free_port, server_log, start_server, stop_server, user_requests  # noqa: E402

pytestmark = pytest.mark.slow  # a trained run, real servers and an export (~1 min in all)

_SERVERS = {}


def cli(capsys, *args):
    """`mindgr ARGS` in this process (no interpreter start-up): (exit code, stdout, the error lines)."""
    from mindgr.cli import main
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("mindgr: error:")]


def cli_error(capsys, code, *args_then_words):
    """Run `mindgr ARGS` (the items before the "--" marker) and check ONE error line with the words after it."""
    split = args_then_words.index("--")
    got, _, errors = cli(capsys, *args_then_words[:split])
    assert got == code and len(errors) == 1, (got, errors)
    for w in args_then_words[split + 1:]:
        assert w in errors[0], (w, errors[0])


@pytest.fixture(scope="module", autouse=True)
def _stop_servers():
    yield
    for proc in _SERVERS.values():
        stop_server(proc)


def _server(name, run_dir, *args):
    if name not in _SERVERS:
        port = free_port()
        proc = start_server(run_dir, port, args, cwd=REPO)
        proc.url = f"http://127.0.0.1:{port}"
        _SERVERS[name] = proc
    return _SERVERS[name]


@pytest.fixture
def server(tiny_run):
    return _server("main", tiny_run, "--batch-shapes", "1,4")


@pytest.fixture
def users(tiny_run):
    return user_requests(tiny_run, k=10)


# ---- export -----------------------------------------------------------------------------------------------

def test_export_round_trip_is_bit_identical(tiny_run, tmp_path, capsys):
    from mindspore import Tensor
    from mindgr.serve.export import load_export
    from mindgr.train.trainer import load_run
    from mindgr.serve.retrieval import Recommender, pack
    out = tmp_path / "export"
    assert cli(capsys, "export", "--run", tiny_run, "--out", out, "--batch-shapes", "1,4")[0] == 0
    manifest, encoder, table, raw_ids = load_export(out)
    run = load_run(tiny_run)
    assert sorted(manifest["encoders"]) == ["1", "4"] and manifest["max_len"] == 20
    assert manifest["model"]["arch"] == "hstu" and manifest["model"]["dim"] == 16
    assert manifest["item_table"]["shape"] == [run.data.num_items + 1, 16]
    assert np.array_equal(table, run.model.item_table())
    assert np.array_equal(raw_ids, run.data.store.item_raw_ids)
    rec = Recommender.from_run(run, shapes=(1, 4))
    ev = run.data.split.test
    queries = [rec.parse(rec.catalogue.to_raw(h).tolist(), timestamps=t.tolist())
               for h, t in zip(ev.histories[:4], ev.history_times[:4])]
    for rows in (1, 4):
        a = pack(queries[:rows], rows, rows * 20, 20)
        x = [Tensor(a[n]) for n in ("ids", "positions", "offsets", "timestamps", "request_times")]
        exported, checkpoint = encoder(*x).asnumpy(), run.model.encode_last(*x).asnumpy()
        assert exported.shape == (rows, 16) and np.abs(exported).sum() > 0
        assert np.array_equal(exported, checkpoint)
    # The faiss index probing every cell returns what the exact index returns.
    ann = Recommender.from_run(run, shapes=(4,), index="faiss-ivf", nlist=2, nprobe=2)
    for (a_ids, a_scores), (e_ids, e_scores) in zip(ann.recommend(queries, 4), rec.recommend(queries, 4)):
        assert a_ids.tolist() == e_ids.tolist()
        np.testing.assert_allclose(a_scores, e_scores, atol=1e-5)


def test_export_of_a_missing_run_is_one_line(tmp_path, capsys):
    cli_error(capsys, 1, "export", "--run", tmp_path / "nope", "--", "not a run directory")


# ---- recommend --------------------------------------------------------------------------------------------

def test_recommend_one_user_and_a_file_of_users(tiny_run, users, tmp_path, capsys):
    hist = users[0]["history"]
    code, out, _ = cli(capsys, "recommend", "--run", tiny_run, "--user-history", " ".join(map(str, hist)), "--k", 7)
    assert code == 0
    rows = [line.split("\t") for line in out.strip().splitlines()[1:]]
    assert [int(r[0]) for r in rows] == list(range(1, 8))
    items, scores = [int(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert not set(items) & set(hist) and scores == sorted(scores, reverse=True)
    f = tmp_path / "users.txt"
    f.write_text("\n".join(" ".join(map(str, u["history"])) for u in users[:3]) + "\n\n")
    code, out, _ = cli(capsys, "recommend", "--run", tiny_run, "--users", f, "--k", 5, "--include-history")
    assert code == 0
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert [x["user"] for x in lines] == [f"{f}:1", f"{f}:2", f"{f}:3"]
    assert all(len(x["items"]) == 5 for x in lines)
    _recommend_cli_answer.update(items=items, scores=scores, history=hist)


_recommend_cli_answer = {}


def test_recommend_errors_are_one_line(tiny_run, tmp_path, capsys):
    cli_error(capsys, 1, "recommend", "--run", tiny_run, "--user-history", "1 2 99999999", "--",
              "user: history[2]: unknown item id 99999999")
    f = tmp_path / "users.txt"
    f.write_text("1 2\n3 x\n")
    cli_error(capsys, 1, "recommend", "--run", tiny_run, "--users", f, "--", "users.txt:2", "integers")
    cli_error(capsys, 1, "recommend", "--run", tiny_run, "--user-history", "1", "--k", 0, "--", "k: 0")
    cli_error(capsys, 1, "recommend", "--run", tiny_run, "--", "exactly one of --user-history and --users")
    (tmp_path / "empty.txt").write_text("\n")
    cli_error(capsys, 1, "recommend", "--run", tiny_run, "--users", tmp_path / "empty.txt", "--", "no item ids")


# ---- serve ------------------------------------------------------------------------------------------------

def test_health_and_a_good_request(server, users, tiny_run):
    h = httpx.get(f"{server.url}/health").json()
    assert h["status"] == "ok" and h["batch_shapes"] == [1, 4] and h["index"] == "exact"
    r = httpx.post(f"{server.url}/recommend", json=users[0])
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["items"]) == 10 and body["scores"] == sorted(body["scores"], reverse=True)
    assert not set(body["items"]) & set(users[0]["history"])
    # The command line and the server give the same answer (no timestamps on either side).
    if _recommend_cli_answer:
        r = httpx.post(f"{server.url}/recommend", json={"history": _recommend_cli_answer["history"], "k": 7})
        assert r.json()["items"] == _recommend_cli_answer["items"]
        np.testing.assert_allclose(r.json()["scores"], _recommend_cli_answer["scores"], atol=1e-6)


@pytest.mark.parametrize("body, status, words", [
    ('{"history": [1, 2,', 400, "malformed JSON"),
    ("", 400, "body: missing"),
    ("[1, 2]", 422, "expected a JSON object"),
    ('{"history": []}', 422, "history: empty"),
    ('{"history": [1, 99999999]}', 422, "history[1]: unknown item id 99999999"),
    ('{"history": [1], "k": 0}', 422, "k: 0"),
    ('{"history": [1], "k": 100000}', 422, "k: 100000"),
    ('{"history": [1], "k": "ten"}', 422, "k: Input should be a valid integer"),
    ('{"history": ["1"]}', 422, "history.0"),
    ('{"history": [1], "kk": 3}', 422, "kk: Extra inputs"),
    ('{"history": [1, 2], "timestamps": [5]}', 422, "timestamps: 1 values for 2"),
    ('{"history": [' + ",".join(["1"] * 5000) + "]}", 422, "more than the limit 4096"),
])
def test_bad_requests_get_a_4xx_with_one_line(server, body, status, words):
    r = httpx.post(f"{server.url}/recommend", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    reason = r.json()["error"]
    assert words in reason and "\n" not in reason
    assert httpx.get(f"{server.url}/health").status_code == 200   # still serving


def test_wrong_content_type_is_415(server):
    r = httpx.post(f"{server.url}/recommend", content="history=1", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]


def test_missing_content_type_is_415_and_unknown_paths_use_the_error_shape(server):
    r = httpx.post(f"{server.url}/recommend", content=b'{"history": [1]}')
    assert r.status_code == 415 and r.json() == {"error": "Content-Type missing: send application/json"}
    r = httpx.get(f"{server.url}/nowhere")
    assert r.status_code == 404 and list(r.json()) == ["error"]


def test_an_oversized_body_is_413_before_parsing_and_health_answers_during_an_upload(server):
    """A 50 MB declared body is refused from its header; a chunked upload in flight does not hold up
    /health, and is cut with 413 once it passes the limit (1 MiB by default)."""
    r = httpx.post(f"{server.url}/recommend", content=b" " * (50 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit 1048576" in r.json()["error"]

    async def upload_and_probe():
        sent, health = [0], []

        async def body():
            while sent[0] < (4 << 20):
                if sent[0] == 64 << 10:                  # the upload is in flight: ask for /health
                    async with httpx.AsyncClient() as probe:
                        health.append((await probe.get(f"{server.url}/health")).status_code)
                sent[0] += 16 << 10
                yield b" " * (16 << 10)
                await asyncio.sleep(0)

        async with httpx.AsyncClient(timeout=60) as c:
            try:
                r = await c.post(f"{server.url}/recommend", content=body(), headers={"content-type": "application/json"})
            except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
                return health, None, sent[0]    # the server closed the connection after its 413
        return health, r, sent[0]

    health, r, sent = asyncio.run(upload_and_probe())
    assert health == [200]
    if r is not None:
        assert r.status_code == 413 and "more than the limit 1048576" in r.json()["error"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_concurrent_requests_are_batched_and_answered_like_single_ones(server, users):
    bodies = users[:32]
    single = [httpx.post(f"{server.url}/recommend", json=b).json() for b in bodies[:8]]

    async def burst():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(c.post(f"{server.url}/recommend", json=b) for b in bodies))

    before = httpx.get(f"{server.url}/metrics").json()["batches"]["size_histogram"]
    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * 32
    for a, s in zip(answers[:8], single):
        assert a.json()["items"] == s["items"]
        np.testing.assert_allclose(a.json()["scores"], s["scores"], atol=1e-6)
    m = httpx.get(f"{server.url}/metrics").json()
    after = m["batches"]["size_histogram"]
    grouped = {int(k): after[k] - before.get(k, 0) for k in after}
    assert sum(k * v for k, v in grouped.items()) == 32 and max(k for k, v in grouped.items() if v) <= 4
    assert set(m["batches"]["shape_histogram"]) <= {"1", "4"}
    assert m["requests"]["by_status"]["200"] >= 40 and m["latency_ms"]["p99"] >= m["latency_ms"]["p50"] > 0
    assert m["queue"]["depth"] == 0


def test_exact_top_k_equals_mindgr_eval_ranking(server, tiny_run, capsys):
    """Every test user: the target's place in the served ranking equals `mindgr eval`'s rank for it."""
    code, out, _ = cli(capsys, "eval", "--run", tiny_run, "--split", "test", "--json")
    assert code == 0
    ranks = np.load(json.loads(out)["ranks_file"])["ranks"]
    bodies = user_requests(tiny_run, k=1)
    num_items = httpx.get(f"{server.url}/health").json()["items"]
    raw_targets = _raw_targets(tiny_run)

    async def ask():  # the whole catalogue, history kept: eval removes history items except the target
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(c.post(f"{server.url}/recommend", json=dict(
                b, k=num_items, exclude_history=False)) for b in bodies))

    answers = asyncio.run(ask())
    assert len(answers) == len(ranks) == 120
    for b, r, target, rank in zip(bodies, answers, raw_targets, ranks):
        assert r.status_code == 200, r.text
        ranking = [i for i in r.json()["items"] if i == target or i not in set(b["history"])]
        assert ranking.index(target) == rank


def _raw_targets(run_dir):
    import yaml
    from mindgr.config import config_from_dict
    from mindgr.train.data import RunData
    data = RunData(config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text())))
    return [int(x) for x in data.store.item_raw_ids[np.asarray(data.split.test.targets)]]


@pytest.fixture
def slow_server(tiny_run):
    """One row per batch, 300 ms each (the test-only delay), room for 2 waiting requests."""
    return _server("slow", tiny_run, "--batch-shapes", "1", "--queue-size", 2, "--max-wait-ms", 0,
                   "--test-batch-delay-ms", 300)


def test_overload_gets_503_and_the_server_recovers(slow_server, users):
    async def burst():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(c.post(f"{slow_server.url}/recommend", json=b) for b in users[:10]))

    answers = asyncio.run(burst())
    codes = sorted(a.status_code for a in answers)
    assert set(codes) == {200, 503} and codes.count(200) >= 1 and codes.count(503) >= 5, codes
    assert all("queue full" in a.json()["error"] for a in answers if a.status_code == 503)
    assert httpx.post(f"{slow_server.url}/recommend", json=users[0]).status_code == 200
    assert httpx.get(f"{slow_server.url}/metrics").json()["requests"]["by_status"]["503"] == codes.count(503)


@pytest.fixture
def draining_server(tiny_run):
    """One row per batch, 300 ms each, a queue with room for every request the drain test sends."""
    return _server("drain", tiny_run, "--batch-shapes", "1", "--queue-size", 8, "--max-wait-ms", 0,
                   "--test-batch-delay-ms", 300)


def test_shutdown_drains_in_flight_requests(draining_server, users):
    proc = _SERVERS.pop("drain")

    async def in_flight():
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = [asyncio.create_task(c.post(f"{proc.url}/recommend", json=b)) for b in users[:3]]
            # SIGTERM only once all three are accepted (one computing, two queued): on a busy host a
            # fixed sleep could signal before the last one arrived, and the draining server refuses it
            for _ in range(200):
                if (await c.get(f"{proc.url}/health")).json()["queue_depth"] >= 2:
                    break
                await asyncio.sleep(0.02)
            proc.terminate()              # SIGTERM: uvicorn's graceful shutdown
            return await asyncio.gather(*tasks)

    answers = asyncio.run(in_flight())
    assert [a.status_code for a in answers] == [200, 200, 200]
    stop_server(proc)
    log = server_log(proc)
    assert "drained and stopped" in log and "Traceback" not in log, log[-2000:]
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{proc.url}/recommend", json=users[0])


def test_serve_refuses_a_bad_run_or_shapes_in_one_line(tmp_path, capsys):
    cli_error(capsys, 1, "serve", "--run", tmp_path / "nope", "--", "not a run directory")
    cli_error(capsys, 2, "serve", "--run", tmp_path / "nope", "--batch-shapes", "0,4", "--", "--batch-shapes")
