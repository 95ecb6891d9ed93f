"""Knowledge and memory over real HTTP: entities, facts, conflicts, quarantine, decisions,
episodes, working memory and feedback; cross-tenant ids never reach another tenant's rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from orchestrator.db.session import bound_session
from orchestrator.ingest import knowledge as kn
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
    # A resolved conflict stays resolved: a second resolution is a CONFLICT, not INTERNAL.
    response = api_server.post(bruno, 'mutation($c: ID!) { resolveConflict(id: $c, strategy: '
                                      '"keep_both") { winner } }', {"c": conflict["id"]})
    error = error_of(response)
    assert error["extensions"]["code"] == "CONFLICT" and "is already" in error["message"], error
    assert api_server.gql(bruno, '{ conflicts { status winnerId } }')["conflicts"] == \
        [{"status": "resolved", "winnerId": new["claimId"]}]
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


def _conflicted(server: ApiServer, t: TenantFixture, admin_engine: Engine, token: str
                ) -> tuple[str, str, str]:
    """An entity with two claims on a one-valued predicate: (entity, claim, open conflict)."""
    define_shape(admin_engine, t.id, "lives_in", max_count=1)
    ann = server.gql(token, ENTITY, {"n": "Ann"})["resolveEntity"]
    claim = server.gql(token, ASSERT, {"i": fact(ann, "lives_in", "Porto")})["assertFact"]["claimId"]
    server.gql(token, ASSERT, {"i": fact(ann, "lives_in", "Braga")})
    [conflict] = server.gql(token, '{ conflicts(status: "open") { id } }')["conflicts"]
    return ann, claim, conflict["id"]


def _state(admin_engine: Engine, t: TenantFixture) -> dict[str, Any]:
    """What a refused request must leave unchanged: row counts, conflict states, the usage
    ledger, access counters and the provenance chain."""
    from sqlalchemy import text

    found: dict[str, Any] = dict(counts(admin_engine, t.id))
    with admin_engine.connect() as conn:
        for name, sql in (
                ("conflicts", "select array_agg(status::text || coalesce(winner_id::text, '') "
                              "order by id) from knowledge.conflicts where tenant_id = :t"),
                ("ledger", "select count(*) from memory.usage_ledger where tenant_id = :t"),
                ("access", "select coalesce(sum(access_count), 0) from knowledge.fact_claim "
                           "where tenant_id = :t"),
                ("events", "select count(*) from provenance.events where tenant_id = :t")):
            found[name] = conn.execute(text(sql), {"t": t.id}).scalar_one()
    return found


def test_cross_tenant_knowledge_ids(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                    admin_engine: Engine) -> None:
    a, b = tenant_factory("team"), tenant_factory("team")
    wa, wb = writer(api_server, a), writer(api_server, b, "mallory")
    ann, claim, conflict = _conflicted(api_server, a, admin_engine, wa)
    api_server.gql(wa, ASSERT, {"i": fact(ann, "nickname", "Annie")})
    doc = api_server.gql(wa, """mutation { upsertDocument(input: {collection: "n", path: "a.md",
        title: "A", body: "Tenant A's excerpt.", scopes: ["team"]}) { document { id } } }""")
    _, own_claim, own_conflict = _conflicted(api_server, b, admin_engine, wb)
    with admin_engine.connect() as conn:
        from sqlalchemy import text

        chunk = str(conn.execute(text("select id from sources.chunks where document_id = :d"),
                                 {"d": doc["upsertDocument"]["document"]["id"]}).scalar_one())
    before = (_state(admin_engine, a), _state(admin_engine, b))
    nowhere = "00000000-0000-4000-8000-000000000000"
    # (operation, its variables around one id, another tenant's id to put there)
    attempts: list[tuple[str, Callable[[str], dict[str, Any]], str]] = [
        ("query($e: ID!) { facts(entityId: $e) { id text } }", lambda i: {"e": i}, ann),
        ("query($e: ID!) { entityById(id: $e) { name } }", lambda i: {"e": i}, ann),
        ('mutation($c: ID!) { resolveConflict(id: $c, strategy: "newest_wins") { winner } }',
         lambda i: {"c": i}, conflict),
        ('mutation($c: ID!, $w: ID) { resolveConflict(id: $c, strategy: "manual", winner: $w) '
         "{ winner } }", lambda i: {"c": own_conflict, "w": i}, claim),
        ("mutation($ids: [ID!]) { markUsed(claimIds: $ids) }", lambda i: {"ids": [own_claim, i]},
         claim),
        ("mutation($i: [UsedItem!]) { markUsed(items: $i) }",
         lambda i: {"i": [{"table": "sources.chunks", "id": i}]}, chunk),
        ("mutation($i: FactInput!) { assertFact(input: $i) { claimId } }",
         lambda i: {"i": fact(i, "nickname", "Stolen")}, ann),
    ]
    for query, around, foreign in attempts:
        response = api_server.post(wb, query, around(foreign))
        error = error_of(response)
        assert error["extensions"]["code"] == "NOT_FOUND", (query, error)
        assert "Annie" not in response.text and "Porto" not in response.text
        # The same answer as for an id that exists nowhere.
        missing = error_of(api_server.post(wb, query, around(nowhere)))
        assert missing["message"].replace(nowhere, foreign) == error["message"], (query, missing)
    assert (_state(admin_engine, a), _state(admin_engine, b)) == before


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


ENTITIES = """query($q: String, $t: String, $after: String, $r: Boolean) {
  entities(query: $q, type: $t, first: 2, after: $after, retracted: $r) {
    edges { cursor node { id type name aliases mergedInto createdBy scopes { name canWrite } } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }"""


def test_entities_connection_and_entity_by_id(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                              app_engine: Engine) -> None:
    t, other = tenant_factory("team"), tenant_factory("team")
    token = writer(api_server, t)
    made = {name: api_server.gql(token, 'mutation($n: String!, $t: String!) { resolveEntity(type: $t, '
                                 'name: $n, scopes: ["team"]) }', {"n": name, "t": kind})["resolveEntity"]
            for name, kind in (("Ann Lee", "person"), ("Bruno", "person"), ("Carla", "person"),
                               ("Acme", "org"), ("Ann's Bakery", "org"))}
    api_server.gql(writer(api_server, other), ENTITY, {"n": "Ann Other"})
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        kn.add_aliases(s, uuid.UUID(made["Bruno"]), ["Bruno the Builder"])
        kn.merge_entities(s, uuid.UUID(made["Carla"]), uuid.UUID(made["Ann Lee"]))

    def walk(**variables: Any) -> tuple[list[str], list[dict[str, Any]]]:
        names, infos, after = [], [], None
        while True:
            page = api_server.gql(token, ENTITIES, {**variables, "after": after})["entities"]
            names += [e["node"]["name"] for e in page["edges"]]
            infos.append(page["pageInfo"])
            if not page["pageInfo"]["hasNextPage"]:
                return names, infos
            after = page["pageInfo"]["endCursor"]

    # Ann Lee was merged into Carla: left out of the listing. Ordered by type, then name.
    names, infos = walk()
    assert names == ["Acme", "Ann's Bakery", "Bruno", "Carla"]
    assert [(i["hasPreviousPage"], i["hasNextPage"]) for i in infos] == [(False, True), (True, False)]
    assert walk(t="person")[0] == ["Bruno", "Carla"]
    # Entities made by hand have no claims: none is a retracted extraction's, so asking for
    # those too lists the same (test_derive_extract has extraction's).
    assert walk(r=True)[0] == names
    # The merge kept "Ann Lee" as an alias of Carla, so she is found by it.
    assert walk(q="ANN")[0] == ["Ann's Bakery", "Carla"]
    assert walk(q="builder")[0] == ["Bruno"], "a query matches inside an alias"
    assert walk(q="nobody here")[0] == []
    page = api_server.gql(token, ENTITIES, {"q": "bruno"})["entities"]["edges"][0]["node"]
    assert page == {"id": made["Bruno"], "type": "person", "name": "Bruno",
                    "aliases": ["Bruno the Builder"], "mergedInto": None, "createdBy": "alice",
                    "scopes": [{"name": "team", "canWrite": True}]}
    merged = api_server.gql(token, "query($e: ID!) { entityById(id: $e) { name mergedInto } }",
                            {"e": made["Ann Lee"]})
    assert merged == {"entityById": {"name": "Ann Lee", "mergedInto": made["Carla"]}}
    reader = api_server.token(t.org_id, "rita", ("read:team",))
    seen = api_server.gql(reader, "query($e: ID!) { entityById(id: $e) { scopes { canRead canWrite } } }",
                          {"e": made["Acme"]})
    assert seen == {"entityById": {"scopes": [{"canRead": True, "canWrite": False}]}}
    for variables, message in (({"q": "!!!"}, "must contain a letter or digit"),
                               ({"after": "garbage"}, "not one this API handed out")):
        response = api_server.post(token, ENTITIES, variables)
        error = error_of(response)
        assert error["extensions"]["code"] == "BAD_USER_INPUT" and message in error["message"]
    response = api_server.post(token, "{ entities(first: 500) { edges { cursor } } }")
    assert "first must be between 1 and 100" in error_of(response)["message"]


def test_a_database_refusal_inside_a_resolver_keeps_its_code(api_server: ApiServer,  # noqa: F811
                                                             tenant_factory: Tenants) -> None:
    from orchestrator.api.documents import encode_cursor

    t = tenant_factory("team")
    token = writer(api_server, t)
    api_server.gql(token, ENTITY, {"n": "Ann"})
    # A cursor that decodes, with a key the database cannot read as a UUID (22P02).
    forged = encode_cursor("person", "ann", "not-a-uuid")
    response = api_server.post(token, ENTITIES, {"after": forged})
    error = error_of(response)
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert "internal error" not in error["message"]
