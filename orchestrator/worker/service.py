"""One interface to the models, whether they run in this process or in a served worker.

The API and recall call ``model_service(settings)``: with ``ENGRAM_WORKER_URL``
unset (the embedded default) models load here, so one machine needs no second
process; with it set, calls go over HTTP to ``engram worker serve``, which
batches concurrent callers together. Both return the same types, and the
served one maps the server's 4xx answers back to ``BadInput``, so callers
cannot tell them apart except by speed.

``model_service_for(settings, model)`` is the same for one *registered* model:
recall asks for the active one. In this process that is the configured model
when the registry agrees with the settings, else the registered model loaded by
name (``Embedder.for_model``); a served worker is asked to embed with that model
by name and refuses (``ModelMismatch``) when it runs another.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

import numpy as np

from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError
from orchestrator.worker.embedder import (
    Embedder,
    ModelUnavailable,
    Reranker,
    RerankOutcome,
    Vectors,
)
from orchestrator.worker.registry import ModelMismatch, RegisteredModel


class ModelService(Protocol):
    model_name: str
    dimension: int

    @property
    def reranker_available(self) -> bool: ...

    @property
    def reranker_note(self) -> str | None: ...

    def embed_passages(self, texts: Sequence[str]) -> Vectors: ...

    def embed_query(self, question: str, asker: str | None = None) -> Vectors: ...

    def rerank(self, query: str, passages: Sequence[str]) -> RerankOutcome: ...


class InProcessService:
    """Models loaded in this process (cached per process by ``from_settings``)."""

    def __init__(self, embedder: Embedder, reranker: Reranker) -> None:
        self.embedder = embedder
        self.reranker = reranker
        self.model_name = embedder.model_name
        self.dimension = embedder.dimension

    @classmethod
    def from_settings(cls, settings: Settings) -> InProcessService:
        return cls(Embedder.from_settings(settings), Reranker.from_settings(settings))

    @property
    def reranker_available(self) -> bool:
        return self.reranker.available

    @property
    def reranker_note(self) -> str | None:
        return self.reranker.note

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self.embedder.embed_passages(texts)

    def embed_query(self, question: str, asker: str | None = None) -> Vectors:
        return self.embedder.embed_query(question, asker)

    def rerank(self, query: str, passages: Sequence[str]) -> RerankOutcome:
        return self.reranker.score_detailed(query, passages)


class HttpService:
    """A served worker (``engram worker serve``) behind the same interface."""

    def __init__(self, url: str, *, timeout_s: float = 120.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, timeout=timeout_s)
        info = self._get("/readyz")
        self.model_name = str(info["embedding_model"])
        self.dimension = int(info["dimension"])
        self._reranker_available = bool(info["reranker_available"])
        self._reranker_note = info.get("reranker_note")

    def close(self) -> None:
        self._client.close()

    @property
    def reranker_available(self) -> bool:
        return self._reranker_available

    @property
    def reranker_note(self) -> str | None:
        return None if self._reranker_note is None else str(self._reranker_note)

    def _answer(self, response: Any) -> dict[str, Any]:
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            body = {"error": response.text[:500]}
        if response.status_code < 400:
            return body
        message = str(body.get("error", f"HTTP {response.status_code}"))
        if response.status_code == 503 and body.get("code") == ModelUnavailable.code:
            raise ModelUnavailable(message)
        if response.status_code == 409 and body.get("code") == ModelMismatch.code:
            raise ModelMismatch(message)
        if 400 <= response.status_code < 500:
            raise BadInput(message)
        raise EngramError(f"the served worker at {self.url} failed: {message}")

    def _get(self, path: str) -> dict[str, Any]:
        import httpx

        try:
            return self._answer(self._client.get(path))
        except httpx.HTTPError as exc:
            raise EngramError(f"cannot reach the served worker at {self.url}: {exc}") from exc

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            return self._answer(self._client.post(path, json=payload))
        except httpx.HTTPError as exc:
            raise EngramError(f"cannot reach the served worker at {self.url}: {exc}") from exc

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        body = self._post("/embed", {"texts": list(texts), "kind": "passage"})
        return np.asarray(body["vectors"], dtype=np.float32)

    def embed_query(self, question: str, asker: str | None = None, *,
                    model: str | None = None) -> Vectors:
        """``model``: the registered model the vector must come from (the worker refuses
        with ``ModelMismatch`` when it runs another)."""
        payload: dict[str, Any] = {"texts": [question], "kind": "query", "asker": asker}
        if model is not None:
            payload["model"] = model
        body = self._post("/embed", payload)
        result: Vectors = np.asarray(body["vectors"][0], dtype=np.float32)
        return result

    def rerank(self, query: str, passages: Sequence[str]) -> RerankOutcome:
        if len(passages) == 0:
            return RerankOutcome([], [], [])
        body = self._post("/rerank", {"query": query, "passages": list(passages)})
        return RerankOutcome([float(s) for s in body["scores"]],
                             [int(w) for w in body["windows"]], [str(n) for n in body["notes"]])


class _PinnedHttpService:
    """A served worker asked for one registered model's vectors on every call."""

    def __init__(self, service: HttpService, model: RegisteredModel) -> None:
        self._service = service
        self.model_name = model.name
        self.dimension = model.dimension

    @property
    def reranker_available(self) -> bool:
        return self._service.reranker_available

    @property
    def reranker_note(self) -> str | None:
        return self._service.reranker_note

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        if self._service.model_name != self.model_name:
            raise ModelMismatch(f"the served worker at {self._service.url} embeds with "
                                f"{self._service.model_name}, not {self.model_name}")
        return self._service.embed_passages(texts)

    def embed_query(self, question: str, asker: str | None = None) -> Vectors:
        return self._service.embed_query(question, asker, model=self.model_name)

    def rerank(self, query: str, passages: Sequence[str]) -> RerankOutcome:
        return self._service.rerank(query, passages)


@lru_cache(maxsize=4)
def _http(url: str) -> HttpService:
    return HttpService(url)


def model_service_for(settings: Settings, model: RegisteredModel) -> ModelService:
    """The models for the registered ``model``: the served worker (pinned to it by name) when
    ``ENGRAM_WORKER_URL`` is set, else loaded in this process."""
    if settings.worker_url:
        return _PinnedHttpService(_http(settings.worker_url), model)
    if (model.name == settings.embedding_model
            and (model.query_prefix, model.passage_prefix)
            == (settings.embedding_query_prefix, settings.embedding_passage_prefix)):
        default = InProcessService.from_settings(settings)
        if default.model_name == model.name and default.dimension == model.dimension:
            return default
    return InProcessService(Embedder.for_model(settings, model), Reranker.from_settings(settings))


def model_service(settings: Settings) -> ModelService:
    """The served worker when ``ENGRAM_WORKER_URL`` is set, else models in this process."""
    if settings.worker_url:
        return _http(settings.worker_url)
    return InProcessService.from_settings(settings)
