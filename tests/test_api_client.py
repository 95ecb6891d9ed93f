"""The in-process client and the real ``engram serve`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from orchestrator.db.server import free_port
from orchestrator.errors import BadInput, Forbidden, NotFound, Unauthenticated
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server  # noqa: F401

Tenants = Callable[..., TenantFixture]


def client(server: ApiServer, engine: Engine, token: str) -> Engram:
    return Engram(engine, token, server.settings, verifier=TokenVerifier.from_settings(server.settings))


def test_client_calls_match_the_api(api_server: ApiServer, app_engine: Engine,  # noqa: F811
                                    tenant_factory: Tenants) -> None:
    t, other = tenant_factory("team"), tenant_factory("team")
    engram = client(api_server, app_engine, api_server.token(t.org_id, "cli", ("write:team",)))
    result, view = engram.upsert_document("notes", "c.md", "Client doc", "Written in-process.",
                                          scopes=["team"])
    assert result.created and view.author == "cli" and view.scopes[0].can_write
    assert engram.upsert_document("notes", "c.md", "Client doc", "Written in-process.",
                                  scopes=["team"])[0].changed is False
    assert engram.document("notes", "c.md") == engram.document_by_id(view.id)
    assert engram.pin(str(view.id)).pinned
    assert [v.path for _, v in engram.documents().items] == ["c.md"]
    assert [s.name for s in engram.scopes()] == ["team"]
    with pytest.raises(BadInput, match="not a UUID"):
        engram.pin("nope")
    intruder = client(api_server, app_engine, api_server.token(other.org_id, "x", ("write:team",)))
    assert intruder.document_by_id(view.id) is None
    with pytest.raises(NotFound):
        intruder.archive(view.id)
    reader = client(api_server, app_engine, api_server.token(t.org_id, "r", ("read:team",)))
    with pytest.raises(Forbidden):
        reader.archive(view.id)
    assert engram.delete_document("notes", "c.md") == view.id
    with pytest.raises(Unauthenticated):
        client(api_server, app_engine, "not.a.token")


def test_engram_serve_runs_the_api(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                   api_home: Path) -> None:  # noqa: F811
    t = tenant_factory("team")
    s = api_server.settings
    port = free_port()
    env = {**os.environ, "ENGRAM_HOME": str(s.home), "ENGRAM_DB_PORT": str(s.db_port),
           "ENGRAM_DB_NAME": s.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(s.auth_dev_key_path),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true"}
    for name in ("database_url", "app_password"):
        if getattr(s, name):
            env[f"ENGRAM_{name.upper()}"] = getattr(s, name)
    engram = Path(sys.executable).with_name("engram")
    proc = subprocess.Popen([str(engram), "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "engram serve did not start"
            time.sleep(0.2)
        token = api_server.token(t.org_id, "served", ("read:team",))
        response = httpx.post(f"{url}/graphql", json={"query": "{ me { userId orgId } }"},
                              headers={"authorization": f"Bearer {token}"}, timeout=10)
        assert response.json() == {"data": {"me": {"userId": "served", "orgId": t.org_id}}}
        assert httpx.post(f"{url}/graphql", json={"query": "{ me { userId } }"},
                          timeout=10).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=20)
