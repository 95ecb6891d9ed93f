"""Existence oracle: for every key a client can reach, a key taken by a row the caller cannot read
gets exactly the answer a key nobody uses gets (after the key itself and fresh ids are written
out). An answer that differs tells the caller the hidden row exists: an oracle hit.

Keys: a document's (collection, path) for upsert, read and delete; a keyed fact's (fact_key,
as_of); an entity's (type, name) for lookup and resolution; a scope name of another tenant; the
ids of documents, entities, claims, conflicts and session notes for every call that takes one.
Scope names are public inside their tenant (``scopes`` lists them), so they are compared across
tenants only; tenant organisation ids never come from a client (the token's issuer vouches).
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from tests.adversarial.figures import record
from tests.adversarial.snapshot import snapshot
from tests.conftest import TenantFixture
from tests.support.api import ApiServer
from tests.support.knowledge import define_shape

SAMPLES = 3
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
UPSERT = """mutation($i: DocumentInput!) { upsertDocument(input: $i) { created changed chunks
  document { collection path title scopes { name canWrite } chunkCount } } }"""
FACT = "mutation($i: FactInput!) { assertFact(input: $i) { claimId quarantineId quarantined reasons } }"
ENTITY = 'mutation($n: String!, $s: [String!]!) { resolveEntity(type: "person", name: $n, scopes: $s) }'


def normal(response: Any, *keys: str) -> str:
    """A response with the probed key and every id written out: what is left must not differ."""
    shown = json.dumps(response.json(), sort_keys=True)
    for n, key in enumerate(keys):
        shown = shown.replace(key, f"<key{n}>")
    return UUID.sub("<id>", shown)


def test_a_hidden_key_answers_as_a_free_key(seed: int, api_server: ApiServer,
                                            tenant_factory: Callable[..., TenantFixture],
                                            admin_engine: Engine) -> None:
    rng = random.Random(seed ^ 0xE)
    t = tenant_factory("board", "hr", org_prefix="adve")
    other = tenant_factory("vault", org_prefix="adve")
    define_shape(admin_engine, t.id, "ceo", max_count=1)
    hr = api_server.token(t.org_id, "h", ("write:hr",))
    board = api_server.token(t.org_id, "b", ("write:board",))
    attempts = hits = 0
    differing: list[str] = []

    def probe(what: str, hidden: tuple[str, dict[str, Any] | None, str],
              free: tuple[str, dict[str, Any] | None, str], *, writes: bool = False) -> None:
        """Send the same call at a hidden key and at a free one; the answers must match."""
        nonlocal attempts, hits
        before = snapshot(admin_engine, t.id) if not writes else None
        a = api_server.post(board, hidden[0], hidden[1])
        b = api_server.post(board, free[0], free[1])
        attempts += 1
        if normal(a, hidden[2]) != normal(b, free[2]):
            hits += 1
            differing.append(f"{what}: {normal(a, hidden[2])[:200]} vs {normal(b, free[2])[:200]}")
        if before is not None:
            assert snapshot(admin_engine, t.id) == before, f"{what} changed the tenant"

    for n in range(SAMPLES):
        word = f"k{rng.randrange(10**9)}"
        # A document path: hr's; board writes, reads and deletes at it and at a free one.
        path, free = f"{word}.md", f"free-{word}.md"
        api_server.gql(hr, UPSERT, {"i": {"collection": "notes", "path": path, "title": path,
                                          "body": "HR text.", "scopes": ["hr"]}})
        hr_doc = _doc_id(api_server, hr, path)
        read = '{ document(collection: "notes", path: "%s") { id title } }'
        probe("document by path", (read % path, None, path), (read % free, None, free))
        delete = 'mutation { deleteDocument(collection: "notes", path: "%s") { id } }'
        probe("delete by path", (delete % path, None, path), (delete % free, None, free))
        upsert = {"collection": "notes", "title": "T", "body": "Board text.", "scopes": ["board"]}
        probe("upsert at a path", (UPSERT, {"i": upsert | {"path": path}}, path),
              (UPSERT, {"i": upsert | {"path": free}}, free), writes=True)
        # An entity name: hr's person; board looks it up and resolves it into board.
        name, free_name = f"Hidden {word}", f"Unused {word}"
        hidden_entity = api_server.gql(hr, ENTITY, {"n": name, "s": ["hr"]})["resolveEntity"]
        lookup = '{ entity(type: "person", name: "%s") }'
        probe("entity by name", (lookup % name, None, name), (lookup % free_name, None, free_name))
        resolved = api_server.post(board, ENTITY, {"n": name, "s": ["board"]}).json()
        attempts += 1
        if resolved.get("data", {}).get("resolveEntity") in (None, hidden_entity):
            hits += 1
            differing.append(f"resolveEntity at a hidden name: {resolved}")
        mine = resolved["data"]["resolveEntity"]
        # A keyed fact: hr's snapshot; board asserts the same key and moment, and a free key.
        key, as_of = f"kpi.{word}", f"2024-0{n + 1}-01T00:00:00Z"
        api_server.gql(hr, FACT, {"i": {"subjectId": hidden_entity, "predicate": "kpi", "text": "KPI 1.",
                                        "value": 1, "scopes": ["hr"], "factKey": key, "asOf": as_of}})
        fact = {"subjectId": mine, "predicate": "kpi", "text": "KPI 2.", "value": 2, "scopes": ["board"],
                "asOf": as_of}
        probe("keyed fact", (FACT, {"i": fact | {"factKey": key}}, key),
              (FACT, {"i": fact | {"factKey": f"free.{word}"}}, f"free.{word}"), writes=True)
        # Ids: every call that takes one, at a hidden row's id and at an id of nothing.
        ceo = {"subjectId": hidden_entity, "predicate": "ceo", "scopes": ["hr"]}
        api_server.gql(hr, FACT, {"i": ceo | {"text": "CEO Ann.", "value": "Ann"}})
        api_server.gql(hr, FACT, {"i": ceo | {"text": "CEO Bo.", "value": "Bo"}})
        conflict = api_server.gql(hr, "{ conflicts { id } }")["conflicts"][-1]["id"]
        claim = api_server.gql(hr, "query($e: ID!) { facts(entityId: $e) { id } }",
                               {"e": hidden_entity})["facts"][0]["id"]
        note = api_server.gql(hr, 'mutation { remember(sessionId: "s", text: "t", scopes: ["hr"]) }')[
            "remember"]
        nothing = str(uuid.uuid4())
        for what, query, hidden_id in (
                ("documentById", "query($id: ID!) { documentById(id: $id) { id } }", hr_doc),
                ("entityById", "query($id: ID!) { entityById(id: $id) { id } }", hidden_entity),
                ("facts", "query($id: ID!) { facts(entityId: $id) { id } }", hidden_entity),
                ("pin", "mutation($id: ID!) { pin(id: $id) { id } }", hr_doc),
                ("resolveConflict", 'mutation($id: ID!) { resolveConflict(id: $id, strategy: "keep_both") '
                                    "{ winner } }", conflict),
                ("markUsed claim", "mutation($id: ID!) { markUsed(claimIds: [$id]) }", claim),
                ("markUsed note", 'mutation($id: ID!) { markUsed(items: [{table: "memory.working_memory", '
                                  "id: $id}]) }", note)):
            probe(what, (query, {"id": hidden_id}, hidden_id), (query, {"id": nothing}, nothing))
    # A scope name of another tenant is as unknown as a name nobody uses.
    upsert = {"collection": "notes", "path": "x.md", "title": "T", "body": "b"}
    probe("scope of another tenant", (UPSERT, {"i": upsert | {"scopes": ["vault"]}}, "vault"),
          (UPSERT, {"i": upsert | {"scopes": ["nosuch"]}}, "nosuch"))
    assert other.scopes
    record("existence oracle", keys=9, attempts=attempts, oracle_hits=hits)
    assert not differing, f"seed {seed}:\n" + "\n".join(differing)


def _doc_id(server: ApiServer, token: str, path: str) -> str:
    found: str = server.gql(token, "query($p: String!) { document(collection: \"notes\", path: $p) "
                                   "{ id } }", {"p": path})["document"]["id"]
    return found
