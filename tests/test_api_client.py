"""The in-process client and the real ``engram serve`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from orchestrator.db.server import free_port
from orchestrator.errors import BadInput, Conflict, Forbidden, NotFound, Unauthenticated
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
    with pytest.raises(NotFound, match="that you can read"):
        intruder.document_by_id(view.id)
    with pytest.raises(NotFound):
        intruder.archive(view.id)
    reader = client(api_server, app_engine, api_server.token(t.org_id, "r", ("read:team",)))
    with pytest.raises(Forbidden):
        reader.archive(view.id)
    assert engram.delete_document("notes", "c.md") == view.id
    with pytest.raises(Unauthenticated):
        client(api_server, app_engine, "not.a.token")


def test_client_knowledge_memory_and_audit(api_server: ApiServer, app_engine: Engine,  # noqa: F811
                                           tenant_factory: Tenants, admin_engine: Engine) -> None:
    from tests.support.knowledge import counts, define_shape

    t, other = tenant_factory("team"), tenant_factory("team")
    define_shape(admin_engine, t.id, "lives_in", max_count=1)
    define_shape(admin_engine, t.id, "level", allowed_values=["junior", "senior"])
    alice = client(api_server, app_engine, api_server.token(t.org_id, "alice", ("write:team",)))
    bruno = client(api_server, app_engine, api_server.token(t.org_id, "bruno", ("write:team",)))
    ann = alice.resolve_entity("person", "Ann", ["team"])
    assert alice.entity("person", "ann") == ann and alice.entity("person", "nobody") is None
    acme = alice.resolve_entity("org", "Acme", ["team"])
    page = alice.entities(entity_type="person")
    assert [v.name for _, v in page.items] == ["Ann"] and not page.has_next_page
    first = alice.entities(first=1)
    assert [v.name for _, v in first.items] == ["Acme"] and first.has_next_page
    second = alice.entities(first=1, after=first.end_cursor)
    assert [v.name for _, v in second.items] == ["Ann"] and second.has_previous_page
    assert alice.entity_by_id(str(ann)).scopes[0].name == "team"

    old = alice.assert_fact(ann, "lives_in", "Ann lives in Porto", ["team"], value="Porto")
    new = bruno.assert_fact(ann, "lives_in", "Ann lives in Braga", ["team"], value="Braga")
    keyed = [alice.assert_fact(acme, "headcount", f"Acme has {n}", ["team"], value=n,
                               fact_key="acme.headcount", as_of=as_of, authority=5)
             for as_of, n in (("2025-01-01T00:00:00+00:00", 40), ("2026-01-01T00:00:00+00:00", 55))]
    assert old.claim_id and new.claim_id and all(k.claim_id for k in keyed)
    assert [(f.object_value, f.fact_key) for f in alice.facts(acme)] == [("55", "acme.headcount")]
    held = alice.assert_fact(ann, "level", "Ann is a wizard", ["team"], value="wizard")
    [quarantined] = alice.quarantine()
    assert held.quarantined and quarantined.id == held.quarantine_id and quarantined.reasons
    [conflict] = bruno.conflicts(status="open")
    assert {conflict.claim_a, conflict.claim_b} == {old.claim_id, new.claim_id}
    assert bruno.resolve_conflict(str(conflict.id), "newest_wins") == new.claim_id
    with pytest.raises(Conflict, match="already"):
        bruno.resolve_conflict(conflict.id, "keep_both")
    assert [f.object_value for f in alice.facts(ann)] == ["Braga"]
    with pytest.raises(BadInput, match="first must be between 1 and 100"):
        alice.facts(ann, first=0)
    # A filter value no row can hold is refused by name, not answered with an empty list (or,
    # for the conflicts' enum, with the database's type error).
    with pytest.raises(BadInput, match="status 'weird' is not one of open, resolved, disputed"):
        bruno.conflicts(status="weird")
    with pytest.raises(BadInput, match="status 'gone' is not one of held, released, discarded"):
        alice.quarantine(status="gone")
    with pytest.raises(BadInput, match="state 'bogus' is not one of Active, Waiting, Done"):
        alice.documents(state="bogus")
    assert alice.quarantine(status="released") == [] and alice.documents(state="Done").items == []

    note = alice.remember("s1", "User prefers tea.", ["team"], ttl_seconds=600)
    assert alice.working_memory("s1") == ["User prefers tea."] and bruno.working_memory("s1") == []
    with pytest.raises(BadInput, match="ttl must be a positive duration"):
        alice.remember("s1", "x", ["team"], ttl_seconds=0)
    decision = alice.record_decision("infra", "Pick a database", "RLS and one owner", 0.8, ["team"],
                                     outcome="PostgreSQL")
    now = datetime.now(UTC)
    episode = alice.record_episode("s1", "Talked about tea.", now - timedelta(hours=1), now, ["team"],
                                   turn_count=3)
    assert note and decision and episode
    assert alice.mark_used([("memory.working_memory", note)], claim_ids=[str(new.claim_id)]) == 2
    with pytest.raises(BadInput, match="give the items"):
        alice.mark_used()

    intruder = client(api_server, app_engine, api_server.token(other.org_id, "m", ("write:team",)))
    before = counts(admin_engine, t.id)
    for call in (lambda: intruder.facts(ann), lambda: intruder.entity_by_id(ann),
                 lambda: intruder.resolve_conflict(conflict.id, "keep_both"),
                 lambda: intruder.mark_used(claim_ids=[new.claim_id]),
                 lambda: intruder.assert_fact(ann, "nickname", "x", ["team"], value="x")):
        with pytest.raises(NotFound):
            call()
    assert counts(admin_engine, t.id) == before

    with pytest.raises(Forbidden, match="engram:auditor"):
        alice.verify_chain()
    auditor = client(api_server, app_engine,
                     api_server.token(t.org_id, "audrey", ("read:team", "engram:auditor")))
    try:
        report = auditor.verify_chain()
        assert report.ok and report.checked > 5 and report.row_problems == []
        lineage = auditor.provenance("knowledge.fact_claim", {"id": str(new.claim_id)})
        assert lineage.nodes[0].event_seqs and lineage.proven
        stranger = client(api_server, app_engine,
                          api_server.token(other.org_id, "audrey", ("read:team", "engram:auditor")))
        with pytest.raises(NotFound):
            stranger.provenance("knowledge.fact_claim", {"id": str(new.claim_id)})
    finally:
        auditor.close()


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
