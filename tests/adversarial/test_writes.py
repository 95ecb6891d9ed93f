"""Write fuzz: random writes into scope sets the caller lacks write on (some scope of them), and
onto rows it may only read or cannot see. Each must be refused, FORBIDDEN where the caller can
see what it tried to change and NOT_FOUND where it cannot, with nothing changed anywhere in the
tenant (``snapshot``). Controls, writes the caller may make, land, so the snapshot is shown to
notice a change."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from tests.adversarial.figures import record
from tests.adversarial.snapshot import changed, snapshot
from tests.adversarial.world import subset
from tests.conftest import TenantFixture
from tests.support.api import ApiServer
from tests.support.knowledge import define_shape

SCOPES = ["a", "b", "c"]
ATTEMPTS = 60
UPSERT = "mutation($i: DocumentInput!) { upsertDocument(input: $i) { document { id } } }"
FACT = "mutation($i: FactInput!) { assertFact(input: $i) { claimId quarantineId } }"


@dataclass
class Target:
    """A row of the tenant and the scope set it is shared into."""

    kind: str
    id: str
    scopes: frozenset[str]
    path: str = ""


def _seed_rows(server: ApiServer, t: TenantFixture, admin_engine: Engine) -> list[Target]:
    every = server.token(t.org_id, "owner", tuple(f"write:{s}" for s in SCOPES))
    targets = []
    define_shape(admin_engine, t.id, "ceo", max_count=1)
    for n, scopes in enumerate((["a"], ["b"], ["c"], ["a", "b"], ["b", "c"])):
        path = f"doc{n}.md"
        doc = server.gql(every, UPSERT, {"i": {"collection": "notes", "path": path, "title": path,
                                               "body": f"Body {n}.", "scopes": scopes}})
        targets.append(Target("document", doc["upsertDocument"]["document"]["id"], frozenset(scopes), path))
        entity = server.gql(every, 'mutation($n: String!, $s: [String!]!) { resolveEntity('
                                   'type: "person", name: $n, scopes: $s) }',
                            {"n": f"Person {n}", "s": scopes})["resolveEntity"]
        targets.append(Target("entity", entity, frozenset(scopes)))
        for value in ("Ann", "Bo"):  # two CEOs: a conflict in this scope set
            server.gql(every, FACT, {"i": {"subjectId": entity, "predicate": "ceo", "text": f"CEO {value}.",
                                           "value": value, "scopes": scopes}})
    conflicts = server.gql(every, "{ conflicts { id } }")["conflicts"]
    by_entity = {x.id: x for x in targets if x.kind == "entity"}
    for c in server.gql(every, "{ conflicts { id subjectId } }")["conflicts"]:
        targets.append(Target("conflict", c["id"], by_entity[c["subjectId"]].scopes))
    assert conflicts
    return targets


def _attempt(rng: random.Random, writes: frozenset[str], reads: frozenset[str],
             targets: list[Target]) -> tuple[str, str, dict[str, Any] | None, str] | None:
    """One refused write: (what, query, variables, the code it must get); None if this identity
    has nothing of that kind to try."""
    unwritable = [s for s in SCOPES if s not in writes]
    readable = reads | writes
    if not unwritable:
        return None
    bad = subset(rng, SCOPES, 1, 3)
    if set(bad) <= writes:
        bad = sorted({*bad, rng.choice(unwritable)})
    visible_ro = [x for x in targets if x.scopes & readable and not x.scopes <= writes]
    hidden = [x for x in targets if not x.scopes & readable]
    kind = rng.choice(["new document", "overwrite", "move", "delete", "lifecycle", "entity", "claim",
                       "note", "decision", "episode", "conflict", "hidden"])
    if kind == "new document":
        return (kind, UPSERT, {"i": {"collection": "notes", "path": f"n{rng.randint(0, 9)}.md",
                                     "title": "t", "body": "b", "scopes": bad}}, "FORBIDDEN")
    docs_ro = [x for x in visible_ro if x.kind == "document"]
    if kind == "overwrite" and docs_ro:
        x = rng.choice(docs_ro)
        return (kind, UPSERT, {"i": {"collection": "notes", "path": x.path, "title": "edited",
                                     "body": "edited", "scopes": sorted(x.scopes)}}, "FORBIDDEN")
    mine = [x for x in targets if x.kind == "document" and x.scopes <= writes]
    if kind == "move" and mine:
        x = rng.choice(mine)
        return (kind, UPSERT, {"i": {"collection": "notes", "path": x.path, "title": x.path,
                                     "body": "moved", "scopes": bad}}, "FORBIDDEN")
    if kind == "delete" and docs_ro:
        x = rng.choice(docs_ro)
        return (kind, f'mutation {{ deleteDocument(collection: "notes", path: "{x.path}") {{ id }} }}',
                None, "FORBIDDEN")
    if kind == "lifecycle" and docs_ro:
        x = rng.choice(docs_ro)
        op = rng.choice(["pin(id: $id)", "archive(id: $id)", "snooze(id: $id)"])
        return (kind, f"mutation($id: ID!) {{ {op} {{ id }} }}", {"id": x.id}, "FORBIDDEN")
    if kind == "entity":
        return (kind, 'mutation($s: [String!]!) { resolveEntity(type: "person", '
                      f'name: "New {rng.randint(0, 99)}", scopes: $s) }}', {"s": bad}, "FORBIDDEN")
    seen_entities = [x for x in targets if x.kind == "entity" and x.scopes & readable]
    if kind == "claim" and seen_entities:
        x = rng.choice(seen_entities)
        return (kind, FACT, {"i": {"subjectId": x.id, "predicate": "note", "text": "t", "value": "v",
                                   "scopes": bad}}, "FORBIDDEN")
    if kind == "note":
        return (kind, 'mutation($s: [String!]!) { remember(sessionId: "s", text: "t", scopes: $s) }',
                {"s": bad}, "FORBIDDEN")
    if kind == "decision":
        return (kind, "mutation($i: DecisionInput!) { recordDecision(input: $i) }",
                {"i": {"category": "c", "scenario": "s", "reasoning": "r", "confidence": 0.5,
                       "scopes": bad}}, "FORBIDDEN")
    if kind == "episode":
        return (kind, 'mutation($s: [String!]!) { recordEpisode(sessionId: "s", summary: "t", '
                      'startedAt: "2024-01-01T00:00:00Z", endedAt: "2024-01-01T01:00:00Z", '
                      "scopes: $s) }", {"s": bad}, "FORBIDDEN")
    conflicts_ro = [x for x in visible_ro if x.kind == "conflict"]
    if kind == "conflict" and conflicts_ro:
        x = rng.choice(conflicts_ro)
        return (kind, 'mutation($id: ID!) { resolveConflict(id: $id, strategy: "keep_both") { winner } }',
                {"id": x.id}, "FORBIDDEN")
    if kind == "hidden" and hidden:
        x = rng.choice(hidden)
        if x.kind == "document":
            return ("hidden document", "mutation($id: ID!) { archive(id: $id) { id } }", {"id": x.id},
                    "NOT_FOUND")
        if x.kind == "entity":
            # The subject is looked up before the scopes: NOT_FOUND, whatever the scopes.
            return ("claim about a hidden entity", FACT,
                    {"i": {"subjectId": x.id, "predicate": "note", "text": "t", "value": "v",
                           "scopes": sorted(writes) or bad}}, "NOT_FOUND")
        return ("hidden conflict", 'mutation($id: ID!) { resolveConflict(id: $id, strategy: '
                                   '"keep_both") { winner } }', {"id": x.id}, "NOT_FOUND")
    return None


def test_refused_writes_are_forbidden_and_change_nothing(
        seed: int, api_server: ApiServer, tenant_factory: Callable[..., TenantFixture],
        admin_engine: Engine) -> None:
    rng = random.Random(seed ^ 0x3)
    t = tenant_factory(*SCOPES, org_prefix="advw")
    targets = _seed_rows(api_server, t, admin_engine)
    before = snapshot(admin_engine, t.id)
    attempts = refusals = 0
    wrong: list[str] = []
    kinds: set[str] = set()
    while attempts < ATTEMPTS:
        writes = frozenset(subset(rng, SCOPES, 0, 2))
        reads = frozenset(subset(rng, SCOPES, 0, 3))
        planned = _attempt(rng, writes, reads, targets)
        if planned is None:
            continue
        what, query, variables, code = planned
        token = api_server.token(t.org_id, f"w{rng.randint(0, 3)}",
                                 tuple(f"read:{s}" for s in reads) + tuple(f"write:{s}" for s in writes))
        response = api_server.post(token, query, variables)
        attempts += 1
        kinds.add(what)
        body = response.json()
        codes = [e.get("extensions", {}).get("code") for e in body.get("errors", [])]
        if codes == [code] and body.get("data") is None:
            refusals += 1
        else:
            wrong.append(f"{what} (write {sorted(writes)}, read {sorted(reads)}): {codes} "
                         f"{json.dumps(body)[:300]}")
        after = snapshot(admin_engine, t.id)
        if after != before:
            wrong.append(f"{what}: changed {changed(before, after)}")
            before = after
    # The control: a write the caller may make is seen by the snapshot.
    owner = api_server.token(t.org_id, "owner", ("write:a",))
    api_server.gql(owner, UPSERT, {"i": {"collection": "notes", "path": f"{uuid.uuid4()}.md",
                                         "title": "t", "body": "b", "scopes": ["a"]}})
    noticed = changed(before, snapshot(admin_engine, t.id))
    record("write fuzz", attempts=attempts, kinds=len(kinds), refusals=refusals,
           wrong_answers=len(wrong), control_writes_noticed=int(bool(noticed)))
    assert not wrong, f"seed {seed}:\n" + "\n".join(wrong[:30])
    assert "sources.documents" in noticed

