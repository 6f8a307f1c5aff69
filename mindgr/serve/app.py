"""The HTTP app of `mindgr serve` (FastAPI + uvicorn) in front of any serving model and its batcher.

The served model is a ServingModel (mindgr.serve.requests): the retrieval model (encode, then top-k over
the item table, mindgr.serve.retrieval) or the generative one (beam search with the decoding engine,
mindgr.serve.generative). Both sit behind the same batcher, endpoints and errors; mindgr.serve.server
loads the model and starts this app.

Why FastAPI + uvicorn: request bodies are validated against a typed model before any of our code runs
(every malformed request becomes a 4xx with a one-line reason, the process never sees bad types); the
lifespan hooks give one place to compile every batch shape before the port opens and to drain the
batcher at shutdown; and uvicorn's graceful shutdown (SIGINT/SIGTERM) stops accepting connections and
lets in-flight requests finish before the lifespan shutdown runs. Both are standard, maintained PyPI
packages (the `serve` extra); MindSpore's own serving package is years older than MindSpore 2.10.

Endpoints:
  POST /recommend  {"history": [raw item ids], "timestamps": [...]?, "request_time": int?, "k": 10,
                    "exclude_history": true} -> {"items": [raw ids best first], "scores": [...]}
  GET  /health     readiness and what is served
  GET  /metrics    request counts by status, latency percentiles, batch-size histogram, queue depth
Errors are {"error": "one line"}, every one of them (FastAPI's own 404 / 405 / validation bodies included):
400 malformed JSON, 413 a body over the limit (`max_body_bytes`, checked before anything is parsed: the
Content-Length header first, then the bytes as they arrive for a chunked body), 415 a missing or non-JSON
Content-Type, 422 invalid fields (unknown item id, empty or over-long history, bad k, ...) or fewer than k
items to answer with (both kinds of model: k more than the items left after excluding the history, or a
beam search whose beam holds fewer than k such items), 503 queue full or shutting down, 500 an internal
failure. docs/serving.md lists them.
"""
import asyncio
import time
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from mindgr.serve.batcher import DynamicBatcher, Overloaded, ShuttingDown
from mindgr.serve.metrics import ServerMetrics
from mindgr.serve.options import DEFAULT_MAX_BODY_BYTES
from mindgr.serve.requests import RequestError


class RecommendRequest(BaseModel):
    """POST /recommend's body: raw item ids (and times in the data's unit), oldest first."""
    model_config = ConfigDict(extra="forbid")
    history: list[StrictInt]
    timestamps: Optional[list[StrictInt]] = None
    request_time: Optional[StrictInt] = None
    k: StrictInt = 10
    exclude_history: StrictBool = True


