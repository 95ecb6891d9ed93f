"""A tenant for the console tests: two scopes (alpha, beta) with documents, embeddings,
extracted claims (lineage), an open conflict, a quarantined claim and a recall receipt in each,
so every page has something to show and every deny test has something to hide.

Everything beta holds carries a marker (``BETA_MARKERS``) that no alpha reader may ever meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from orchestrator.db.session import bound_session
from orchestrator.derive.extract import extract
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest.documents import DocumentInput, put_document
from tests.conftest import TenantFixture
from tests.support.knowledge import define_shape

ALPHA_DOCS = {
    "kestrel.md": ("Kestrel launch plan",
                   "Ada Lovelace leads the Kestrel launch in Lisbon on 12 May 2026. "
                   "Charles Babbage reviews the Kestrel budget in London."),
    "harbour.md": ("Harbour maintenance",
                   "Grace Hopper schedules the harbour maintenance for the Kestrel crew in Porto."),
}
BETA_DOCS = {
    "osprey.md": ("Osprey covert plan",
                  "Zenobia Quartzfield runs the Osprey covert plan in Reykjavik. Kestrel is the cover."),
}
BETA_MARKERS = ("Osprey", "Zenobia", "Quartzfield", "Reykjavik", "osprey.md", "Sapphire",
                "Obsidian")


@dataclass
class Corpus:
    tenant: TenantFixture
    docs: dict[str, str] = field(default_factory=dict)  # path -> id
    conflicts: dict[str, str] = field(default_factory=dict)  # scope -> conflict id
    quarantine: dict[str, str] = field(default_factory=dict)  # scope -> quarantine id
    beta_ids: set[str] = field(default_factory=set)  # every id of a beta row

    def hidden(self) -> tuple[str, ...]:
        return (*BETA_MARKERS, *self.beta_ids)


def _claims(session: Any, scope: str, person: str, first: str, second: str,
            wrong_level: str) -> tuple[str, str, set[str]]:
    who = kn.resolve_entity(session, "person", person, (scope,))
    ids = {str(who)}
    for value in (first, second):
        r = kn.assert_fact(session, kn.FactInput(
            subject_id=who, predicate="lives_in", text=f"{person} lives in {value}",
            scopes=(scope,), value=value))
        ids.add(str(r.claim_id))
    kn.detect_conflicts(session)
    held = kn.assert_fact(session, kn.FactInput(
        subject_id=who, predicate="level", text=f"{person} is {wrong_level}", scopes=(scope,),
        value=wrong_level))
    assert held.quarantined
    conflict = session.execute(text("select id from knowledge.conflicts where subject_id = :s"),
                               {"s": who}).scalar_one()
    ids |= {str(conflict), str(held.quarantine_id)}
    return str(conflict), str(held.quarantine_id), ids


def build_corpus(tenant_factory: Any, app_engine: Engine, admin_engine: Engine, test_db: Any,
                 embedder: Any, settings: Any) -> Corpus:
    from tests.support.recall import embed_pending

    t = tenant_factory("alpha", "beta")
    corpus = Corpus(t)
    define_shape(admin_engine, t.id, "lives_in", max_count=1)
    define_shape(admin_engine, t.id, "level", allowed_values=["junior", "senior"])
    for scope, docs, user in (("alpha", ALPHA_DOCS, "alice"), ("beta", BETA_DOCS, "bob")):
        with bound_session(app_engine, t.identity(user, write=(scope,))) as s:
            for path, (title, body) in docs.items():
                corpus.docs[path] = str(put_document(s, DocumentInput(
                    collection="notes", path=path, title=title, body=body, scopes=(scope,)),
                    settings).document_id)
    embed_pending(test_db, embedder, settings, t.id)
    for scope, user, person, values, level in (
            ("alpha", "alice", "Ann Walker", ("Porto", "Braga"), "wizard"),
            ("beta", "bob", "Zenobia Quartzfield", ("Sapphire City", "Obsidian Town"), "Obsidian")):
        with bound_session(app_engine, t.identity(user, write=(scope,))) as s:
            extract(s)
            conflict, held, ids = _claims(s, scope, person, *values, level)
            corpus.conflicts[scope], corpus.quarantine[scope] = conflict, held
            if scope == "beta":
                corpus.beta_ids |= ids
    with admin_engine.connect() as conn:
        for table in ("sources.documents", "sources.chunks", "knowledge.fact_claim",
                      "knowledge.entities"):
            corpus.beta_ids |= {str(i) for i in conn.execute(text(
                f"select id from {table} where tenant_id = :t and :b = any(scopes)"),
                {"t": t.id, "b": t.scopes["beta"]}).scalars()}
    return corpus
