"""Serving pieces without a model: id mapping, request validation, packing, top-k indexes, the batcher."""
import threading
import time

import numpy as np
import pytest

from mindgr.serve.batcher import DynamicBatcher, Overloaded, ShuttingDown
from mindgr.serve.index import ExactIndex, FaissIVFIndex, recall_at_k
from mindgr.serve.metrics import ServerMetrics
from mindgr.serve.requests import Catalogue, Query, RequestError, parse_query
from mindgr.serve.retrieval import pack

RAW = np.array([-1, 100, 7, 55, 9000, 3], np.int64)   # internal 1..5 -> raw ids (unsorted on purpose)


def test_catalogue_maps_raw_ids_both_ways():
    cat = Catalogue(RAW)
    assert cat.num_items == 5
    assert cat.to_internal([3, 100, 9000, 7]).tolist() == [5, 1, 4, 2]
    assert cat.to_raw([5, 1, 4, 2]).tolist() == [3, 100, 9000, 7]
    for bad, at in (([3, 4], 1), ([10 ** 6], 0), ([-1], 0), ([1], 0)):
        with pytest.raises(RequestError, match=rf"history\[{at}\]: unknown item id {bad[at]}"):
            cat.to_internal(bad)


@pytest.mark.parametrize("kwargs, words", [
    (dict(history=[]), "history: empty"),
    (dict(history=[3] * 9), "more than the limit 8"),
    (dict(history=[3], k=0), "k: 0"),
    (dict(history=[3], k=6), "k: 6"),
    (dict(history=[3], k=True), "k: True"),
    (dict(history=[3, 7], k=4), "more than the 3 items left"),
    (dict(history=[3, 12345]), "history[1]: unknown item id 12345"),
    (dict(history=[3, 7], timestamps=[1]), "timestamps: 1 values for 2"),
    (dict(history=[3, 7], timestamps=[5, 4]), "timestamps[1]: earlier"),
    (dict(history=[3, 7], timestamps=[-1, 4]), "timestamps[0]: negative"),
    (dict(history=[3, 7], timestamps=[4, 5], request_time=4), "request_time: 4 is before"),
    (dict(history=[3, 7], request_time=4), "request_time: given without timestamps"),
    (dict(history=[3, 7], timestamps=[4, 5], request_time=2 ** 70), "request_time: does not fit in 64 bits"),
    (dict(history=[2 ** 70]), "does not fit in 64 bits"),
])
def test_bad_requests_get_one_line_reasons(kwargs, words):
    kwargs.setdefault("k", 1)
    with pytest.raises(RequestError) as e:
        parse_query(Catalogue(RAW), max_history=8, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_parse_query_converts_ids_and_millisecond_times():
    q = parse_query(Catalogue(RAW), [7, 3], [1500, 2999], request_time=3000, k=2, time_unit="ms")
    assert q.items.tolist() == [2, 5] and q.times.tolist() == [1, 2] and q.k == 2 and q.exclude_history
    assert q.request_time == 3 and q.when() == 3
    assert parse_query(Catalogue(RAW), [7, 3], [1500, 2999], k=2, time_unit="ms").when() == 2
    q = parse_query(Catalogue(RAW), [7, 7], k=5, exclude_history=False)
    assert q.times.tolist() == [0, 0] and not q.exclude_history


def test_pack_keeps_the_last_max_len_items_and_leaves_unused_rows_empty():
    qs = [Query(np.arange(1, 8, dtype=np.int32), np.arange(10, 17), 1, True),
          Query(np.array([4, 5], np.int32), np.array([1, 2]), 1, True)]
    a = pack(qs, rows=4, tokens=12, max_len=5)
    assert a["offsets"].tolist() == [0, 5, 7, 7, 7]
    assert a["ids"][:7].tolist() == [3, 4, 5, 6, 7, 4, 5] and not a["ids"][7:].any()
    assert a["positions"][:7].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert a["timestamps"][:5].tolist() == [12, 13, 14, 15, 16]
    assert a["request_times"].tolist() == [16, 2, 0, 0]     # no request_time: the last history time
    with pytest.raises(ValueError, match="3 queries for a batch of 2"):
        pack(qs + qs[:1], rows=2, tokens=20, max_len=5)


def _table(rng, n, d):
    t = rng.standard_normal((n + 1, d)).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    t[0] = 0
    return t


def test_exact_top_k_equals_a_full_sort_without_padding_or_history():
    rng = np.random.default_rng(0)
    table = _table(rng, 300, 16)
    users = rng.standard_normal((5, 16)).astype(np.float32)
    excl = [rng.choice(np.arange(1, 301), 20, replace=False).astype(np.int32) for _ in range(4)] + [None]
    got = ExactIndex(table).top_k(users, [10, 1, 50, 299 - 20, 300], excl)
    for u, ((ids, scores), k, ex) in enumerate(zip(got, [10, 1, 50, 279, 300], excl)):
        s = (users[u] @ table.T).astype(np.float64)
        s[0] = -np.inf
        if ex is not None:
            s[ex] = -np.inf
        want = np.argsort(-s, kind="stable")[:k]
        assert ids.tolist() == want.tolist()
        # absolute too: float32 dot products of unit rows differ by ~1e-7 between gemm and gemv, and some
        # scores are near 0, where a relative tolerance alone fails on rounding
        np.testing.assert_allclose(scores, s[want], rtol=1e-5, atol=1e-5)
        assert 0 not in ids and (ex is None or not np.isin(ids, ex).any())


def test_faiss_ivf_recall_is_exact_when_every_cell_is_probed_and_measured_otherwise():
    rng = np.random.default_rng(1)
    table = _table(rng, 2000, 16)
    users = rng.standard_normal((64, 16)).astype(np.float32)
    hist = [rng.choice(np.arange(1, 2001), 5, replace=False) for _ in range(64)]
    exact = ExactIndex(table).top_k(users, [10] * 64, hist)
    full = FaissIVFIndex(table, nlist=16, nprobe=16)
    approx = full.top_k(users, [10] * 64, hist)
    assert recall_at_k(approx, exact) == 1.0
    for (ids, _), h in zip(approx, hist):
        assert len(ids) == 10 and 0 not in ids and not np.isin(ids, h).any()
    partial = recall_at_k(FaissIVFIndex(table, nlist=16, nprobe=1).top_k(users, [10] * 64, hist), exact)
    assert 0.0 < partial < 1.0   # one cell of 16: some true neighbours are missed


class FakeRecommender:
    """Shapes 1, 4, 8; records each batch; optional per-batch delay; item = 10 * query's k."""
    shapes = [1, 4, 8]
    max_rows = 8

    def __init__(self, delay=0.0):
        self.delay, self.batches, self.warm = delay, [], False

    def warm_up(self):
        self.warm = True

    def shape_for(self, n):
        return next(r for r in self.shapes if r >= n)

    def recommend(self, queries, rows):
        self.batches.append((len(queries), rows))
        time.sleep(self.delay)
        return [(np.array([10 * q]), np.array([1.0])) for q in queries]


def test_batcher_groups_concurrent_requests_into_fixed_shapes_and_answers_each():
    rec, metrics = FakeRecommender(delay=0.05), ServerMetrics()
    b = DynamicBatcher(rec, metrics, queue_size=64, max_wait_ms=5)
    b.start()
    assert rec.warm
    futs = [b.submit(i) for i in range(20)]
    assert [int(f.result(5)[0][0]) for f in futs] == [10 * i for i in range(20)]
    b.close(5)
    assert sum(n for n, _ in rec.batches) == 20
    assert all(rows in rec.shapes and n <= rows for n, rows in rec.batches)
    assert max(n for n, _ in rec.batches) > 1      # requests queued behind a busy batch were grouped
    snap = metrics.snapshot()["batches"]
    assert snap["count"] == len(rec.batches) and sum(int(k) * v for k, v in snap["size_histogram"].items()) == 20


def test_batcher_refuses_when_full_and_drains_on_close():
    rec = FakeRecommender(delay=0.2)
    b = DynamicBatcher(rec, ServerMetrics(), queue_size=2, max_wait_ms=0)
    b.start()
    first = b.submit(1)
    time.sleep(0.05)                  # the worker holds `first`; the queue is empty again
    queued = [b.submit(2), b.submit(3)]
    with pytest.raises(Overloaded, match="queue full"):
        b.submit(4)
    closer = threading.Thread(target=b.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(ShuttingDown):
        b.submit(5)
    closer.join(5)
    assert not closer.is_alive()
    assert [int(f.result(0)[0][0]) for f in [first] + queued] == [10, 20, 30]   # all answered before close returned


def test_batcher_answers_a_failing_batch_with_its_error_and_keeps_serving():
    class Flaky(FakeRecommender):
        def recommend(self, queries, rows):
            if any(q < 0 for q in queries):
                raise RuntimeError("boom")
            return super().recommend(queries, rows)

    b = DynamicBatcher(Flaky(), ServerMetrics(), queue_size=8, max_wait_ms=0)
    b.start()
    with pytest.raises(RuntimeError, match="boom"):
        b.submit(-1).result(5)
    assert int(b.submit(3).result(5)[0][0]) == 30
    b.close(5)


def test_batcher_reports_a_failed_warm_up_to_start():
    class Broken(FakeRecommender):
        def warm_up(self):
            raise RuntimeError("cannot compile")

    with pytest.raises(RuntimeError, match="cannot compile"):
        DynamicBatcher(Broken(), ServerMetrics()).start()


def test_metrics_percentiles_and_counts():
    m = ServerMetrics(window=100)
    for i in range(1, 201):
        m.record_request(200, i / 1000, True)
    m.record_request(422, 0.5, True)
    m.record_request(200, 9.0, False)          # /health: counted, not a recommend latency
    s = m.snapshot()
    assert s["requests"]["by_status"] == {"200": 201, "422": 1} and s["requests"]["total"] == 202
    assert s["latency_ms"]["count"] == 100     # the window keeps the latest 100: 101..200 ms
    assert s["latency_ms"]["p50"] == pytest.approx(150.5) and s["latency_ms"]["p99"] == pytest.approx(199.01)


# ---- the HTTP app around any served model: body limit, content type, one error shape, short lists ----------

import asyncio  # noqa: E402

from mindgr.serve.requests import ServingModel  # noqa: E402


class _ListModel(ServingModel):
    """A served model without a network: item i's score is i; `short` answers one item fewer than asked."""
    shapes, workers = [1, 4], 1

    def __init__(self, short=False):
        self.catalogue, self.short = Catalogue(RAW), short

    def parse(self, history, timestamps=None, request_time=None, k=10, exclude_history=True):
        return parse_query(self.catalogue, history, timestamps, request_time, k, exclude_history)

    def warm_up(self):
        pass

    def recommend(self, queries, rows=None):
        return [(np.arange(5, 5 - q.k + self.short, -1), np.arange(q.k - self.short, dtype=float)) for q in queries]


def _client(model, limit=1000):
    from fastapi.testclient import TestClient
    from mindgr.serve.app import create_app
    metrics = ServerMetrics()
    return TestClient(create_app(model, DynamicBatcher(model, metrics, 8, 0), metrics, max_body_bytes=limit))


JSON = {"content-type": "application/json"}


def test_every_error_has_the_one_error_shape_and_the_right_status():
    with _client(_ListModel()) as c:
        assert c.post("/recommend", json={"history": [100, 7], "k": 2}).json() == {"items": [3, 9000],
                                                                               "scores": [0.0, 1.0]}
        cases = [(c.post("/recommend", content=b'{"history": [100]}'), 415, "Content-Type missing"),
                 (c.post("/recommend", content=b"history=100", headers={"content-type": "text/plain"}), 415,
                  "send application/json"),
                 (c.post("/recommend", content=b'{"history": [1', headers=JSON), 400, "malformed JSON"),
                 (c.post("/recommend", content=b'{"history": ["x"]}', headers=JSON), 422, "history.0"),
                 (c.post("/recommend", json={"history": [100], "k": 9}), 422, "k: 9"),
                 (c.get("/recommend"), 405, "method not allowed"),
                 (c.get("/nowhere"), 404, "not found"),
                 (c.post("/recommend", content=b" " * 1001, headers=JSON), 413, "limit 1000")]
        for r, status, words in cases:
            body = r.json()
            assert r.status_code == status and list(body) == ["error"], (status, r.status_code, body)
            assert words in body["error"] and "\n" not in body["error"], (words, body)
        assert c.get("/health").status_code == 200


def test_a_short_list_is_a_422_for_any_served_model():
    with _client(_ListModel(short=True)) as c:
        r = c.post("/recommend", json={"history": [100], "k": 3})
        assert r.status_code == 422 and r.json() == {"error": "k: 3 asked, only 2 items can be recommended "
                                                              "for this history"}


def _asgi(guard_limit, headers, chunks):
    """Run _BodyGuard over `chunks` (a request body in pieces): (status, error, body the app saw, pieces read)."""
    from mindgr.serve.app import _BodyGuard
    seen, sent, reads = [], [], [0]

    async def app(scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        i = reads[0]
        reads[0] += 1
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    async def send(m):
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": "/recommend",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(_BodyGuard(app, guard_limit)(scope, receive, send))
    import json
    status = sent[0]["status"]
    error = json.loads(sent[1]["body"]).get("error") if status != 200 else None
    return status, error, seen, reads[0]


def test_the_body_limit_is_enforced_before_the_body_is_read_or_parsed():
    piece = b"x" * 4096
    # a declared Content-Length over the limit: refused without reading a byte
    status, error, seen, reads = _asgi(10_000, {"content-type": "application/json",
                                                "content-length": str(50 << 20)}, [piece] * 3)
    assert (status, seen, reads) == (413, [], 0) and "52428800 bytes" in error
    # chunked (no Content-Length), 50 MB on its way: reading stops at the first piece past the limit
    status, error, seen, reads = _asgi(10_000, {"content-type": "application/json"}, [piece] * 12800)
    assert (status, seen, reads) == (413, [], 3) and "limit 10000" in error
    # under the limit, in pieces: the app gets the whole body at once
    status, _, seen, reads = _asgi(10_000, {"content-type": "application/json"}, [b'{"history"', b": [1]}"])
    assert (status, seen, reads) == (200, [b'{"history": [1]}'], 2)
    # a missing content type: 415 before reading
    status, error, seen, reads = _asgi(10_000, {}, [b"{}"])
    assert (status, seen, reads) == (415, [], 0) and "Content-Type missing" in error
