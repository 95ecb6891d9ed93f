"""``engram worker serve``: embeddings and reranking over HTTP, batched across callers.

A model runs a batch of 32 texts in little more time than one on a GPU, and
far more efficiently than 32 separate calls on a CPU, so concurrent requests
are merged: each request's items join a queue; a single batching task takes
the first waiting request, then keeps collecting for up to
``worker_batch_wait_ms`` or until ``worker_max_batch`` items, runs the model
once in a thread, and hands every request its own slice of the result. A lone
request waits at most the (few-millisecond) collection window.

Endpoints: ``POST /embed`` ``{"texts": [...], "kind": "passage"|"query",
"asker": ..., "model": ...}`` (with ``model``, 409 ``MODEL_MISMATCH`` when this
worker runs another model); ``POST /rerank`` ``{"query": ..., "passages": [...]}``;
``GET /healthz`` (the process answers), ``GET /readyz`` (models loaded; says
which, and whether the reranker is present), ``GET /metrics`` (Prometheus).
Bad payloads get 4xx with a message naming the problem: 400 not JSON, 422 wrong
shape or type or empty, 413 too many texts or a text over the size limit, 503
a reranker that is not on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError
from orchestrator.worker.embedder import Embedder, ModelUnavailable, Reranker
from orchestrator.worker.registry import ModelMismatch


class PayloadError(BadInput):
    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Pending:
    items: list[Any]
    future: asyncio.Future[list[Any]]


@dataclass
class MicroBatcher:
    """Merges concurrent requests' items into model batches of at most ``max_items``."""

    name: str
    run: Callable[[list[Any]], list[Any]]  # items -> one result per item (blocking)
    max_items: int
    wait_s: float
    observe: Callable[[int, int], None]  # (items in batch, requests in batch)
    _queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None
    batch_sizes: list[int] = field(default_factory=list)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, items: list[Any]) -> list[Any]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(items, future))
        return await future

    async def _loop(self) -> None:
        carry: _Pending | None = None
        while True:
            first = carry or await self._queue.get()
            carry = None
            batch = [first]
            size = len(first.items)
            deadline = time.monotonic() + self.wait_s
            while size < self.max_items:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), timeout=left)
                except TimeoutError:
                    break
                if size + len(nxt.items) > self.max_items:
                    carry = nxt  # starts the next batch; a request is never split
                    break
                batch.append(nxt)
                size += len(nxt.items)
            items = [x for p in batch for x in p.items]
            try:
                results = await asyncio.to_thread(self.run, items)
            except Exception as exc:
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            self.batch_sizes.append(len(items))
            self.observe(len(items), len(batch))
            pos = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result(results[pos: pos + len(p.items)])
                pos += len(p.items)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("engram_worker_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.items = Counter("engram_worker_items", "Texts or pairs processed", ["kind"],
                             registry=self.registry)
        self.batch_items = Histogram(
            "engram_worker_batch_items", "Items per model batch", ["kind"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry)
        self.batch_requests = Histogram(
            "engram_worker_batch_requests", "Requests merged into one model batch", ["kind"],
            buckets=(1, 2, 4, 8, 16, 32, 64), registry=self.registry)
        self.latency = Histogram("engram_worker_request_seconds", "Request latency", ["endpoint"],
                                 registry=self.registry)
        self.ready = Gauge("engram_worker_ready", "1 when the models are loaded",
                           registry=self.registry)
        self.reranker_available = Gauge("engram_worker_reranker_available",
                                        "1 when a cross-encoder is loaded",
                                        registry=self.registry)


def _texts(body: dict[str, Any], key: str, settings: Settings) -> list[str]:
    if key not in body:
        raise PayloadError(f"the body needs {key!r}: a list of texts")
    texts = body[key]
    if not isinstance(texts, list):
        raise PayloadError(f"{key!r} must be a list of texts, not {type(texts).__name__}")
    if not texts:
        raise PayloadError(f"{key!r} must not be empty")
    if len(texts) > settings.worker_max_request_texts:
        raise PayloadError(f"{key!r} holds {len(texts)} texts; the limit per request is "
                           f"{settings.worker_max_request_texts}", 413)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise PayloadError(f"{key}[{i}] must be text, not {type(t).__name__}")
        if not t.strip():
            raise PayloadError(f"{key}[{i}] is empty")
        if len(t) > settings.worker_max_text_chars:
            raise PayloadError(f"{key}[{i}] has {len(t)} characters; the limit is "
                               f"{settings.worker_max_text_chars}", 413)
    return texts


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise PayloadError(f"the body is not JSON: {exc}", 400) from exc
    if not isinstance(body, dict):
        raise PayloadError("the body must be a JSON object")
    return body


@dataclass
class WorkerState:
    settings: Settings
    metrics: _Metrics
    embedder: Embedder | None = None
    reranker: Reranker | None = None
    embed_batcher: MicroBatcher | None = None
    rerank_batcher: MicroBatcher | None = None
    load_error: str | None = None


def create_app(settings: Settings, *, embedder: Embedder | None = None,
               reranker: Reranker | None = None) -> Starlette:
    """The worker's ASGI app; models load at startup unless given."""
    metrics = _Metrics()
    state = WorkerState(settings, metrics, embedder, reranker)

    def run_embed(items: list[tuple[str, str | None, str]]) -> list[list[float]]:
        assert state.embedder is not None
        texts = [state.embedder.format_query(t, a) if kind == "query"
                 else state.embedder.format_passage(t) for t, a, kind in items]
        # Queries and passages of different requests share one model batch.
        vectors = state.embedder.embed_formatted(texts)
        metrics.items.labels("embed").inc(len(items))
        return [v.tolist() for v in vectors]

    def run_rerank(items: list[tuple[str, Sequence[str]]]) -> list[Any]:
        assert state.reranker is not None
        out = state.reranker.score_many(items)
        metrics.items.labels("rerank").inc(sum(len(p) for _, p in items))
        return out

    def observer(kind: str) -> Callable[[int, int], None]:
        def observe(n_items: int, n_requests: int) -> None:
            metrics.batch_items.labels(kind).observe(n_items)
            metrics.batch_requests.labels(kind).observe(n_requests)
        return observe

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            if state.embedder is None:
                state.embedder = await asyncio.to_thread(Embedder.from_settings, settings)
            if state.reranker is None:
                state.reranker = await asyncio.to_thread(Reranker.from_settings, settings)
        except EngramError as exc:
            state.load_error = str(exc)
        wait_s = settings.worker_batch_wait_ms / 1000.0
        state.embed_batcher = MicroBatcher("embed", run_embed, settings.worker_max_batch, wait_s,
                                           observer("embed"))
        # A rerank item is a whole request (query + passages); windows batch inside.
        state.rerank_batcher = MicroBatcher("rerank", run_rerank, 8, wait_s, observer("rerank"))
        state.embed_batcher.start()
        state.rerank_batcher.start()
        metrics.ready.set(1 if state.embedder is not None else 0)
        metrics.reranker_available.set(1 if state.reranker and state.reranker.available else 0)
        app.state.worker = state
        try:
            yield
        finally:
            await state.embed_batcher.stop()
            await state.rerank_batcher.stop()

    def answer(endpoint: str, status: int, body: dict[str, Any]) -> JSONResponse:
        metrics.requests.labels(endpoint, str(status)).inc()
        return JSONResponse(body, status_code=status)

    async def embed(request: Request) -> JSONResponse:
        started = time.monotonic()
        try:
            if state.embedder is None or state.embed_batcher is None:
                return answer("embed", 503, {"error": state.load_error or "models are loading",
                                             "code": ModelUnavailable.code})
            body = await _json(request)
            kind = body.get("kind", "passage")
            if kind not in ("passage", "query"):
                raise PayloadError(f"kind must be 'passage' or 'query', not {kind!r}")
            asker = body.get("asker")
            if asker is not None and not isinstance(asker, str):
                raise PayloadError(f"asker must be text, not {type(asker).__name__}")
            wanted = body.get("model")
            if wanted is not None and not isinstance(wanted, str):
                raise PayloadError(f"model must be text, not {type(wanted).__name__}")
            if wanted is not None and wanted != state.embedder.model_name:
                # The caller's vectors must come from the active model; another one's
                # would be silently wrong, so the answer is a refusal it can name.
                return answer("embed", 409, {
                    "error": f"this worker embeds with {state.embedder.model_name}, not "
                             f"{wanted[:200]}; restart `engram worker serve` with "
                             f"ENGRAM_EMBEDDING_MODEL={wanted[:200]}",
                    "code": ModelMismatch.code})
            texts = _texts(body, "texts", settings)
            vectors = await state.embed_batcher.submit([(t, asker, kind) for t in texts])
            return answer("embed", 200, {"model": state.embedder.model_name,
                                         "dimension": state.embedder.dimension,
                                         "vectors": vectors})
        except PayloadError as exc:
            return answer("embed", exc.status, {"error": exc.message, "code": exc.code})
        finally:
            metrics.latency.labels("embed").observe(time.monotonic() - started)

    async def rerank(request: Request) -> JSONResponse:
        started = time.monotonic()
        try:
            if state.reranker is None or state.rerank_batcher is None:
                return answer("rerank", 503, {"error": state.load_error or "models are loading",
                                              "code": ModelUnavailable.code})
            body = await _json(request)
            query = body.get("query")
            if not isinstance(query, str) or not query.strip():
                raise PayloadError("'query' must be non-empty text")
            if len(query) > settings.worker_max_text_chars:
                raise PayloadError(f"'query' has {len(query)} characters; the limit is "
                                   f"{settings.worker_max_text_chars}", 413)
            passages = _texts(body, "passages", settings)
            if not state.reranker.available:
                return answer("rerank", 503, {"error": state.reranker.note or "no reranker",
                                              "code": ModelUnavailable.code})
            [outcome] = await state.rerank_batcher.submit([(query, passages)])
            return answer("rerank", 200, {"model": state.reranker.model_name,
                                          "scores": outcome.scores, "windows": outcome.windows,
                                          "notes": outcome.notes})
        except PayloadError as exc:
            return answer("rerank", exc.status, {"error": exc.message, "code": exc.code})
        finally:
            metrics.latency.labels("rerank").observe(time.monotonic() - started)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        if state.embedder is None:
            return JSONResponse({"ready": False, "error": state.load_error or "models are loading"},
                                status_code=503)
        rr = state.reranker
        return JSONResponse({
            "ready": True, "embedding_model": state.embedder.model_name,
            "dimension": state.embedder.dimension, "device": state.embedder.device.device,
            "reranker_model": rr.model_name if rr else None,
            "reranker_available": bool(rr and rr.available),
            "reranker_note": rr.note if rr else None,
        })

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/embed", embed, methods=["POST"]),
        Route("/rerank", rerank, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
    ], lifespan=lifespan)
