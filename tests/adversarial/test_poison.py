"""Poison pills: one bad item in every background job; the rest proceed, the bad one is counted
and shown (the job's line and notes, the log, ``memory.job_runs``).

The extraction case is the one found in the wild: an entity mention longer than an entity
name may be (a README's run of capitalised words that NER takes for one organisation) made
``knowledge.resolve_entity`` fail ``ck_entities_canonical_name_length`` and with it the
tenant's whole extraction job, on every tick. The other jobs meet a row the database
refuses (``tests.support.poison.refused``: a check the job did not foresee) for one of
their items. The embedding queue's poison (a text the model fails on) is
``tests/test_worker_queue.py::test_poisoned_row_is_marked_failed_and_the_rest_complete``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from orchestrator.config import Settings
from orchestrator.db.derive_models import JobRun
from orchestrator.db.knowledge_models import (
    Community,
    Decision,
    Entity,
    Episode,
    Observation,
    Profile,
    RaptorNode,
    ValueDaily,
)
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.derive.extract import MAX_ENTITY_NAME_CHARS
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.ingest.knowledge import FactInput, assert_fact, assert_relation, resolve_entity
from orchestrator.ingest.memory import add_working_memory
from tests.conftest import TenantFixture, TestDatabase
from tests.support.poison import refused, run_as_service, runs
from tests.support.recall import doc, embedder, write_documents

__all__ = ["embedder"]

Tenants = Callable[..., TenantFixture]
# A README's line of capitalised words: spaCy's NER reads it as one organisation of 800+ characters.
def marker(prefix: str) -> str:
    """A unique word of letters only: the quality gates (derive_quality_gates) keep a name or a
    sentence with a hex token out of derived memory before the database could refuse it, which
    made these tests pass or fail with the random digits."""
    return prefix + uuid.uuid4().hex[:8].translate(str.maketrans("0123456789", "ghijklmnop"))


LONG_NAME_TEXT = "The " + " ".join(["Northwind"] * 80) + " Trading Company signed the deal."


@pytest.fixture
def t(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "hr")


def count(app_engine: Engine, t: TenantFixture, model: Any, *where: Any) -> int:
    with bound_session(app_engine, t.identity("auditor", read=("team", "hr"))) as s:
        return int(s.execute(select(func.count()).select_from(model).where(*where)).scalar_one())


def shown(result: Any, admin_engine: Engine, t: TenantFixture, job: str, item: str) -> None:
    """The skip is counted in the line, named in the notes and kept in memory.job_runs."""
    assert result.ok, result.line
    assert result.line.endswith("; 1 skipped"), result.line
    assert any(item in note for note in result.notes), result.notes
    [run] = [r for r in runs(admin_engine, t) if r["job"] == job]
    assert run["ok"] and run["skipped"] == 1 and run["run_by"] == "service:derive"
    assert item in run["problems"][0]["item"], run["problems"]
    assert sorted(run["scopes"]) == sorted(t.scopes.values())


def test_extract_skips_a_mention_too_long_to_be_a_name_and_reads_everything_else(
        app_engine: Engine, admin_engine: Engine, t: TenantFixture, settings: Settings) -> None:
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        put_document(s, DocumentInput(collection="notes", path="readme.md", title="Readme",
                                      body=LONG_NAME_TEXT, scopes=("team",)))
        for i, (who, where) in enumerate([("Ada Lovelace", "London"), ("Grace Hopper", "Arlington")]):
            put_document(s, DocumentInput(collection="notes", path=f"n{i}.md", title=f"N{i}",
                                          body=f"{who} gave a talk in {where}.", scopes=("team",)))
    # Before: the whole job failed with ck_entities_canonical_name_length, on every tick. The
    # quality gates (on by default) drop such a mention before it is a name at all; the length
    # guard is what stands when they are off, so it is tested with them off.
    result = run_as_service(app_engine, t, "extract",
                            settings.model_copy(update={"derive_quality_gates": False}))
    shown(result, admin_engine, t, "extract", "entity mention(s) in chunk")
    assert "1 entity mentions too long to be a name skipped" in result.line
    assert "longer than the 500 characters" in result.notes[-1]
    assert "3 chunks read" in result.line, "the poisoned chunk's other claims are read too"
    names = {n for (n,) in _rows(app_engine, t, select(Entity.canonical_name))}
    assert {"Ada Lovelace", "Grace Hopper", "London"} <= names
    assert max(len(n) for n in names) <= MAX_ENTITY_NAME_CHARS
    # The next tick has nothing left to read: the chunk is not retried forever.
    again = run_as_service(app_engine, t, "extract", settings)
    assert again.ok and "0 chunks read" in again.line and "skipped" not in again.line
    # The run is readable by a reader of every scope it covered, and by nobody less.
    with bound_session(app_engine, t.identity("carol", read=("team", "hr"))) as s:
        assert s.execute(select(func.count()).select_from(JobRun)).scalar_one() == 1
    with bound_session(app_engine, t.identity("dave", read=("team",), write=("team",))) as s:
        assert s.execute(select(func.count()).select_from(JobRun)).scalar_one() == 0


def test_extract_skips_a_chunk_the_database_refuses_and_does_not_read_it_again(
        app_engine: Engine, admin_engine: Engine, t: TenantFixture, settings: Settings) -> None:
    mark = marker("poison")
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        for i, (who, extra) in enumerate((("Ada Lovelace", ""), ("Charles Babbage", f" with {mark}"),
                                          ("Grace Hopper", ""))):
            put_document(s, DocumentInput(collection="notes", path=f"c{i}.md", title=f"C{i}",
                                          body=f"{who} visited Paris in 1843{extra}.", scopes=("team",)))
    # The claims' sentence of the middle chunk is refused.
    with refused(admin_engine, "knowledge.fact_content", f"new.text like '%{mark}%'"):
        result = run_as_service(app_engine, t, "extract", settings)
        shown(result, admin_engine, t, "extract", "chunk ")
        assert "2 chunks read" in result.line and "1 chunks skipped" in result.line
        # Recorded as read with nothing taken: the next tick does not stumble on it again.
        again = run_as_service(app_engine, t, "extract", settings)
        assert again.ok and "0 chunks read" in again.line
    names = {n for (n,) in _rows(app_engine, t, select(Entity.canonical_name))}
    assert {"Ada Lovelace", "Grace Hopper", "Paris"} <= names and "Charles Babbage" not in names


def test_consolidate_skips_one_observation(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                           settings: Settings) -> None:
    mark = marker("poison")
    for user in ("alice", "bob"):
        with bound_session(app_engine, t.identity(user, write=("team",))) as s:
            ada = resolve_entity(s, "person", "Ada Lovelace", ("team",))
            zed = resolve_entity(s, "person", "Zed Zimmer", ("team",))
            assert ada and zed
            assert_fact(s, FactInput(subject_id=ada, predicate="works_at", text="Ada works at Acme.",
                                     value="Acme", scopes=("team",), confidence=0.8))
            assert_fact(s, FactInput(subject_id=zed, predicate="works_at", text=f"Zed works at {mark}.",
                                     value=mark, scopes=("team",), confidence=0.8))
    with refused(admin_engine, "memory.observations", f"new.text like '%{mark}%'"):
        result = run_as_service(app_engine, t, "consolidate", settings)
    shown(result, admin_engine, t, "consolidate", "observation obs:")
    assert "observations: 1 inserted" in result.line
    assert count(app_engine, t, Observation) == 1


def test_episodes_skip_one_session(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                   settings: Settings) -> None:
    mark = marker("poison")
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        add_working_memory(s, "s1", "We walked along the river.", ("team",))
        add_working_memory(s, "s2", f"The {mark} meeting ran long.", ("team",))
        add_working_memory(s, "s3", "Lunch was at noon.", ("team",))
    with refused(admin_engine, "memory.episodes", f"new.summary like '%{mark}%'"):
        result = run_as_service(app_engine, t, "episodes", settings)
    shown(result, admin_engine, t, "episodes", "working-memory session 's2' of alice")
    assert "episodes: 2 inserted" in result.line
    assert count(app_engine, t, Episode) == 0, "private to alice"
    with bound_session(app_engine, t.identity("alice", read=("team",))) as s:
        assert s.execute(select(func.count()).select_from(Episode)).scalar_one() == 2


def test_decisions_skip_one_decision(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                     settings: Settings) -> None:
    mark = marker("poison")
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        add_working_memory(s, "s1", "Ship on Friday because the demo is Monday.", ("team",),
                           kind="decision", category="release")
        add_working_memory(s, "s1", f"Use {mark} because it is cheap.", ("team",),
                           kind="decision", category="release")
        add_working_memory(s, "s1", "Freeze on Thursday because QA needs a day.", ("team",),
                           kind="decision", category="release")
    with refused(admin_engine, "memory.decisions", f"new.scenario like '%{mark}%'"):
        result = run_as_service(app_engine, t, "decisions", settings)
    shown(result, admin_engine, t, "decisions", "the decision of working-memory item")
    assert "decisions: 2 recorded" in result.line
    assert count(app_engine, t, Decision) == 2


def _relate(app_engine: Engine, t: TenantFixture, scope: str, names: list[str]) -> None:
    with bound_session(app_engine, t.identity("alice", write=(scope,))) as s:
        ids = [resolve_entity(s, "thing", n, (scope,)) for n in names]
        for a, b in itertools.pairwise(ids):
            assert a and b
            assert assert_relation(s, a, "related_to", b, f"{a} works with {b}.", (scope,)).claim_id


def test_communities_skip_one_scope_set(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                        settings: Settings) -> None:
    _relate(app_engine, t, "team", ["Alpha", "Beta", "Delta"])
    _relate(app_engine, t, "hr", ["Gamma", "Epsilon", "Zeta"])
    hr = t.scopes["hr"]
    with refused(admin_engine, "memory.communities", f"new.scopes = array['{hr}'::uuid]"):
        result = run_as_service(app_engine, t, "communities", settings)
    shown(result, admin_engine, t, "communities", f"the communities of scope set {hr}")
    assert count(app_engine, t, Community, Community.scopes == [t.scopes["team"]]) >= 1
    assert count(app_engine, t, Community, Community.scopes == [hr]) == 0


def test_profiles_skip_one_profile(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                   settings: Settings) -> None:
    mark = marker("Poison")
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        for name in ("Ada Lovelace", f"Zed {mark}", "Grace Hopper"):
            who = resolve_entity(s, "person", name, ("team",))
            assert who
            assert_fact(s, FactInput(subject_id=who, predicate="role", text=f"{name} writes compilers.",
                                     value="engineer", scopes=("team",)))
    with refused(admin_engine, "memory.profiles", f"new.summary like '%{mark}%'"):
        result = run_as_service(app_engine, t, "profiles", settings)
    shown(result, admin_engine, t, "profiles", "the profile of entity")
    assert "profiles: 2 inserted" in result.line
    assert count(app_engine, t, Profile) == 2


def test_raptor_skips_one_scope_set(test_db: TestDatabase, app_engine: Engine, admin_engine: Engine,
                                    t: TenantFixture, settings: Settings, embedder: Any) -> None:
    docs = [doc(f"{scope}{i}.md", f"{scope} {i}", f"Notes {i} on {topic} for the {scope} group.",
                (scope,))
            for scope in ("team", "hr") for i, topic in enumerate(("rivers", "bridges", "orchards"))]
    write_documents(app_engine, t.identity("alice", write=("team", "hr")), embedder, docs, settings)
    hr = t.scopes["hr"]
    with refused(admin_engine, "memory.raptor_nodes", f"new.scopes = array['{hr}'::uuid]"):
        result = run_as_service(app_engine, t, "raptor", settings)
    shown(result, admin_engine, t, "raptor", f"the RAPTOR tree of scope set {hr}")
    assert count(app_engine, t, RaptorNode, RaptorNode.scopes == [t.scopes["team"]]) >= 1
    assert count(app_engine, t, RaptorNode, RaptorNode.scopes == [hr]) == 0


def test_lifecycle_skips_one_document(app_engine: Engine, admin_engine: Engine, t: TenantFixture,
                                      settings: Settings) -> None:
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        for path in ("a.md", "poison.md", "c.md"):
            put_document(s, DocumentInput(collection="old", path=path, title=path, body=f"Old {path}.",
                                          scopes=("team",)))
        s.execute(text("insert into memory.lifecycle_policies (collection, archive_after_days) "
                       "values ('old', 1)"))
    with admin_engine.begin() as conn:  # unused for ten days (as tests/test_derive_lifecycle.py ages them)
        conn.execute(text("alter table sources.documents disable trigger tg_documents__normalize"))
        conn.execute(text("update sources.documents set updated_at = now() - interval '10 days' "
                          "where tenant_id = :t"), {"t": t.id})
        conn.execute(text("alter table sources.documents enable trigger tg_documents__normalize"))
    with refused(admin_engine, "sources.documents",
                 f"new.tenant_id = '{t.id}' and new.path = 'poison.md' and new.archived_at is not null"):
        result = run_as_service(app_engine, t, "lifecycle", settings)
    shown(result, admin_engine, t, "lifecycle", "document old/poison.md")
    assert "lifecycle: 2 documents archived" in result.line
    archived = {p for (p,) in _rows(app_engine, t, select(Document.path).where(
        Document.archived_at.is_not(None)))}
    assert archived == {"a.md", "c.md"}


def test_usage_skips_one_aggregate_and_writes_the_rest(app_engine: Engine, admin_engine: Engine,
                                                       t: TenantFixture, settings: Settings) -> None:
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        document = put_document(s, DocumentInput(collection="n", path="u.md", title="u", body="Used.",
                                                 scopes=("team",))).document_id
        s.execute(text("insert into memory.usage_ledger (operation, channel, item_table, item_id) "
                       "values ('mark_used', 'python', 'sources.documents', :d), "
                       "('poison_op', 'python', null, null)"), {"d": document})
    with refused(admin_engine, "memory.usage_daily",
                 f"new.tenant_id = '{t.id}' and new.operation = 'poison_op'"):
        result = run_as_service(app_engine, t, "usage", settings)
    shown(result, admin_engine, t, "usage", "memory.usage_daily of ")
    assert "value_daily: 1 rows changed" in result.line
    assert count(app_engine, t, ValueDaily) == 1


def _rows(app_engine: Engine, t: TenantFixture, query: Any) -> list[Any]:
    with bound_session(app_engine, t.identity("auditor", read=("team", "hr"))) as s:
        return list(s.execute(query).all())
