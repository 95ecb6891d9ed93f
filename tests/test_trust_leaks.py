"""Nothing from a row the reader cannot read reaches a read surface: derived text, recall, trace,
conflicts and references (issue 16, leaks 1 and 2). Each test builds the cross-scope situation
an outside attacker found and reads as someone who may see only part of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, update

from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Entity, FactClaim, Profile
from orchestrator.db.session import bound_session
from orchestrator.derive.extract import extract
from orchestrator.derive.profiles import refresh
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.ingest.knowledge import (
    FactInput,
    assert_fact,
    conflicts,
    current_facts,
    detect_conflicts,
    resolve_entity,
)
from orchestrator.recall import Recaller
from tests.conftest import TenantFixture
from tests.support.knowledge import define_shape
from tests.support.recall import embedder  # noqa: F401

Tenants = Callable[..., TenantFixture]
HIDDEN_NAME = "Hessaly Quornwright"
WORD = "zxqdelayword"


@pytest.fixture
def tenant(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("board", "hr")


def _entity(app_engine: Engine, t: TenantFixture, name: str, scopes: tuple[str, ...]) -> uuid.UUID:
    with bound_session(app_engine, t.identity("dba", write=scopes)) as s:
        found = resolve_entity(s, "person", name, scopes)
    assert found is not None
    return found


def _claim(app_engine: Engine, t: TenantFixture, subject: uuid.UUID, sentence: str,
           scopes: tuple[str, ...], **kw: Any) -> uuid.UUID:
    # The writer reads hr and writes board: it may name an hr entity in a board claim.
    with bound_session(app_engine, t.identity("writer", read=("hr",), write=scopes)) as s:
        result = assert_fact(s, FactInput(subject_id=subject, predicate=kw.pop("predicate", "status"),
                                          text=sentence, scopes=scopes,
                                          **({"value": sentence} | kw)))  # type: ignore[arg-type]
    assert result.claim_id is not None
    return result.claim_id


def _all(t: TenantFixture) -> Any:
    return t.identity("service", write=tuple(t.scopes))


def test_a_profile_is_never_titled_with_a_name_its_readers_cannot_read(
        app_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    hidden = _entity(app_engine, t, HIDDEN_NAME, ("hr",))
    shared = _entity(app_engine, t, "Brevan Oltmark", ("board", "hr"))
    _claim(app_engine, t, hidden, f"status is delayed {WORD}", ("board",))
    _claim(app_engine, t, shared, "status is on time", ("board",))
    with bound_session(app_engine, _all(t)) as s:
        report = refresh(s)
    assert report.withheld == 1 and report.inserted == 1
    with bound_session(app_engine, t.identity("b", read=("board",))) as s:
        summaries = list(s.execute(select(Profile.summary)).scalars())
    assert summaries == ["Brevan Oltmark: status is on time."]
    # A profile stored before (by an older build) is deleted by the next run.
    with bound_session(app_engine, _all(t)) as s:
        s.execute(insert(Profile).values(subject_entity_id=hidden, perspective_key="world",
                                         scopes=[t.scopes["board"]],
                                         summary=f"{HIDDEN_NAME}: status is delayed {WORD}",
                                         summary_method="extractive"))
    with bound_session(app_engine, _all(t)) as s:
        assert refresh(s).deleted == 1
    with bound_session(app_engine, t.identity("b", read=("board",))) as s:
        assert all(HIDDEN_NAME not in x for x in s.execute(select(Profile.summary)).scalars())


def test_recall_and_trace_never_serve_a_profile_of_an_entity_the_reader_cannot_read(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture, settings: Settings,
        embedder: Any) -> None:  # noqa: F811
    t = tenant
    hidden = _entity(app_engine, t, HIDDEN_NAME, ("hr",))
    summary = f"{HIDDEN_NAME}: status of the merger is delayed {WORD}"
    # Such a row is what derivation wrote before it withheld these profiles; render must not
    # serve it either (the recall statement hydrates the subject under the reader's policies).
    with bound_session(app_engine, _all(t)) as s:
        pid = s.execute(insert(Profile).values(
            subject_entity_id=hidden, perspective_key="world", scopes=[t.scopes["board"]],
            summary=summary, summary_method="extractive").returning(Profile.id)).scalar_one()
    with admin_engine.begin() as conn:
        conn.execute(update(Profile).where(Profile.id == pid).values(
            embedding=embedder.embed_passages([summary])[0], embed_state="ready"))
    recaller = Recaller(app_engine, settings, embedder=embedder)
    question = "Is the merger delayed?"
    board_only = t.identity("b", read=("board",))
    result, trace = recaller.trace(board_only, question)
    prepared, prepared_trace = recaller.prepare(board_only, question)
    for shown in (result.rendered, trace.format(), prepared.rendered, prepared_trace.format()):
        assert HIDDEN_NAME not in shown and WORD not in shown and str(pid)[-8:] not in shown
    # The control: a reader of both scopes is served the profile.
    result, trace = recaller.trace(t.identity("both", read=("board", "hr")), question)
    assert HIDDEN_NAME in result.rendered and HIDDEN_NAME in trace.format()


def test_extraction_links_a_mention_only_to_an_entity_every_reader_of_the_chunk_can_read(
        app_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    hidden = _entity(app_engine, t, "Ada Lovelace", ("hr",))
    with bound_session(app_engine, t.identity(write=("board",))) as s:
        put_document(s, DocumentInput(collection="notes", path="ada.md", title="Ada",
                                      body="Ada Lovelace worked with Charles Babbage in London.",
                                      scopes=("board",)))
    with bound_session(app_engine, _all(t)) as s:
        report = extract(s)
        linked = s.execute(select(Entity.id, Entity.scopes).where(Entity.id.in_(report.entities))).all()
        about_hidden = s.execute(select(FactClaim.id).where(FactClaim.subject_id == hidden)).all()
    assert report.chunks == 1 and hidden not in report.entities
    assert all(t.scopes["board"] in scopes for _, scopes in linked)
    assert about_hidden == []


def test_a_conflict_shows_only_to_readers_of_both_claims(app_engine: Engine, admin_engine: Engine,
                                                          tenant: TenantFixture) -> None:
    t = tenant
    define_shape(admin_engine, t.id, "ceo", max_count=1)
    acme = _entity(app_engine, t, "Acme Holdings", ("board", "hr"))
    board_claim = _claim(app_engine, t, acme, "The CEO is Ann.", ("board",), predicate="ceo",
                         value="Ann")
    with bound_session(app_engine, t.identity("h", write=("hr",))) as s:
        hr_claim = assert_fact(s, FactInput(subject_id=acme, predicate="ceo", text="The CEO is Bo.",
                                            value="Bo", scopes=("hr",))).claim_id
    with bound_session(app_engine, _all(t)) as s:
        detect_conflicts(s)
    with bound_session(app_engine, t.identity("b", read=("board",))) as s:
        seen_by_board = conflicts(s)
    with bound_session(app_engine, t.identity("x", read=("board", "hr"))) as s:
        seen_by_both = conflicts(s)
    assert seen_by_board == []
    assert [{c.claim_a, c.claim_b} for c in seen_by_both] == [{board_claim, hr_claim}]


def test_a_readable_claim_never_names_an_entity_the_reader_cannot_read(
        app_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    board_person = _entity(app_engine, t, "Brevan Oltmark", ("board",))
    hidden = _entity(app_engine, t, HIDDEN_NAME, ("hr",))
    with bound_session(app_engine, t.identity("x", read=("hr",), write=("board",))) as s:
        assert_fact(s, FactInput(subject_id=board_person, predicate="reports_to",
                                 text="Brevan reports to someone.", object_id=hidden,
                                 scopes=("board",)))
    with bound_session(app_engine, t.identity("b", read=("board",))) as s:
        [fact] = current_facts(s, board_person)
    assert fact.object_id is None and fact.text == "Brevan reports to someone."
    with bound_session(app_engine, t.identity("x", read=("board", "hr"))) as s:
        assert [f.object_id for f in current_facts(s, board_person)] == [hidden]
