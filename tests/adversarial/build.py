"""Building the adversarial world: writes through the real GraphQL API, then the embedding queue
and every derive job, as a running installation would (see ``world`` for the model)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.session import bound_session
from orchestrator.derive.jobs import DeriveScheduler
from orchestrator.ingest.knowledge import add_aliases
from orchestrator.worker.queue import QueueWorker
from tests.adversarial.world import Row, Secrets, Tenant, World, Writer, subset, words_of
from tests.conftest import TenantFixture, TestDatabase
from tests.support.api import ApiServer
from tests.support.knowledge import define_shape

SCOPES = ["board", "eng", "hr", "ops"]

UPSERT = """mutation($i: DocumentInput!) { upsertDocument(input: $i) { document { id } } }"""
ENTITY = """mutation($t: String!, $n: String!, $s: [String!]!) {
  resolveEntity(type: $t, name: $n, scopes: $s) }"""
FACT = "mutation($i: FactInput!) { assertFact(input: $i) { claimId quarantineId } }"
REMEMBER = """mutation($s: String!, $t: String!, $sc: [String!]!) {
  remember(sessionId: $s, text: $t, scopes: $sc) }"""
DECISION = "mutation($i: DecisionInput!) { recordDecision(input: $i) }"
EPISODE = """mutation($s: String!, $t: String!, $sc: [String!]!) { recordEpisode(sessionId: $s,
  summary: $t, startedAt: "2024-05-01T10:00:00Z", endedAt: "2024-05-01T11:00:00Z", scopes: $sc) }"""
PHRASES = ("status is delayed", "budget was approved for", "prefers to work on", "reported an incident in",
           "is responsible for", "moved the launch of")


@dataclass(frozen=True)
class Sizes:
    """How much of each thing one tenant gets (the suite's run time grows with these)."""

    tenants: int = 2
    people: int = 7
    documents: int = 7
    claims: int = 14
    notes: int = 4
    decisions: int = 2


@dataclass
class Entity:
    id: str
    name: str
    scopes: list[str]
    alias: str | None = None


def build_world(seed: int, server: ApiServer, tenants: Callable[..., TenantFixture],
                test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, settings: Settings,
                embedder: Any, sizes: Sizes = Sizes()) -> World:
    rng = random.Random(seed)
    secrets = Secrets(rng)
    made = [tenants(*SCOPES, org_prefix="adv") for _ in range(sizes.tenants)]
    world = World(seed, [Tenant(t.org_id, t.id, list(SCOPES)) for t in made])
    for fixture, tenant in zip(made, world.tenants, strict=True):
        _tenant(world, rng, secrets, server, fixture, tenant, app_engine, admin_engine, sizes)
    worker = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=2)
    try:
        ids = [t.id for t in made]
        QueueWorker(worker, embedder, settings, tenants=ids).drain()
        report = DeriveScheduler(worker, app_engine, settings, tenants=ids).tick()
        assert not report.failed, [r.render() for r in report.failed]
        QueueWorker(worker, embedder, settings, tenants=ids).drain()
    finally:
        worker.dispose()
    # Then documents leave readers after everything was derived from them (0094): no derive
    # run follows, so what their old readers are shown is what the move itself left.
    for tenant in world.tenants:
        _narrow(rng, server, tenant)
    world.load_rows(admin_engine)
    return world


def _narrow(rng: random.Random, server: ApiServer, tenant: Tenant) -> None:
    """Move two documents of the tenant into a narrower scope set: one keeps one of its two
    scopes, one goes to a scope it was not in."""
    everything = Writer(server, tenant.org, "builder", (), tuple(SCOPES))
    pairs = [d for d in tenant.documents.values() if len(d["scopes"]) == 2]
    singles = [d for d in tenant.documents.values() if len(d["scopes"]) == 1]
    moves = ([(rng.choice(pairs), None)] if pairs else []) + ([(rng.choice(singles), "elsewhere")]
                                                              if singles else [])
    for doc, how in moves:
        scopes = ([rng.choice(doc["scopes"])] if how is None else
                  [rng.choice([s for s in SCOPES if s not in doc["scopes"]])])
        doc["scopes"] = scopes
        everything.gql(UPSERT, {"i": doc})


