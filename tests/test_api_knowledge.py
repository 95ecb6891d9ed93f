"""Knowledge and memory over real HTTP: entities, facts, conflicts, quarantine, decisions,
episodes, working memory and feedback; cross-tenant ids never reach another tenant's rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server, error_of  # noqa: F401
from tests.support.knowledge import counts, define_shape, strict_shapes

Tenants = Callable[..., TenantFixture]

ASSERT = """mutation($i: FactInput!) { assertFact(input: $i) { claimId quarantineId quarantined reasons } }"""
ENTITY = """mutation($n: String!) { resolveEntity(type: "person", name: $n, scopes: ["team"]) }"""


def fact(subject: str, predicate: str, value: Any, **over: Any) -> dict[str, Any]:
    base = {"subjectId": subject, "predicate": predicate, "text": f"{predicate} is {value}",
            "scopes": ["team"], "value": value}
    base.update(over)
    return base


def writer(server: ApiServer, t: TenantFixture, user: str = "alice") -> str:
    return server.token(t.org_id, user, ("write:team",))


def test_facts_conflicts_and_quarantine(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                        admin_engine: Engine) -> None:
    t = tenant_factory("team")
    define_shape(admin_engine, t.id, "lives_in", max_count=1)
    define_shape(admin_engine, t.id, "level", allowed_values=["junior", "senior"])
    strict_shapes(admin_engine, t.id)
    alice, bruno = writer(api_server, t), writer(api_server, t, "bruno")
    ann = api_server.gql(alice, ENTITY, {"n": "Ann"})["resolveEntity"]
    assert api_server.gql(alice, '{ entity(type: "person", name: "ann") }') == {"entity": ann}
    old = api_server.gql(alice, ASSERT, {"i": fact(ann, "lives_in", "Porto")})["assertFact"]
    new = api_server.gql(bruno, ASSERT, {"i": fact(ann, "lives_in", "Braga")})["assertFact"]
    assert old["claimId"] and new["claimId"] and not new["quarantined"]
    conflicts = api_server.gql(bruno, '{ conflicts(status: "open") { id kind claimA claimB status } }')
    [conflict] = conflicts["conflicts"]
    assert conflict["kind"] == "value" and {conflict["claimA"], conflict["claimB"]} == \
        {old["claimId"], new["claimId"]}
    response = api_server.post(bruno, 'mutation($c: ID!) { resolveConflict(id: $c, strategy: "manual") '
                                      "{ winner } }", {"c": conflict["id"]})
    assert response.json()["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    won = api_server.gql(bruno, 'mutation($c: ID!) { resolveConflict(id: $c, strategy: "newest_wins") '
                                "{ winner } }", {"c": conflict["id"]})
    assert won == {"resolveConflict": {"winner": new["claimId"]}}
    facts = api_server.gql(bruno, "query($e: ID!) { facts(entityId: $e) { id objectValue author "
                                  "predicate disputed } }", {"e": ann})["facts"]
    assert [(f["objectValue"], f["author"]) for f in facts] == [("Braga", "bruno")]
    held = api_server.gql(alice, ASSERT, {"i": fact(ann, "level", "wizard")})["assertFact"]
    assert held["quarantined"] and held["claimId"] is None and held["reasons"]
    items = api_server.gql(alice, "{ quarantine { id reasons status payload } }")["quarantine"]
    assert [q["id"] for q in items] == [held["quarantineId"]] and items[0]["status"] == "held"
    used = api_server.gql(bruno, "mutation($ids: [ID!]!) { markUsed(claimIds: $ids) }",
                          {"ids": [new["claimId"]]})
    assert used == {"markUsed": 1}
    used = api_server.gql(bruno, "mutation($i: [UsedItem!]) { markUsed(items: $i) }",
                          {"i": [{"table": "knowledge.fact_claim", "id": new["claimId"]}]})
    assert used == {"markUsed": 1}
    for items, code in (([{"table": "auth.tenants", "id": new["claimId"]}], "BAD_USER_INPUT"),
                        ([{"table": "memory.decisions", "id": new["claimId"]}], "NOT_FOUND"),
                        ([], "BAD_USER_INPUT")):
        response = api_server.post(bruno, "mutation($i: [UsedItem!]) { markUsed(items: $i) }", {"i": items})
        assert error_of(response)["extensions"]["code"] == code, response.text


def test_memory_writes(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                       admin_engine: Engine) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    api_server.gql(token, 'mutation { remember(sessionId: "s1", text: "User prefers tea.", '
                          'scopes: ["team"]) }')
    assert api_server.gql(token, '{ workingMemory(sessionId: "s1") }') == \
        {"workingMemory": ["User prefers tea."]}
    assert api_server.gql(api_server.token(t.org_id, "other", ("write:team",)),
                          '{ workingMemory(sessionId: "s1") }') == {"workingMemory": []}
    decision = api_server.gql(token, """mutation { recordDecision(input: {category: "infra",
        scenario: "Pick a database", reasoning: "RLS and one owner", confidence: 0.8,
        scopes: ["team"], outcome: "PostgreSQL"}) }""")["recordDecision"]
    assert decision
    start = datetime.now(UTC) - timedelta(hours=1)
    episode = api_server.gql(token, """mutation($s: DateTime!, $e: DateTime!) { recordEpisode(
        sessionId: "s1", summary: "Talked about tea.", startedAt: $s, endedAt: $e, scopes: ["team"],
        turnCount: 4) }""", {"s": start.isoformat(), "e": datetime.now(UTC).isoformat()})
    assert episode["recordEpisode"]
    response = api_server.post(token, """mutation { recordDecision(input: {category: "x",
        scenario: "s", reasoning: "r", confidence: 1.5, scopes: ["team"]}) }""")
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and "outside [0, 1]" in error["message"]
    c = counts(admin_engine, t.id)
    assert (c["memory.decisions"], c["memory.episodes"], c["memory.working_memory"]) == (1, 1, 1)


def test_cross_tenant_knowledge_ids(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                    admin_engine: Engine) -> None:
    a, b = tenant_factory("team"), tenant_factory("team")
    wa, wb = writer(api_server, a), writer(api_server, b, "mallory")
    ann = api_server.gql(wa, ENTITY, {"n": "Ann"})["resolveEntity"]
    api_server.gql(wa, ASSERT, {"i": fact(ann, "nickname", "Annie")})
    assert api_server.gql(wb, "query($e: ID!) { facts(entityId: $e) { id text } }", {"e": ann}) == \
        {"facts": []}
    before = counts(admin_engine, a.id)
    response = api_server.post(wb, ASSERT, {"i": fact(ann, "nickname", "Stolen")})
    body = response.json()
    error = body["errors"][0]
    # Another tenant's id is not found: the same answer as for an id that exists nowhere.
    assert body["data"] is None and error["extensions"]["code"] == "NOT_FOUND"
    assert "does not exist in this tenant or is not visible" in error["message"]
    assert "Annie" not in response.text
    assert counts(admin_engine, a.id) == before


def test_keyed_facts_newest_as_of_is_current(api_server: ApiServer,  # noqa: F811
                                             tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    token = writer(api_server, t)
    acme = api_server.gql(token, ENTITY, {"n": "Acme"})["resolveEntity"]
    for as_of, value in (("2025-01-01T00:00:00Z", "40"), ("2026-01-01T00:00:00Z", "55")):
        result = api_server.gql(token, ASSERT, {"i": fact(acme, "headcount", value, factKey="acme.headcount",
                                                          asOf=as_of, authority=5)})["assertFact"]
        assert result["claimId"] and not result["quarantined"]
    facts = api_server.gql(token, "query($e: ID!) { facts(entityId: $e) { objectValue factKey asOf } }",
                           {"e": acme})["facts"]
    assert [(f["objectValue"], f["factKey"]) for f in facts] == [("55", "acme.headcount")]
    assert facts[0]["asOf"].startswith("2026-01-01")
