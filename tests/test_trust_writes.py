"""Writes tell a caller nothing about rows it cannot read, and a refused write is FORBIDDEN with
nothing changed (issue 16, leaks 3 and 4). Over real HTTP with verified tokens."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server, error_of  # noqa: F401

Tenants = Callable[..., TenantFixture]

UPSERT = """mutation($i: DocumentInput!) { upsertDocument(input: $i) { created changed
  document { path scopes { name } } } }"""
FACT = "mutation($i: FactInput!) { assertFact(input: $i) { quarantined reasons } }"
ENTITY = 'mutation($n: String!, $s: [String!]!) { resolveEntity(type: "person", name: $n, scopes: $s) }'
# What PostgreSQL would have said: never shown to a client.
INTERNALS = re.compile(r"uq_|ix_|ck_|pk_|fk_|constraint|violates|row-level|policy|relation \"", re.I)


def doc(path: str, scopes: list[str], body: str = "Body text.") -> dict[str, Any]:
    return {"collection": "notes", "path": path, "title": path, "body": body, "scopes": scopes}


def snapshot(admin_engine: Engine, t: TenantFixture) -> dict[str, Any]:
    """Every row of the tenant in the tables a client write can touch, as the superuser sees it."""
    tables = ("sources.documents", "sources.chunks", "knowledge.entities", "knowledge.fact_claim",
              "knowledge.conflicts", "memory.working_memory", "provenance.events")
    with admin_engine.connect() as conn:
        return {tb: sorted(str(r) for r in conn.execute(text(
            f"select * from {tb} where tenant_id = :t"), {"t": t.id}).all()) for tb in tables}


def test_a_hidden_document_path_answers_as_a_free_path(api_server: ApiServer,  # noqa: F811
                                                       tenant_factory: Tenants,
                                                       admin_engine: Engine) -> None:
    t = tenant_factory("board", "hr")
    hr = api_server.token(t.org_id, "h", ("write:hr",))
    board = api_server.token(t.org_id, "b", ("write:board",))
    api_server.gql(hr, UPSERT, {"i": doc("taken.md", ["hr"], "HR only.")})
    at_hidden = api_server.post(board, UPSERT, {"i": doc("taken.md", ["board"])}).json()
    at_free = api_server.post(board, UPSERT, {"i": doc("free.md", ["board"])}).json()
    shape = {"upsertDocument": {"created": True, "changed": True,
                                "document": {"path": "taken.md", "scopes": [{"name": "board"}]}}}
    assert at_hidden == {"data": shape}
    assert at_free["data"]["upsertDocument"]["document"]["path"] == "free.md"
    # The board writer reads its own document at the path; the hr reader still reads its own.
    mine = api_server.gql(board, '{ document(collection: "notes", path: "taken.md") { body } }')
    theirs = api_server.gql(hr, '{ document(collection: "notes", path: "taken.md") { body } }')
    assert mine == {"document": {"body": "Body text."}} and theirs == {"document": {"body": "HR only."}}
    # Deleting at a hidden path and at a path nobody uses: the same answer, nothing deleted.
    before = snapshot(admin_engine, t)
    gone = error_of(api_server.post(hr, 'mutation { deleteDocument(collection: "notes", '
                                        'path: "free.md") { id } }'))
    nowhere = error_of(api_server.post(hr, 'mutation { deleteDocument(collection: "notes", '
                                           'path: "never.md") { id } }'))
    assert gone["extensions"]["code"] == nowhere["extensions"]["code"] == "NOT_FOUND"
    assert gone["message"].replace("free.md", "never.md") == nowhere["message"]
    assert snapshot(admin_engine, t) == before


def test_a_hidden_keyed_fact_answers_as_a_free_key(api_server: ApiServer,  # noqa: F811
                                                   tenant_factory: Tenants) -> None:
    t = tenant_factory("board", "hr")
    hr = api_server.token(t.org_id, "h", ("write:hr",))
    board = api_server.token(t.org_id, "b", ("write:board",))
    shared = api_server.gql(hr, ENTITY, {"n": "Acme", "s": ["hr"]})["resolveEntity"]
    mine = api_server.gql(board, ENTITY, {"n": "Acme", "s": ["board"]})["resolveEntity"]
    # The same name resolved in another audience is another entity, never the hidden one.
    assert mine != shared

    def keyed(subject: str, scopes: list[str], key: str) -> dict[str, Any]:
        return {"subjectId": subject, "predicate": "revenue", "text": f"Revenue {key}.", "value": 1,
                "scopes": scopes, "factKey": key, "asOf": "2024-01-01T00:00:00Z"}

    api_server.gql(hr, FACT, {"i": keyed(shared, ["hr"], "acme.revenue")})
    at_hidden = api_server.post(board, FACT, {"i": keyed(mine, ["board"], "acme.revenue")}).json()
    at_free = api_server.post(board, FACT, {"i": keyed(mine, ["board"], "acme.other")}).json()
    assert at_hidden == at_free == {"data": {"assertFact": {"quarantined": False, "reasons": []}}}
    # A snapshot the writer can read is still one claim: refused, in Engram's words.
    again = api_server.post(board, FACT, {"i": keyed(mine, ["board"], "acme.other")})
    error = error_of(again)
    assert error["extensions"]["code"] == "CONFLICT" and "acme.other" in error["message"]
    assert not INTERNALS.search(again.text)


def test_refused_overwrites_and_moves_are_forbidden_and_change_nothing(
        api_server: ApiServer, tenant_factory: Tenants, admin_engine: Engine) -> None:  # noqa: F811
    t = tenant_factory("board", "hr")
    hr = api_server.token(t.org_id, "h", ("write:hr",))
    board = api_server.token(t.org_id, "b", ("write:board",))
    reader = api_server.token(t.org_id, "x", ("read:hr", "write:board"))
    api_server.gql(hr, UPSERT, {"i": doc("hr.md", ["hr"])})
    api_server.gql(board, UPSERT, {"i": doc("board.md", ["board"])})
    before = snapshot(admin_engine, t)
    attempts = {
        "overwrite a row it may only read": (reader, UPSERT, {"i": doc("hr.md", ["hr"], "Edited.")}),
        "move its own row into a scope it may not write": (board, UPSERT,
                                                           {"i": doc("board.md", ["hr"])}),
        "widen its own row into a scope it may not write": (board, UPSERT,
                                                            {"i": doc("board.md", ["board", "hr"])}),
        "delete a row it may only read": (reader, 'mutation { deleteDocument(collection: "notes", '
                                                  'path: "hr.md") { id } }', None),
        "create an entity in a scope it may not write": (board, ENTITY, {"n": "Zed", "s": ["hr"]}),
        "remember into a scope it may not write": (
            board, 'mutation { remember(sessionId: "s", text: "t", scopes: ["hr"]) }', None),
    }
    for what, (token, query, variables) in attempts.items():
        response = api_server.post(token, query, variables)
        error = error_of(response)
        assert error["extensions"]["code"] == "FORBIDDEN", (what, error)
        assert response.status_code == 200 and response.json()["data"] is None, what
        assert not INTERNALS.search(error["message"]), (what, error)
    assert snapshot(admin_engine, t) == before
