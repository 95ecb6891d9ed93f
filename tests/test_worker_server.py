"""The served worker over real HTTP (uvicorn on a free port): batching, errors, parity."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from orchestrator.config import Settings
from orchestrator.db.server import free_port
from orchestrator.errors import BadInput
from orchestrator.worker.embedder import Embedder, ModelUnavailable, Reranker
from orchestrator.worker.server import create_app
from orchestrator.worker.service import HttpService, InProcessService, model_service
from tests.support.worker import build_tiny_cross_encoder


class Served:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.app = app

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the served worker did not become ready")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tiny = build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny") / "ce")
    return Settings(reranker_model="tests/tiny", reranker_model_path=tiny,
                    worker_batch_wait_ms=40, worker_max_batch=64, worker_max_request_texts=8,
                    worker_max_text_chars=2000)


@pytest.fixture(scope="module")
def served(settings: Settings) -> Iterator[Served]:
    with Served(create_app(settings)) as s:
        yield s


def _metric(text: str, name: str, labels: str) -> float:
    """A sample's value; 0 before a labelled metric's first observation."""
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_health_readiness_and_metrics(served: Served) -> None:
    assert httpx.get(served.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(served.url + "/readyz").json()
    assert ready["ready"] and ready["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert ready["dimension"] == 384 and ready["reranker_available"] is True
    metrics = httpx.get(served.url + "/metrics")
    assert metrics.status_code == 200 and "engram_worker_ready 1.0" in metrics.text


def test_concurrent_requests_share_model_batches(served: Served, settings: Settings) -> None:
    before = httpx.get(served.url + "/metrics").text
    batches_before = _metric(before, "engram_worker_batch_items_count", 'kind="embed"')
    texts = [f"concurrent request number {i}" for i in range(24)]
    barrier = threading.Barrier(24)

    def one(t: str) -> list[float]:
        barrier.wait()
        r = httpx.post(served.url + "/embed", json={"texts": [t]}, timeout=60)
        assert r.status_code == 200, r.text
        return list(r.json()["vectors"][0])

    with ThreadPoolExecutor(24) as pool:
        vectors = list(pool.map(one, texts))
    after = httpx.get(served.url + "/metrics").text
    batches = _metric(after, "engram_worker_batch_items_count", 'kind="embed"') - batches_before
    state = served.app.state.worker
    sizes = state.embed_batcher.batch_sizes[-int(batches):]
    assert sum(sizes) == 24
    assert batches < 24 and max(sizes) > 1, f"24 one-text requests ran as batches {sizes}"
    direct = Embedder.from_settings(settings).embed_passages(texts)
    np.testing.assert_allclose(np.array(vectors), direct, atol=1e-5)


@pytest.mark.parametrize(("payload", "status", "message"), [
    ({"texts": []}, 422, "'texts' must not be empty"),
    ({"texts": ["a"] * 9}, 413, "holds 9 texts; the limit per request is 8"),
    ({"texts": ["fine", 7]}, 422, "texts[1] must be text, not int"),
    ({"texts": ["x" * 2001]}, 413, "texts[0] has 2001 characters; the limit is 2000"),
    ({"texts": "one string"}, 422, "'texts' must be a list of texts, not str"),
    ({"words": ["a"]}, 422, "the body needs 'texts'"),
    ({"texts": ["a"], "kind": "document"}, 422, "kind must be 'passage' or 'query'"),
    ({"texts": ["  "]}, 422, "texts[0] is empty"),
])
def test_bad_embed_payloads_get_clear_4xx(served: Served, payload: Any, status: int,
                                          message: str) -> None:
    r = httpx.post(served.url + "/embed", json=payload)
    assert r.status_code == status
    assert message in r.json()["error"]


def test_not_json_and_bad_rerank_payloads(served: Served) -> None:
    r = httpx.post(served.url + "/embed", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    r = httpx.post(served.url + "/rerank", json={"query": "", "passages": ["p"]})
    assert r.status_code == 422 and "'query' must be non-empty text" in r.json()["error"]
    r = httpx.post(served.url + "/rerank", json={"query": "q", "passages": []})
    assert r.status_code == 422 and "'passages' must not be empty" in r.json()["error"]


def test_rerank_over_http_matches_in_process(served: Served, settings: Settings) -> None:
    passages = ["apples and pears", "a train journey " * 60, "fruit salad"]
    r = httpx.post(served.url + "/rerank", json={"query": "fruit", "passages": passages})
    assert r.status_code == 200, r.text
    body = r.json()
    local = Reranker.from_settings(settings).score_detailed("fruit", passages)
    np.testing.assert_allclose(body["scores"], local.scores, atol=1e-4)
    assert body["windows"] == local.windows and body["windows"][1] > 1
    assert body["notes"] == local.notes


def test_http_service_and_in_process_service_agree(served: Served, settings: Settings) -> None:
    remote = model_service(Settings(worker_url=served.url))
    assert isinstance(remote, HttpService)
    local = model_service(settings)
    assert isinstance(local, InProcessService)
    assert remote.model_name == local.model_name and remote.dimension == local.dimension
    np.testing.assert_allclose(remote.embed_query("who leads?", "ann"),
                               local.embed_query("who leads?", "ann"), atol=1e-5)
    np.testing.assert_allclose(remote.embed_passages(["a", "b"]), local.embed_passages(["a", "b"]),
                               atol=1e-5)
    assert remote.rerank("q", ["p1", "p2"]).windows == [1, 1]
    with pytest.raises(BadInput, match="limit per request is 8"):
        remote.embed_passages(["t"] * 9)


def test_absent_reranker_is_a_503_with_the_reason(settings: Settings, tmp_path: Path) -> None:
    absent = Reranker(model_name="BAAI/bge-reranker-v2-m3",
                      note="reranker model BAAI/bge-reranker-v2-m3 is not on this machine")
    app = create_app(settings, embedder=Embedder.from_settings(settings), reranker=absent)
    with Served(app) as s:
        r = httpx.post(s.url + "/rerank", json={"query": "q", "passages": ["p"]})
        assert r.status_code == 503 and "not on this machine" in r.json()["error"]
        assert httpx.get(s.url + "/readyz").json()["reranker_available"] is False
        remote = HttpService(s.url)
        assert not remote.reranker_available
        with pytest.raises(ModelUnavailable, match="not on this machine"):
            remote.rerank("q", ["p"])
        remote.close()