def _tenant(world: World, rng: random.Random, secrets: Secrets, server: ApiServer,
            fixture: TenantFixture, tenant: Tenant, app_engine: Engine, admin_engine: Engine,
            sizes: Sizes) -> None:
    org = tenant.org
    everything = Writer(server, org, "builder", (), tuple(SCOPES))

    def hold(table: str, rid: str, scopes: list[str], *texts: str | None, owner: str | None = None) -> None:
        world.hold(Row(table, rid, org, frozenset(scopes), words_of(*texts), owner))

    # People, each shared into one or two scopes; some with an alias (a second name).
    people: list[Entity] = []
    for _ in range(sizes.people):
        scopes = subset(rng, SCOPES, 1, 2)
        name = secrets.name()
        eid = everything.gql(ENTITY, {"t": "person", "n": name, "s": scopes})["resolveEntity"]
        person = Entity(eid, name, scopes)
        if rng.random() < 0.5:
            person.alias = secrets.word().capitalize()
            with bound_session(app_engine, fixture.identity("builder", write=tuple(SCOPES))) as s:
                add_aliases(s, uuid.UUID(eid), [person.alias])
        people.append(person)
        tenant.entities.append(("person", name))
        hold("knowledge.entities", eid, scopes, name, person.alias)

    # Documents; some name a person by alias (the mention of a hidden entity's other name).
    for n in range(sizes.documents):
        scopes = subset(rng, SCOPES, 1, 2)
        path = f"{secrets.word()}.md"
        sentences = [f"The {secrets.word()} project {rng.choice(PHRASES)} the {secrets.word()} team."
                     for _ in range(rng.randint(2, 4))]
        named = rng.choice(people)
        if named.alias:
            sentences.append(f"{named.alias} {rng.choice(PHRASES)} {secrets.word()}.")
        doc: dict[str, Any] = {"collection": "notes", "path": path,
                               "title": f"{secrets.word().capitalize()} report", "body": " ".join(sentences),
                               "scopes": scopes}
        if n == 0:
            doc.update(kind="decision", metadata={"category": "launch", "outcome": secrets.word()})
        did = everything.gql(UPSERT, {"i": doc})["upsertDocument"]["document"]["id"]
        tenant.paths.append(("notes", path))
        tenant.documents[path] = doc
        hold("sources.documents", did, scopes, path, doc["title"], doc["body"],
             str(doc.get("metadata", {}).get("outcome", "")))

    # Claims, written by someone who reads the subject's scopes and writes the claim's: the
    # claim may be shared into scopes the subject is not (what a profile must not leak).
    define_shape(admin_engine, fixture.id, "ceo", max_count=1)
    for n in range(sizes.claims):
        subject = rng.choice(people)
        scopes = subset(rng, SCOPES, 1, 2)
        sentence = f"{rng.choice(PHRASES).capitalize()} {secrets.word()}."
        fact: dict[str, Any] = {"subjectId": subject.id, "predicate": "status", "text": sentence,
                                "value": sentence, "scopes": scopes}
        read = list(subject.scopes)
        kind = n % 5
        if kind == 1:  # a relation: the community graph
            other = rng.choice([p for p in people if p is not subject])
            fact.update(predicate="works_with", objectId=other.id)
            fact.pop("value")
            read += other.scopes
        elif kind == 2:  # a keyed snapshot
            fact.update(factKey=f"kpi.{secrets.word()}", asOf=f"2024-0{rng.randint(1, 9)}-01T00:00:00Z",
                        value=rng.randint(1, 99))
        elif kind == 3:  # an opinion: its author's perspective profile
            fact.update(kind="opinion", predicate="opinion")
        elif kind == 4:  # functional under the shape: conflicts across scope sets
            fact.update(predicate="ceo", value=secrets.word())
            sentence = f"The CEO is {fact['value']}."
            fact["text"] = sentence
        author = Writer(server, org, f"u{rng.randint(0, 3)}", tuple(sorted(set(read))), tuple(scopes))
        landed = author.gql(FACT, {"i": fact})["assertFact"]
        rid = landed["claimId"] or landed["quarantineId"]
        if landed["claimId"]:
            hold("knowledge.fact_claim", rid, scopes, sentence, str(fact.get("value", "")),
                 fact.get("factKey"))

    # Session notes (private to their user), decisions and an episode.
    for _ in range(sizes.notes):
        user, scopes = f"u{rng.randint(0, 3)}", subset(rng, SCOPES, 1, 2)
        note = f"Remember that {secrets.word()} {rng.choice(PHRASES)} {secrets.word()}."
        nid = Writer(server, org, user, (), tuple(scopes)).gql(
            REMEMBER, {"s": "s1", "t": note, "sc": scopes})["remember"]
        hold("memory.working_memory", nid, scopes, note, owner=user)
    for _ in range(sizes.decisions):
        scopes = subset(rng, SCOPES, 1, 2)
        decision = {"category": "plan", "scenario": f"Pick {secrets.word()}",
                    "reasoning": f"Because {secrets.word()} is cheaper.", "confidence": 0.8,
                    "scopes": scopes}
        did = everything.gql(DECISION, {"i": decision})["recordDecision"]
        hold("memory.decisions", did, scopes, decision["scenario"], decision["reasoning"])
    scopes = subset(rng, SCOPES, 1, 1)
    summary = f"We discussed {secrets.word()} at length."
    eid = Writer(server, org, "u0", (), tuple(scopes)).gql(
        EPISODE, {"s": "s9", "t": summary, "sc": scopes})["recordEpisode"]
    hold("memory.episodes", eid, scopes, summary)
    world.questions[org] = [f"What is the status of {p.name}?" for p in rng.sample(people, 2)] + [
        f"What did {rng.choice([p for p in people if p.alias] or people).alias or 'anyone'} report?",
        "Which project is delayed and who decided?"]
