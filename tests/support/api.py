"""Fixtures for the API tests: a real uvicorn server on a free port, tokens, an httpx client.

The server trusts a development key made in a temporary ``ENGRAM_HOME``-like
folder; tests mint tokens with it exactly as ``engram auth token`` does, and
forge bad ones by hand (``forge``) to see each refusal.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine

from orchestrator.api.app import create_app
from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.config import Settings
from orchestrator.db.server import free_port


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    """A JWT put together by hand, for tokens no honest library would sign."""
    return ".".join([b64(json.dumps(header).encode()), b64(json.dumps(claims).encode()),
                     b64(signature)])


@dataclass
class ApiServer:
    url: str
    settings: Settings

    def token(self, org: str, user: str = "alice", scopes: tuple[str, ...] = ("read:team",),
              **kw: Any) -> str:
        return mint_token(self.settings, tenant=org, user=user, scopes=list(scopes), **kw)

    def post(self, token: str | None, query: str, variables: dict[str, Any] | None = None,
             **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        # Generous: the first recall loads the embedding model inside the server.
        timeout = kw.pop("timeout", 180)
        return httpx.post(f"{self.url}/graphql", json={"query": query, "variables": variables or {}},
                          headers=headers, timeout=timeout, **kw)

    def gql(self, token: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run an operation that must succeed; returns ``data``."""
        response = self.post(token, query, variables)
        body = response.json()
        assert response.status_code == 200 and "errors" not in body, body
        data: dict[str, Any] = body["data"]
        return data


def api_settings(base: Settings, home: Path, **overrides: Any) -> Settings:
    values = base.model_dump()
    values.update(auth_dev_key_path=home / "auth" / "dev-signing-key.pem", auth_trust_dev_key=True,
                  api_max_body_bytes=256 * 1024, api_max_depth=6, max_document_chars=100_000)
    values.update(overrides)
    return Settings(**values)


@contextmanager
def serve(s: Settings, app_engine: Engine, verifier: TokenVerifier | None = None,
          **app_options: Any) -> Iterator[ApiServer]:
    """uvicorn serving Engram's app in a thread, on a free port, until the block ends
    (``app_options``: ``create_app``'s recaller, health, warmup)."""
    port = free_port()
    config = uvicorn.Config(create_app(s, app_engine, verifier, **app_options), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield ApiServer(f"http://127.0.0.1:{port}", s)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def api_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api-home")


@pytest.fixture(scope="session")
def api_server(settings: Settings, app_engine: Engine, api_home: Path) -> Iterator[ApiServer]:
    s = api_settings(settings, api_home)
    if not s.auth_dev_key_path or not s.auth_dev_key_path.exists():
        create_dev_key(s)
    with serve(s, app_engine) as server:
        yield server


@pytest.fixture(scope="session")
def strict_server(settings: Settings, app_engine: Engine, api_home: Path,
                  api_server: ApiServer) -> Iterator[ApiServer]:
    """Same key, tight limits and production defaults (no introspection, no GraphiQL)."""
    s = api_settings(settings, api_home, api_max_depth=3, api_max_cost=30,
                     env="production")
    with serve(s, app_engine) as server:
        yield server


TokenFor = Callable[..., str]


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The first GraphQL error of a response (which must have one)."""
    body = response.json()
    assert body.get("errors"), body
    error: dict[str, Any] = body["errors"][0]
    return error