def _one_line(errors):
    """(status, reason) from pydantic's error list: the first error, with its field path."""
    if not errors:
        return 422, "invalid request"
    e = errors[0]
    if e.get("type") == "json_invalid":
        return 400, f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg', ''))}"
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    where = ".".join(loc) if loc else "body"
    msg = str(e.get("msg", "invalid")).replace("\n", " ")
    if not loc and e.get("type") == "missing":
        return 400, "body: missing (send a JSON object)"
    if not loc and e.get("type") in ("model_attributes_type", "dict_type"):
        return 422, "body: expected a JSON object"
    return 422, f"{where}: {msg}"


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _send_error(send, status: int, reason: str):
    """A one-line {"error": ...} response written straight to the ASGI channel (before the app runs)."""
    body = JSONResponse({"error": reason}).body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class _BodyGuard:
    """Plain ASGI middleware in front of the app, for requests that carry a body (POST /recommend):
    415 for a missing or non-JSON Content-Type, 413 for a body over `limit` bytes, both decided before a
    byte is parsed. A declared Content-Length over the limit is refused without reading the body; a body
    without one (chunked) is read only up to the limit. The accepted body is handed on whole."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, int(limit)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        ctype = headers.get("content-type", "")
        if scope.get("path") == "/recommend" and not _is_json(ctype):
            what = f"Content-Type {ctype.split(';')[0].strip()}" if ctype.strip() else "Content-Type missing"
            return await _send_error(send, 415, f"{what}: send application/json")
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                return await _send_error(send, 400, f"Content-Length: {declared!r} is not a byte count")
            if int(declared) > self.limit:
                return await _send_error(send, 413, f"body: {int(declared)} bytes, more than the limit "
                                                    f"{self.limit} (the server's --max-body-bytes)")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":       # the client went away: nothing to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _send_error(send, 413, f"body: more than the limit {self.limit} bytes (the "
                                                    "server's --max-body-bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), [False]

        async def replay():
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()                        # later: the disconnect message

        return await self.app(scope, replay, send)


class _Timing:
    """Plain ASGI middleware (cheaper than Starlette's BaseHTTPMiddleware): counts every response by
    status, records /recommend latencies, and tells the client the server-side time (x-server-ms)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def timed_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                ms = f"{(time.perf_counter() - t0) * 1e3:.3f}".encode()
                message = dict(message, headers=list(message.get("headers", [])) + [(b"x-server-ms", ms)])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.record_request(status[0], time.perf_counter() - t0, scope.get("path") == "/recommend")


def create_app(recommender, batcher: DynamicBatcher, metrics: ServerMetrics, info: Optional[dict] = None,
               ready_message: Optional[str] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The FastAPI app; its lifespan starts (compiles) and drains the batcher."""
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"max body bytes: {max_body_bytes!r} (expected a positive integer)")
    state = {"ready": False}

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.get_running_loop().run_in_executor(None, batcher.start)  # compile every shape
        state["ready"] = True
        if ready_message:
            print(ready_message, flush=True)
        yield
        state["ready"] = False
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)  # drain what is queued
        if hasattr(recommender, "close"):
            recommender.close()
        counts = metrics.snapshot()["requests"]["by_status"]
        print(f"mindgr serve: drained and stopped; requests by status {counts}", flush=True)

    app = FastAPI(title="MindGR", lifespan=lifespan)

    app.add_middleware(_BodyGuard, limit=max_body_bytes)   # the last added runs first: _Timing counts its 413s
    app.add_middleware(_Timing, metrics=metrics)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):  # a bug, never the input: still one line
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]}, 500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # 404, 405, ...: the same shape
        reason = str(exc.detail).splitlines()[0] if exc.detail else "error"
        if exc.status_code == 404:
            reason = f"{request.url.path}: not found (endpoints: POST /recommend, GET /health, GET /metrics)"
        elif exc.status_code == 405:
            reason = f"{request.method} {request.url.path}: method not allowed"
        return JSONResponse({"error": reason}, exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        ctype = request.headers.get("content-type", "")
        if ctype and "json" not in ctype:  # FastAPI reads a body as JSON only when it says so
            return JSONResponse({"error": f"Content-Type {ctype.split(';')[0]}: send application/json"}, 415)
        status, reason = _one_line(exc.errors())
        return JSONResponse({"error": reason}, status)

    @app.post("/recommend")
    async def recommend(body: RecommendRequest):
        try:
            query = recommender.parse(body.history, body.timestamps, body.request_time, body.k,
                                      body.exclude_history)
            fut = batcher.submit(query)
        except RequestError as e:
            return JSONResponse({"error": str(e)}, e.status)
        except (Overloaded, ShuttingDown) as e:
            return JSONResponse({"error": str(e)}, 503)
        ids, scores = await asyncio.wrap_future(fut)
        try:
            recommender.check_complete(query, ids)     # fewer than k items: 422, whichever kind of model
        except RequestError as e:
            return JSONResponse({"error": str(e)}, e.status)
        return JSONResponse(recommender.to_response(ids, scores))  # skips FastAPI's generic encoder

    @app.get("/health")
    async def health():
        body = {"status": "ok" if state["ready"] else "starting", "queue_depth": batcher.depth, **(info or {})}
        return JSONResponse(body, 200 if state["ready"] else 503)

    @app.get("/metrics")
    async def get_metrics():
        return metrics.snapshot()

    return app


def run_server(rec, info: dict, banner: str, options):
    """Serve a model (the retrieval Recommender or a GenerativeRecommender) until SIGINT/SIGTERM, with the
    HTTP and batcher settings of `options` (mindgr.serve.options.ServerOptions)."""
    import uvicorn
    metrics = ServerMetrics()
    rec.metrics = metrics
    batcher = DynamicBatcher(rec, metrics, options.queue_size, options.max_wait_ms, options.test_delay_ms)
    app = create_app(rec, batcher, metrics, info, ready_message=banner, max_body_bytes=options.max_body_bytes)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=options.graceful_timeout, lifespan="on")
    uvicorn.Server(config).run()
    return 0
