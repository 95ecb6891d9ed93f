"""What was derived from a document leaves with its readers, in the same transaction (0094).

A document the derive jobs have read (claims, RAPTOR summaries, a community summary, an
entity profile) is moved from ``team`` to ``exec``: a ``team`` reader must not be served any
of it, not until the next derive run but at once. Widening the audience withdraws nothing; the
next derive run builds the summaries in the new scope set; deleting the document withdraws
them for its readers too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.session import bound_session
from orchestrator.derive.jobs import DeriveScheduler
from orchestrator.ingest.documents import delete_document, put_document
from orchestrator.recall import Recaller
from orchestrator.worker.queue import QueueWorker
from tests.conftest import TenantFixture, TestDatabase
from tests.support.recall import doc, embedder

__all__ = ["embedder"]

BODY = """# Project Falcon

Project Falcon is the plan to acquire Zephyr Robotics for 40 million euros.
Priya Raman leads Project Falcon and reports to the board every Friday.
The acquisition of Zephyr Robotics closes in March if the board agrees.

## Risks

Zephyr Robotics has debts of 12 million euros that Project Falcon must cover.
Priya Raman thinks the Zephyr Robotics engineers will stay after the acquisition.
"""
OTHER = """# Office move

The office moves to the harbour building in June. Lena Fischer plans the move with the
facilities team, and the old office closes at the end of June.
"""

# Every derived surface that holds text, as the reader's policies show it.
DERIVED = """
select 'raptor', summary from memory.raptor_nodes
union all select 'community', summary from memory.communities
union all select 'profile', summary from memory.profiles
union all select 'observation', text from memory.observations
union all select 'decision', embed_text from memory.decisions
union all select 'claim', ct.text from knowledge.fact_claim c
  join knowledge.fact_content ct on ct.tenant_id = c.tenant_id and ct.id = c.content_id
 where c.superseded_at is null
"""


def _derived(app_engine: Engine, t: TenantFixture, scope: str, word: str) -> list[str]:
    """The kinds of derived row a reader of ``scope`` is shown that hold ``word``."""
    with bound_session(app_engine, t.identity("reader", read=(scope,))) as s:
        rows = s.execute(text(DERIVED)).all()
    return sorted({kind for kind, body in rows if body and word.lower() in body.lower()})


def _derive(test_db: TestDatabase, app_engine: Engine, settings: Settings, embedder: Any,
            t: TenantFixture) -> None:
    worker = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=2)
    try:
        QueueWorker(worker, embedder, settings, tenants=[t.id]).drain()
        report = DeriveScheduler(worker, app_engine, settings, tenants=[t.id]).tick()
        assert not report.failed, [r.render() for r in report.failed]
        QueueWorker(worker, embedder, settings, tenants=[t.id]).drain()
    finally:
        worker.dispose()


def _put(app_engine: Engine, t: TenantFixture, path: str, body: str, scopes: tuple[str, ...]) -> None:
    with bound_session(app_engine, t.identity("alice", write=("team", "exec"))) as s:
        put_document(s, doc(path, path, body, scopes=scopes))


def test_a_document_moved_to_a_narrower_audience_takes_what_was_derived_from_it(
        test_db: TestDatabase, app_engine: Engine, settings: Settings, embedder: Any,
        tenant_factory: Any) -> None:
    t = tenant_factory("team", "exec")
    _put(app_engine, t, "falcon.md", BODY, ("team",))
    _put(app_engine, t, "office.md", OTHER, ("team",))
    _derive(test_db, app_engine, settings, embedder, t)
    made = _derived(app_engine, t, "team", "Zephyr")
    assert {"claim", "raptor", "community"} <= set(made), made
    others = _derived(app_engine, t, "team", "Lena")
    assert {"claim", "profile"} <= set(others), others

    # Wider first: every team reader still reads the document, so nothing is withdrawn.
    _put(app_engine, t, "falcon.md", BODY, ("exec", "team"))
    assert _derived(app_engine, t, "team", "Zephyr") == made
    _put(app_engine, t, "falcon.md", BODY, ("team",))
    assert _derived(app_engine, t, "team", "Zephyr") == made

    # Narrower: at once, before any derive run, the team reader is shown none of it.
    _put(app_engine, t, "falcon.md", BODY, ("exec",))
    assert _derived(app_engine, t, "team", "Zephyr") == []
    assert _derived(app_engine, t, "team", "Priya") == []
    with bound_session(app_engine, t.identity("bob", read=("team",))) as s:  # by id, too
        kept = s.execute(text("select ct.text from knowledge.fact_claim c join knowledge.fact_content"
                              " ct on ct.tenant_id = c.tenant_id and ct.id = c.content_id")).scalars()
        assert not [x for x in kept if "Zephyr" in x or "Falcon" in x]
        names = s.execute(text("select canonical_name from knowledge.entities")).scalars()
        assert not [x for x in names if "Zephyr" in x or "Falcon" in x or "Priya" in x]
    team = Recaller(app_engine, settings, embedder=embedder).recall(
        t.identity("bob", read=("team",)), "What is Project Falcon? Who acquires Zephyr Robotics?")
    served = "\n".join(e.text for e in team.evidence)
    assert team.evidence and "Zephyr" not in served and "Falcon" not in served, team.rendered
    # What the team's other document gave stays: its claims and its person's profile (a
    # RAPTOR leaf it shared with the moved document went, and comes back at the next run).
    assert _derived(app_engine, t, "team", "Lena") == others

    # The next run builds it again where its readers are; the team tree is whole again.
    _derive(test_db, app_engine, settings, embedder, t)
    assert {"claim", "raptor"} <= set(_derived(app_engine, t, "exec", "Zephyr"))
    assert _derived(app_engine, t, "team", "Zephyr") == []
    assert "raptor" in _derived(app_engine, t, "team", "harbour")

    # Deleted: its readers are shown nothing derived from it either.
    with bound_session(app_engine, t.identity("alice", write=("exec",))) as s:
        delete_document(s, "notes", "falcon.md")
    assert _derived(app_engine, t, "exec", "Zephyr") == []
    _derive(test_db, app_engine, settings, embedder, t)
    assert _derived(app_engine, t, "exec", "Zephyr") == []


def test_an_edit_that_keeps_the_audience_keeps_the_summaries_until_the_next_run(
        test_db: TestDatabase, app_engine: Engine, settings: Settings, embedder: Any,
        tenant_factory: Any) -> None:
    t = tenant_factory("team", "exec")
    _put(app_engine, t, "falcon.md", BODY, ("team",))
    _derive(test_db, app_engine, settings, embedder, t)
    summaries = [k for k in _derived(app_engine, t, "team", "Zephyr") if k != "claim"]
    assert summaries
    # The same readers: the old chunk's claims are retracted (0018), its summaries wait for
    # the next run, which brings them up to date.
    _put(app_engine, t, "falcon.md", BODY.replace("40 million", "45 million"), ("team",))
    assert _derived(app_engine, t, "team", "40 million") == summaries
    _derive(test_db, app_engine, settings, embedder, t)
    assert "claim" in _derived(app_engine, t, "team", "45 million")
    assert _derived(app_engine, t, "team", "40 million") == []
