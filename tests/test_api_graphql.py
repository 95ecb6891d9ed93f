"""Every query and mutation over real HTTP with verified tokens; denials, limits, bad input."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from orchestrator.api.schema import PRINTED_SCHEMA, printed_schema
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server, error_of, strict_server  # noqa: F401

Tenants = Callable[..., TenantFixture]

DOC_FIELDS = """id collection path title kind state area body contentHash author metadata pinned
  snoozedUntil archivedAt createdAt updatedAt chunkCount scopes { name description canRead canWrite }"""

UPSERT = f"""mutation($input: DocumentInput!) {{
  upsertDocument(input: $input) {{ created changed chunks document {{ {DOC_FIELDS} }} }} }}"""


def doc_input(path: str, **over: Any) -> dict[str, Any]:
    value: dict[str, Any] = {"collection": "notes", "path": path, "title": f"Title of {path}",
                             "body": f"The body of {path}. " * 5, "scopes": ["team"]}
    value.update(over)
    return value


def writer(server: ApiServer, t: TenantFixture, user: str = "alice") -> str:
    return server.token(t.org_id, user, (*(f"write:{s}" for s in t.scopes), "openid"))


def upsert(server: ApiServer, token: str, path: str, **over: Any) -> dict[str, Any]:
    data = server.gql(token, UPSERT, {"input": doc_input(path, **over)})
    result: dict[str, Any] = data["upsertDocument"]
    return result


def count(admin_engine: Engine, t: TenantFixture, table: str = "sources.documents") -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text(f"select count(*) from {table} where tenant_id = :t"),
                                {"t": t.id}).scalar_one())


def test_me_and_scopes_come_from_the_token(api_server: ApiServer, tenant_factory: Tenants) -> None:  # noqa: F811
    t = tenant_factory("team", "private")
    token = api_server.token(t.org_id, "bob", ("read:team", "write:private", "openid", "profile",
                                               "engram:auditor"))
    data = api_server.gql(token, "{ me { orgId userId readScopes writeScopes roles } "
                                 "scopes { name description canRead canWrite } }")
    assert data["me"] == {"orgId": t.org_id, "userId": "bob", "readScopes": ["private", "team"],
                          "writeScopes": ["private"], "roles": ["auditor"]}
    assert data["scopes"] == [
        {"name": "private", "description": "The private scope", "canRead": True, "canWrite": True},
        {"name": "team", "description": "The team scope", "canRead": True, "canWrite": False},
    ]


def test_upsert_read_back_and_idempotence(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                          admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    first = upsert(api_server, token, "a.md", kind="project", state="Active", area="Ops",
                   metadata={"source": "test"})
    assert first["created"] and first["changed"] and first["chunks"] >= 1
    doc = first["document"]
    assert doc["author"] == "alice" and doc["kind"] == "project" and doc["state"] == "Active"
    assert doc["metadata"] == {"source": "test"} and doc["chunkCount"] == first["chunks"]
    assert doc["scopes"] == [{"name": "team", "description": "The team scope", "canRead": True,
                              "canWrite": True}]
    again = upsert(api_server, token, "a.md", kind="project", state="Active", area="Ops",
                   metadata={"source": "test"})
    assert (again["created"], again["changed"], again["chunks"]) == (False, False, 0)
    assert again["document"]["updatedAt"] == doc["updatedAt"]
    read = api_server.gql(token, f'{{ document(collection: "notes", path: "a.md") {{ {DOC_FIELDS} }} }}')
    assert read["document"] == doc
    by_id = api_server.gql(token, "query($id: ID!) { documentById(id: $id) { path } }", {"id": doc["id"]})
    assert by_id["documentById"] == {"path": "a.md"}
    assert api_server.gql(token, '{ document(collection: "notes", path: "nope.md") { id } }') == \
        {"document": None}
    assert count(admin_engine, t) == 1


def test_documents_connection_pages_with_cursors(api_server: ApiServer, tenant_factory: Tenants) -> None:  # noqa: F811
    t = tenant_factory("team")
    token = writer(api_server, t)
    for name in ("c.md", "a.md", "b.md", "d.md", "e.md"):
        upsert(api_server, token, name)
    q = """query($after: String) { documents(first: 2, after: $after) {
             edges { cursor node { path } }
             pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }"""
    seen, after, infos = [], None, []
    while True:
        page = api_server.gql(token, q, {"after": after})["documents"]
        seen += [e["node"]["path"] for e in page["edges"]]
        info = page["pageInfo"]
        infos.append(info)
        assert (info["startCursor"], info["endCursor"]) == \
            (page["edges"][0]["cursor"], page["edges"][-1]["cursor"])
        if not info["hasNextPage"]:
            break
        after = info["endCursor"]
    assert seen == ["a.md", "b.md", "c.md", "d.md", "e.md"]
    assert [(i["hasPreviousPage"], i["hasNextPage"]) for i in infos] == \
        [(False, True), (True, True), (True, False)]
    empty = api_server.gql(token, q, {"after": infos[-1]["endCursor"]})["documents"]
    assert empty["edges"] == [] and empty["pageInfo"] == {
        "hasNextPage": False, "hasPreviousPage": True, "startCursor": None, "endCursor": None}
    response = api_server.post(token, '{ documents(after: "!!garbage") { edges { cursor } } }')
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"
    response = api_server.post(token, "{ documents(first: 200) { edges { cursor } } }")
    assert "first must be between 1 and" in error_of(response)["message"]


def test_pin_snooze_archive_and_delete(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                       admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    ids = {p: upsert(api_server, token, p)["document"]["id"] for p in ("p.md", "s.md", "x.md")}
    pinned = api_server.gql(token, "mutation($id: ID!) { pin(id: $id) { pinned } }", {"id": ids["p.md"]})
    assert pinned == {"pin": {"pinned": True}}
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    snoozed = api_server.gql(token, "mutation($id: ID!, $u: DateTime) { snooze(id: $id, until: $u) "
                                    "{ snoozedUntil } }", {"id": ids["s.md"], "u": later})
    assert datetime.fromisoformat(snoozed["snooze"]["snoozedUntil"]) == datetime.fromisoformat(later)
    archived = api_server.gql(token, "mutation($id: ID!) { archive(id: $id) { archivedAt } }",
                              {"id": ids["x.md"]})
    assert archived["archive"]["archivedAt"] is not None
    listed = api_server.gql(token, "{ documents { edges { node { path pinned } } } }")
    assert [e["node"] for e in listed["documents"]["edges"]] == [{"path": "p.md", "pinned": True}]
    hidden = api_server.gql(token, "{ documents(includeHidden: true) { edges { node { path } } } }")
    assert len(hidden["documents"]["edges"]) == 3
    restored = api_server.gql(token, "mutation($id: ID!) { archive(id: $id, archived: false) "
                                     "{ archivedAt } }", {"id": ids["x.md"]})
    assert restored == {"archive": {"archivedAt": None}}
    response = api_server.post(token, "mutation($id: ID!, $u: DateTime) { snooze(id: $id, until: $u) "
                                      "{ id } }", {"id": ids["s.md"], "u": "2030-01-01T00:00:00"})
    assert "time zone" in error_of(response)["message"]
    deleted = api_server.gql(token, 'mutation { deleteDocument(collection: "notes", path: "x.md") { id } }')
    assert deleted == {"deleteDocument": {"id": ids["x.md"]}}
    assert count(admin_engine, t) == 2
    response = api_server.post(token, 'mutation { deleteDocument(collection: "notes", path: "x.md") '
                                      "{ id } }")
    assert error_of(response)["extensions"]["code"] == "NOT_FOUND"


def test_cross_tenant_ids_are_not_found_never_the_row(api_server: ApiServer,  # noqa: F811
                                                      tenant_factory: Tenants,
                                                      admin_engine: Engine) -> None:
    a, b = tenant_factory("team"), tenant_factory("team")
    written = upsert(api_server, writer(api_server, a), "secret.md", body="Tenant A's secret.")
    doc_id = written["document"]["id"]
    intruder = writer(api_server, b, "mallory")
    by_id = "query($id: ID!) { documentById(id: $id) { body } }"
    response = api_server.post(intruder, by_id, {"id": doc_id})
    error = error_of(response)
    assert error["extensions"]["code"] == "NOT_FOUND" and response.json()["data"] == {"documentById": None}
    assert "Tenant A" not in response.text
    # The same answer as for an id that exists nowhere.
    nowhere = str(uuid.uuid4())
    missing = error_of(api_server.post(intruder, by_id, {"id": nowhere}))
    assert missing["message"].replace(nowhere, doc_id) == error["message"]
    for op in ("pin(id: $id) { body }", "archive(id: $id) { body }", "snooze(id: $id) { body }"):
        response = api_server.post(intruder, f"mutation($id: ID!) {{ {op} }}", {"id": doc_id})
        error = error_of(response)
        assert error["extensions"]["code"] == "NOT_FOUND"
        assert "Tenant A" not in response.text and response.json()["data"] is None
    response = api_server.post(intruder, 'mutation { deleteDocument(collection: "notes", '
                                         'path: "secret.md") { id } }')
    assert error_of(response)["extensions"]["code"] == "NOT_FOUND"
    with admin_engine.connect() as conn:
        row = conn.execute(text("select pinned, archived_at, snoozed_until from sources.documents "
                                "where tenant_id = :t"), {"t": a.id}).one()
    assert tuple(row) == (False, None, None)
    response = api_server.post(intruder, 'query { documentById(id: "not-a-uuid") { id } }')
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"


def test_read_only_token_is_forbidden_to_write(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                               admin_engine: Engine) -> None:
    t = tenant_factory("team")
    doc_id = upsert(api_server, writer(api_server, t), "a.md")["document"]["id"]
    reader = api_server.token(t.org_id, "rita", ("read:team",))
    response = api_server.post(reader, UPSERT, {"input": doc_input("b.md")})
    assert error_of(response)["extensions"]["code"] == "FORBIDDEN"
    response = api_server.post(reader, "mutation($id: ID!) { pin(id: $id) { id } }", {"id": doc_id})
    error = error_of(response)
    assert error["extensions"]["code"] == "FORBIDDEN" and "not pin it" in error["message"]
    assert count(admin_engine, t) == 1


@pytest.mark.parametrize(("over", "message"), [
    ({"title": ""}, "title must not be empty"),
    ({"scopes": []}, "at least one scope"),
    ({"scopes": ["nosuch"]}, "unknown scope(s) in this tenant: nosuch"),
    ({"state": "Sleeping"}, "state 'Sleeping' is not one of"),
    ({"metadata": [1, 2]}, "metadata must be a JSON object"),
    ({"body": "x" * 100_001}, "the limit is 100000"),
    ({"body": "nul \x00 inside"}, "NUL character"),
])
def test_bad_document_input_is_refused_and_nothing_written(
        over: dict[str, Any], message: str, api_server: ApiServer,  # noqa: F811
        tenant_factory: Tenants, admin_engine: Engine) -> None:
    t = tenant_factory("team")
    response = api_server.post(writer(api_server, t), UPSERT, {"input": doc_input("bad.md", **over)})
    error = error_of(response)
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and message in error["message"]
    assert count(admin_engine, t) == 0 and count(admin_engine, t, "sources.chunks") == 0


def test_a_failing_mutation_writes_nothing_of_the_request(api_server: ApiServer,  # noqa: F811
                                                          tenant_factory: Tenants,
                                                          admin_engine: Engine) -> None:
    t = tenant_factory("team")
    q = """mutation($good: DocumentInput!, $bad: DocumentInput!) {
             one: upsertDocument(input: $good) { created }
             two: upsertDocument(input: $bad) { created } }"""
    response = api_server.post(writer(api_server, t), q,
                               {"good": doc_input("good.md"), "bad": doc_input("bad.md", title=" ")})
    body = response.json()
    assert body["data"] is None and body["errors"][0]["path"] == ["two"]
    assert count(admin_engine, t) == 0


def test_oversized_requests_are_refused(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                        admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    big = doc_input("big.md", body="y" * (300 * 1024))
    response = api_server.post(token, UPSERT, {"input": big})
    assert response.status_code == 413 and "limit" in error_of(response)["message"]
    response = api_server.post(token, "{ me { userId } }" + " " * 20_001)
    assert response.status_code == 413 and "the query is" in error_of(response)["message"]

    def chunked() -> Any:
        for _ in range(300):
            yield b"x" * 1024

    response = httpx.post(f"{api_server.url}/graphql", content=chunked(), timeout=30,
                          headers={"authorization": f"Bearer {token}",
                                   "content-type": "application/json"})
    assert response.status_code == 413
    response = httpx.post(f"{api_server.url}/graphql", content=b"{not json", timeout=30,
                          headers={"authorization": f"Bearer {token}",
                                   "content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in error_of(response)["message"]
    assert count(admin_engine, t) == 0


def test_depth_and_cost_limits_refuse_before_running(strict_server: ApiServer,  # noqa: F811
                                                     tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    token = writer(strict_server, t)
    deep = "{ documents { edges { node { scopes { name } } } } }"
    response = strict_server.post(token, deep)
    error = error_of(response)
    assert response.status_code == 400 and error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "5 levels deep; the limit is 3" in error["message"]
    via_fragment = ("{ documents { ...E } } fragment E on DocumentConnection "
                    "{ edges { node { scopes { name } } } }")
    assert "levels deep" in error_of(strict_server.post(token, via_fragment))["message"]
    costly = "{ documents(first: 50) { edges { cursor } } }"
    response = strict_server.post(token, costly)
    assert response.status_code == 400 and "cost" in error_of(response)["message"].lower()
    cheap = strict_server.gql(token, "{ documents(first: 2) { edges { cursor } } }")
    assert cheap == {"documents": {"edges": []}}


def test_introspection_and_graphiql_follow_the_environment(api_server: ApiServer,  # noqa: F811
                                                           strict_server: ApiServer,  # noqa: F811
                                                           tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    q = "{ __schema { queryType { name } } }"
    assert api_server.gql(writer(api_server, t), q) == {"__schema": {"queryType": {"name": "Query"}}}
    response = strict_server.post(writer(strict_server, t), q)
    assert response.status_code == 400 and "introspection" in error_of(response)["message"].lower()
    page = httpx.get(f"{api_server.url}/graphql", timeout=10)
    assert page.status_code == 200 and "graphiql" in page.text.lower()
    assert httpx.get(f"{strict_server.url}/graphql", timeout=10).status_code == 404


def test_printed_schema_is_committed() -> None:
    # Regenerate with `engram serve --write-schema` after reviewing the API change.
    assert PRINTED_SCHEMA.read_text() == printed_schema(), (
        "graphql/schema.printed.graphql is out of date; regenerate it and review the API change")


RECALL = """query($q: String!, $b: Int) { recall(question: $q, budgetTokens: $b) {
  question budgetTokens usedTokens rendered neededTokens receiptId
  evidence { text provenance scopes { name description } source { collection path title } documentId } } }"""


def test_recall_sees_only_what_the_token_may_read(api_server: ApiServer,  # noqa: F811
                                                  tenant_factory: Tenants,
                                                  app_engine: Engine) -> None:
    a, b = tenant_factory("team", "board"), tenant_factory("team")
    wa = writer(api_server, a)
    upsert(api_server, wa, "zebra.md", title="Zebra migration",
           body="The zebra migration report: herds cross the river in March.")
    upsert(api_server, wa, "board.md", title="Board minutes", scopes=["board"],
           body="Board only: the zebra migration budget is secret.")
    upsert(api_server, writer(api_server, b), "other.md", title="Zebra migration elsewhere",
           body="Tenant B's zebra migration notes.")
    team_reader = api_server.token(a.org_id, "rita", ("read:team",))
    result = api_server.gql(team_reader, RECALL, {"q": "When does the zebra migration happen?",
                                                  "b": 500})["recall"]
    paths = {e["source"]["path"] for e in result["evidence"] if e["source"]}
    assert "zebra.md" in paths and "board.md" not in paths and "other.md" not in paths
    first = next(e for e in result["evidence"] if e["source"] and e["source"]["path"] == "zebra.md")
    assert first["scopes"] == [{"name": "team", "description": "The team scope"}]
    assert "March" in result["rendered"] and "secret" not in result["rendered"]
    assert "Tenant B" not in str(result) and 0 < result["usedTokens"] <= 500
    assert result["neededTokens"] is None
    # Too small a budget: nothing served, and the budget that serves the first item.
    tight = api_server.gql(team_reader, RECALL, {"q": "When does the zebra migration happen?",
                                                 "b": 10})["recall"]
    assert tight["evidence"] == [] and tight["rendered"] == "" and tight["neededTokens"] > 10
    assert tight["receiptId"] is None  # nothing served, nothing sealed
    roomy = api_server.gql(team_reader, RECALL, {"q": "When does the zebra migration happen?",
                                                 "b": tight["neededTokens"]})["recall"]
    assert roomy["evidence"] and roomy["neededTokens"] is None
    prepared = api_server.gql(
        team_reader, 'query($q: String!) { memoryPrepare(question: $q, budgetTokens: 500) { '
        "rendered usedTokens receiptId keyedFacts { text } evidence { text kind itemTable itemId } "
        "lessons { text } episodes { text } documents { id title path } } }",
        {"q": "When is the zebra migration?"})["memoryPrepare"]
    assert "March" in prepared["rendered"] and "secret" not in prepared["rendered"]
    assert "## Relevant evidence" in prepared["rendered"] and 0 < prepared["usedTokens"] <= 500
    assert prepared["evidence"][0]["kind"] == "excerpt"
    assert prepared["evidence"][0]["itemTable"] == "sources.chunks"
    assert any(d["path"] for d in prepared["documents"]) and "secret" not in str(prepared)
    # Each answer names its receipt: an auditor proves the rows and the very text served
    # (chained now, not by the server's background thread: twice is a no-op).
    from orchestrator.audit.receipts import chain_receipts

    with app_engine.begin() as conn:
        chain_receipts(conn)
    auditor = api_server.token(a.org_id, "audrey", ("read:team", "engram:auditor"))
    check = """query($id: ID!, $r: String) { verifyReceipt(id: $id, rendered: $r) {
                 askedBy proven ok } }"""
    for answer in (result, prepared):
        proof = api_server.gql(auditor, check, {"id": answer["receiptId"],
                                                "r": answer["rendered"]})["verifyReceipt"]
        assert proof == {"askedBy": "rita", "proven": True, "ok": True}
        assert not api_server.gql(auditor, check, {"id": answer["receiptId"],
                                                   "r": answer["rendered"][:-1]})["verifyReceipt"]["ok"]
        # Another tenant's auditor is told no such receipt exists, as for any unknown id.
        theirs = api_server.token(b.org_id, "otto", ("read:team", "engram:auditor"))
        refused = api_server.post(theirs, check, {"id": answer["receiptId"], "r": None})
        assert error_of(refused)["extensions"]["code"] == "NOT_FOUND"
    response = api_server.post(team_reader, RECALL, {"q": "   "})
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"


def test_verify_chain_is_for_auditors_and_sees_tampering(api_server: ApiServer,  # noqa: F811
                                                         tenant_factory: Tenants,
                                                         admin_engine: Engine) -> None:
    from tests.support.provenance import as_superuser

    t = tenant_factory("team")
    upsert(api_server, writer(api_server, t), "a.md")
    q = "{ verifyChain { ok checked headSeq headHash brokenAt problem rowProblems } }"
    response = api_server.post(writer(api_server, t), q)
    error = error_of(response)
    assert error["extensions"]["code"] == "FORBIDDEN" and "engram:auditor" in error["message"]
    auditor = api_server.token(t.org_id, "audrey", ("read:team", "engram:auditor"))
    report = api_server.gql(auditor, q)["verifyChain"]
    assert report["ok"] and report["checked"] >= 2 and report["rowProblems"] == []
    as_superuser(admin_engine, "update sources.documents set body = 'rewritten' where tenant_id = :t",
                 {"t": t.id})
    report = api_server.gql(auditor, q)["verifyChain"]
    assert not report["ok"] and report["rowProblems"]


def test_provenance_lineage_for_auditors_of_their_own_tenant(api_server: ApiServer,  # noqa: F811
                                                             tenant_factory: Tenants,
                                                             app_engine: Engine) -> None:
    from orchestrator.audit.lineage import record_derivation
    from orchestrator.db.session import bound_session

    t, other = tenant_factory("team"), tenant_factory("team")
    token = writer(api_server, t)
    source = upsert(api_server, token, "source.md")["document"]["id"]
    summary = upsert(api_server, token, "summary.md")["document"]["id"]
    with bound_session(app_engine, t.identity("deriver", write=("team",))) as s:
        record_derivation(s, ("sources.documents", {"id": summary}), [("sources.documents", {"id": source})])
    q = """query($r: JSON!) { provenance(table: "sources.documents", rowId: $r) {
             proven nodes { table rowId eventSeqs }
             edges { relation sourceRowId derivedRowId eventSeq } } }"""
    response = api_server.post(token, q, {"r": {"id": summary}})
    assert error_of(response)["extensions"]["code"] == "FORBIDDEN"
    auditor = api_server.token(t.org_id, "audrey", ("read:team", "engram:auditor"))
    found = api_server.gql(auditor, q, {"r": {"id": summary}})["provenance"]
    assert found["proven"] and [(e["relation"], e["sourceRowId"]) for e in found["edges"]] == \
        [("wasDerivedFrom", {"id": source})]
    assert all(n["eventSeqs"] for n in found["nodes"]) and found["edges"][0]["eventSeq"]
    stranger = api_server.token(other.org_id, "audrey", ("read:team", "engram:auditor"))
    # Another tenant's row is not found: the same answer as a row that exists nowhere.
    foreign = api_server.post(stranger, q, {"r": {"id": summary}})
    error = error_of(foreign)
    assert error["extensions"]["code"] == "NOT_FOUND" and foreign.json()["data"] is None
    nowhere = str(uuid.uuid4())
    missing = error_of(api_server.post(auditor, q, {"r": {"id": nowhere}}))
    assert missing["extensions"]["code"] == "NOT_FOUND"
    assert missing["message"].replace(nowhere, summary) == error["message"]
    assert source not in foreign.text
    response = api_server.post(auditor, q, {"r": [1]})
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"


def _aliased(n: int, field: str, operation: str = "") -> str:
    """One request asking for ``field`` n times under aliases."""
    fields = " ".join(f"f{i}: {field}" for i in range(n))
    return f"{operation} {{ {fields} }}"


@pytest.mark.parametrize(("operation", "table"), [
    (_aliased(500, "verifyChain { ok }"), None),
    (_aliased(100, 'recall(question: "zebra?") { usedTokens }'), None),
    (_aliased(100, 'memoryPrepare(question: "zebra?") { usedTokens }'), None),
    (_aliased(300, 'remember(sessionId: "s", text: "t", scopes: ["team"])', "mutation"),
     "memory.working_memory"),
    (_aliased(60, 'upsertDocument(input: {collection: "c", path: "p", title: "t", body: "b", '
                  'scopes: ["team"]}) { created }', "mutation"), "sources.documents"),
    ("{ provenance(table: \"sources.documents\", rowId: {id: \"x\"}, maxDepth: 1000) { proven } }", None),
    (_aliased(30, 'facts(entityId: "00000000-0000-0000-0000-000000000000") { id text predicate } '
                  "documents(first: 100) { edges { node { id title body scopes { name } } } }"), None),
], ids=["verifyChain", "recall", "memoryPrepare", "remember", "upsertDocument", "provenance-depth",
        "lists"])
def test_aliased_floods_are_refused_by_cost_before_running(
        operation: str, table: str | None, api_server: ApiServer,  # noqa: F811
        tenant_factory: Tenants, admin_engine: Engine) -> None:
    # api_server runs the default ENGRAM_API_MAX_COST.
    t = tenant_factory("team")
    token = api_server.token(t.org_id, "flood", ("write:team", "engram:auditor"))
    response = api_server.post(token, operation)
    error = error_of(response)
    assert response.status_code == 400 and error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert "exceeds the maximum cost of 5000" in error["message"]
    assert response.json().get("data") is None
    if table:
        assert count(admin_engine, t, table) == 0
    assert count(admin_engine, t, "provenance.events") == 0


def test_a_long_list_argument_costs_per_item(api_server: ApiServer, tenant_factory: Tenants) -> None:  # noqa: F811
    t = tenant_factory("team")
    ids = [str(uuid.uuid4()) for _ in range(1001)]
    response = api_server.post(writer(api_server, t), "mutation($c: [ID!]) { markUsed(claimIds: $c) }",
                               {"c": ids})
    assert response.status_code == 400 and "maximum cost" in error_of(response)["message"]
    # A handful is priced low and runs (to NOT_FOUND: no such claims).
    response = api_server.post(writer(api_server, t), "mutation($c: [ID!]) { markUsed(claimIds: $c) }",
                               {"c": ids[:3]})
    assert error_of(response)["extensions"]["code"] == "NOT_FOUND"


def test_ordinary_requests_fit_the_default_cost(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                                admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = api_server.token(t.org_id, "alice", ("write:team", "engram:auditor"))
    upsert(api_server, token, "a.md")
    full_page = f"{{ documents(first: 100) {{ edges {{ cursor node {{ {DOC_FIELDS} }} }} " \
                "pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }"
    assert len(api_server.gql(token, full_page)["documents"]["edges"]) == 1
    bundle = api_server.gql(token, """{ memoryPrepare(question: "What is in a.md?") { rendered
        usedTokens keyedFacts { text kind } evidence { text provenance kind scopes { name description }
        source { collection path title } fact { subject predicate object } itemTable itemId }
        lessons { text } episodes { text } documents { id title path } } }""")["memoryPrepare"]
    assert bundle["evidence"]
    several = api_server.gql(token, _aliased(10, 'recall(question: "body?") { usedTokens }'))
    assert len(several) == 10
    writes = api_server.gql(token, _aliased(50, 'remember(sessionId: "s", text: "noted", '
                                                'scopes: ["team"])', "mutation"))
    assert len(writes) == 50 and count(admin_engine, t, "memory.working_memory") == 50
    report = api_server.gql(token, "{ verifyChain { ok checked } }")["verifyChain"]
    assert report["ok"] and report["checked"] > 50


def test_recall_mode_reaches_the_recall(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                        app_engine: Engine) -> None:
    from orchestrator.recall import Recaller

    t = tenant_factory("team")
    token = writer(api_server, t)
    upsert(api_server, token, "d1.md", title="Decision log", body="We chose PostgreSQL because of RLS.")
    upsert(api_server, token, "d2.md", title="Follow-up", body="Because of that choice, we dropped MySQL.")
    q = """query($q: String!, $m: String) { recall(question: $q, mode: $m, budgetTokens: 400) {
             evidence { text } } }"""
    question = "Why did we choose PostgreSQL?"
    local = Recaller(app_engine, api_server.settings)
    for mode in ("causal", "timeline"):
        served = api_server.gql(token, q, {"q": question, "m": mode})["recall"]["evidence"]
        expected = local.recall(t.identity("alice", write=("team",)), question, budget_tokens=400,
                                mode=mode)
        assert served and [e["text"] for e in served] == [e.text for e in expected.evidence]
    response = api_server.post(token, q, {"q": question, "m": "sideways"})
    error = error_of(response)
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and "unknown mode 'sideways'" in error["message"]


def test_recall_session_reaches_the_working_memory_lane(api_server: ApiServer,  # noqa: F811
                                                        tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    for session, text_ in (("kitchen", "The oven timer is set for 40 minutes."),
                           ("garage", "The oven mitts are in the garage drawer.")):
        api_server.gql(token, 'mutation($s: String!, $t: String!) { remember(sessionId: $s, '
                              'text: $t, scopes: ["team"]) }', {"s": session, "t": text_})
    q = """query($q: String!, $s: String) { recall(question: $q, sessionId: $s) {
             evidence { kind text } }
           memoryPrepare(question: $q, sessionId: $s) { rendered } }"""

    def notes(session: str | None) -> tuple[set[str], str]:
        data = api_server.gql(token, q, {"q": "what about the oven?", "s": session})
        return ({e["text"] for e in data["recall"]["evidence"] if e["kind"] == "session note"},
                data["memoryPrepare"]["rendered"])

    assert notes(None)[0] == {"The oven timer is set for 40 minutes.",
                              "The oven mitts are in the garage drawer."}
    kitchen, rendered = notes("kitchen")
    assert kitchen == {"The oven timer is set for 40 minutes."}
    assert "garage drawer" not in rendered
    error = error_of(api_server.post(token, q, {"q": "oven", "s": " "}))
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and "session must be" in error["message"]
