"""`mindgr serve`: an HTTP recommendation server for HSTU-family and generative runs (FastAPI + uvicorn).

HSTU-family runs: encode, then top-k over the item table (mindgr.serve.recommend). Generative runs (or a
random-weight GR model, `--random-gr`): beam search with the decoding engine or the naive baseline
(mindgr.serve.generative). Both behind the same batcher, endpoints and errors.

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
Errors are {"error": "one line"}: 400 malformed JSON, 422 invalid fields (unknown item id, empty or
over-long history, bad k, ...), 503 queue full or shutting down, 500 an internal failure.
"""
import asyncio
import time
from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt

from mindgr.serve.batcher import DynamicBatcher, Overloaded, ShuttingDown
from mindgr.serve.metrics import ServerMetrics
from mindgr.serve.recommend import RequestError


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
               ready_message: Optional[str] = None):
    """The FastAPI app; its lifespan starts (compiles) and drains the batcher."""
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

    app.add_middleware(_Timing, metrics=metrics)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):  # a bug, never the input: still one line
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]}, 500)

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
        return JSONResponse(recommender.to_response(ids, scores))  # skips FastAPI's generic encoder

    @app.get("/health")
    async def health():
        body = {"status": "ok" if state["ready"] else "starting", "queue_depth": batcher.depth, **(info or {})}
        return JSONResponse(body, 200 if state["ready"] else 503)

    @app.get("/metrics")
    async def get_metrics():
        return metrics.snapshot()

    return app


def serve(run_dir, host: str = "127.0.0.1", port: int = 8000, which: str = "best", shapes=None,
          queue_size: int = 256, max_wait_ms: float = 2.0, index: str = "exact", nprobe: int = 8,
          max_history: Optional[int] = None, graceful_timeout: float = 30.0, test_delay_ms: float = 0.0,
          threads: Optional[int] = None, decode: str = "engine", beam: int = 16, overlap: bool = False,
          random_gr: Optional[str] = None):
    """Load the run (or build a random GR model), compile its batch shapes, serve until SIGINT/SIGTERM,
    drain, return. decode / beam / overlap / random_gr apply to generative models only."""
    from mindgr.serve.recommend import DEFAULT_MAX_HISTORY
    from mindgr.serve import generative as gr
    max_history = max_history or DEFAULT_MAX_HISTORY
    if random_gr is not None or (run_dir is not None and gr.is_generative_run(run_dir)):
        if random_gr is not None:
            _setup_random(threads)
            bundle = gr.random_bundle(**gr.parse_random_spec(random_gr))
        else:
            bundle = gr.load_bundle(run_dir, which, threads)
        rec = gr.GenerativeRecommender(bundle, beam, decode, shapes or gr.DEFAULT_GR_SHAPES, overlap, max_history)
        info = {**gr.bundle_info(bundle), **rec.describe(), "queue_size": queue_size, "max_wait_ms": max_wait_ms}
        banner = (f"mindgr serve: generative model ({info['checkpoint']}) on http://{host}:{port}, decode "
                  f"{decode}, beam {beam}, overlap {'on' if overlap else 'off'}, user-batch shapes {rec.shapes}")
    else:
        from mindgr.train.trainer import load_run
        from mindgr.serve.recommend import DEFAULT_SHAPES, Recommender
        options = {"nprobe": nprobe} if index == "faiss-ivf" else {}
        run = load_run(run_dir, which, threads=threads)
        rec = Recommender.from_run(run, shapes or DEFAULT_SHAPES, index, max_history, **options)
        info = {"run": str(run.run_dir), "checkpoint": run.checkpoint, "step": run.step, "arch": run.cfg.model.arch,
                "items": rec.catalogue.num_items, "max_len": rec.max_len, "batch_shapes": rec.shapes,
                "index": rec.index.name, "queue_size": queue_size, "max_wait_ms": max_wait_ms}
        banner = (f"mindgr serve: {run.run_dir} ({run.checkpoint}) on http://{host}:{port}, batch shapes "
                  f"{rec.shapes}, index {rec.index.name}")
    return run_server(rec, info, banner, host, port, queue_size, max_wait_ms, graceful_timeout, test_delay_ms)


def _setup_random(threads):
    """Process setup for a random-weight GR model (no run config): graph mode, the device, threads, and
    the fastest ops backend that builds here (auto)."""
    from mindgr.ops import set_backend
    from mindgr.runtime import limit_threads, select_device
    select_device()
    if threads:
        limit_threads(threads)
    set_backend("auto")


def run_server(rec, info: dict, banner: str, host: str, port: int, queue_size: int = 256, max_wait_ms: float = 2.0,
               graceful_timeout: float = 30.0, test_delay_ms: float = 0.0):
    """Serve a recommender (HSTU Recommender or GenerativeRecommender) until SIGINT/SIGTERM."""
    import uvicorn
    metrics = ServerMetrics()
    rec.metrics = metrics
    batcher = DynamicBatcher(rec, metrics, queue_size, max_wait_ms, test_delay_ms)
    app = create_app(rec, batcher, metrics, info, ready_message=banner)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=graceful_timeout, lifespan="on")
    uvicorn.Server(config).run()
    return 0
