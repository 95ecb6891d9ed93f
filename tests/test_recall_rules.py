"""Recall rules that need their own corpus: session-scoped working memory, near-duplicates
by meaning, keyed-fact snapshots, the graph walk's bounds, seeds under RLS and the
hydration report under RLS.

Each test builds a fresh tenant, so what it asserts cannot come from another test's rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import numpy as np
import pytest

from orchestrator.db.session import bound_session
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from orchestrator.recall import FULL_PLAN
from orchestrator.recall.result import ScopeRef
from orchestrator.recall.tail import Candidate, suppress_duplicates
from tests.support.recall import doc, embed_pending, embedder, recaller_with, write_documents

__all__ = ["embedder"]

DAY = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def _claims(trace, lane):
    return {it.key.split(":", 1)[1] for it in trace.pools.get(lane, [])}


def test_working_memory_reads_the_named_session_only(tenant_factory, app_engine, embedder,
                                                     settings, test_db):
    t = tenant_factory("team")
    alice = t.identity("alice", write=("team",))
    with bound_session(app_engine, alice) as s:
        kitchen = mem.add_working_memory(s, "kitchen", "The oven timer is set for 40 minutes.",
                                         ["team"])
        garage = mem.add_working_memory(s, "garage", "The oven mitts are in the garage drawer.",
                                        ["team"])
    embed_pending(test_db, embedder, settings, t.id)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    question = "what about the oven?"

    def notes(session):
        result, trace = recaller.trace(alice, question, session=session)
        return ({e.item_id for e in result.evidence if e.kind == "session note"},
                {it.key for it in trace.pools.get("working_memory", [])}, trace)

    every, _, _ = notes(None)
    assert every == {kitchen, garage}
    only_kitchen, pool, trace = notes("kitchen")
    assert only_kitchen == {kitchen}
    assert f"memory.working_memory:{garage}" not in pool
    assert "session 'kitchen'" in trace.format()
    assert notes("garage")[0] == {garage}
    assert notes("nowhere")[0] == set()


@pytest.mark.parametrize("session", ["", "  ", "x" * 201, 7])
def test_a_bad_session_is_refused(tenant_factory, app_engine, embedder, settings, session):
    from orchestrator.errors import BadInput

    t = tenant_factory("team")
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    with pytest.raises(BadInput, match="session must be non-empty text"):
        recaller.recall(t.identity(), "anything", session=session)


def test_near_duplicates_by_meaning_are_suppressed_not_only_identical_text():
    scope = (ScopeRef("team", ""),)

    def cand(key, text, vec):
        return Candidate(key=key, kind="source", text=text, scopes=scope,
                         embedding=np.asarray(vec, dtype=np.float32))

    first = cand("a", "The boiler is serviced on 14 March.", [1.0, 0.0, 0.0])
    # Different words, almost the same direction: cosine 0.98 >= 0.95.
    twin = cand("b", "Boiler service: March 14th.", [0.98, 0.199, 0.0])
    other = cand("c", "The car's MOT is due in April.", [0.6, 0.0, 0.8])
    kept, dropped = suppress_duplicates([first, twin, other], 0.95)
    assert [c.key for c in kept] == ["a", "c"]
    assert [(d.key, w.key) for d, w, _ in dropped] == [("b", "a")]
    assert dropped[0][2] == pytest.approx(0.98, abs=0.005)
    # Just under the threshold both stay.
    kept, dropped = suppress_duplicates([first, twin, other], 0.99)
    assert [c.key for c in kept] == ["a", "b", "c"] and dropped == []


def test_only_the_newest_keyed_snapshot_is_served(tenant_factory, app_engine, embedder,
                                                  settings, test_db):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        acme = kn.resolve_entity(s, "org", "Acme", ["team"])
        old = kn.assert_keyed_fact(
            s, kn.FactInput(subject_id=acme, predicate="headcount", text="Acme has 120 staff.",
                            scopes=("team",), value="120"),
            fact_key="acme.headcount", as_of=DAY - timedelta(days=60), authority=50).claim_id
        new = kn.assert_keyed_fact(
            s, kn.FactInput(subject_id=acme, predicate="headcount", text="Acme has 150 staff.",
                            scopes=("team",), value="150"),
            fact_key="acme.headcount", as_of=DAY, authority=50).claim_id
    embed_pending(test_db, embedder, settings, t.id)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    result = recaller.recall(ident, "How many staff does Acme have?")
    served = {e.item_id for e in result.evidence}
    assert new in served
    assert old not in served
    assert "Acme has 120 staff." not in result.rendered
    keyed = next(e for e in result.evidence if e.item_id == new)
    assert keyed.kind == "keyed fact" and keyed.fact.as_of == DAY


def test_graph_walk_respects_depth_and_fanout(tenant_factory, app_engine, embedder, settings,
                                              test_db):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        chain = [kn.resolve_entity(s, "org", name, ["team"])
                 for name in ("Zephyrcorp", "Hub B", "Hub C", "Hub D")]
        hops = [kn.assert_relation(s, a, "supplies", b, f"{i}: link {i + 1}", ["team"],
                                   confidence=0.4).claim_id
                for i, (a, b) in enumerate(pairwise(chain))]
        spokes = [kn.assert_relation(
            s, chain[0], "partners_with", kn.resolve_entity(s, "org", f"Spoke {n}", ["team"]),
            f"spoke {n}", ["team"], confidence=0.5 + n / 100).claim_id for n in range(6)]
    embed_pending(test_db, embedder, settings, t.id)
    question = "Who does Zephyrcorp work with?"

    def graph(**limits):
        r = recaller_with(app_engine, settings, embedder, recall_receipts=False, **limits)
        return _claims(r.study(ident, question, FULL_PLAN.only("g", "graph"))[1], "graph")

    wide = graph(recall_graph_depth=3, recall_graph_fanout=10, recall_graph_k=30)
    assert {str(c) for c in hops + spokes} <= wide
    two = graph(recall_graph_depth=2, recall_graph_fanout=10, recall_graph_k=30)
    assert str(hops[0]) in two and str(hops[1]) in two and str(hops[2]) not in two
    # Fan-out 3: Zephyrcorp's three strongest edges (the spokes of highest confidence).
    narrow = graph(recall_graph_depth=1, recall_graph_fanout=3, recall_graph_k=30)
    assert narrow == {str(c) for c in spokes[-3:]}
    capped = graph(recall_graph_depth=3, recall_graph_fanout=10, recall_graph_k=4)
    assert len(capped) == 4


def test_an_entity_the_reader_cannot_see_is_never_a_seed(tenant_factory, app_engine, embedder,
                                                        settings, test_db):
    t = tenant_factory("team", "exec")
    boss = t.identity("carol", write=("team", "exec"))
    reader = t.identity("dan", read=("team",))
    with bound_session(app_engine, boss) as s:
        globex = kn.resolve_entity(s, "org", "Globex", ["exec"])
        kn.assert_keyed_fact(
            s, kn.FactInput(subject_id=globex, predicate="offer", text="Globex offers 4 billion.",
                            scopes=("exec",), value="4bn"),
            fact_key="globex.offer", as_of=DAY, authority=90)
    write_documents(app_engine, boss, embedder, [
        doc("globex.md", "Globex", "Globex acquisition memo.", scopes=("exec",))], settings,
        **{"globex.md": {"archived_at": DAY}})
    embed_pending(test_db, embedder, settings, t.id)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    question = "What does Globex offer?"
    _, seen = recaller.trace(boss, question)
    assert seen.corpus["seeds"] == ["Globex"]
    assert [d.label.split(" #")[0] for d in seen.hydration_dropped] == ["Globex"]
    result, trace = recaller.trace(reader, question)
    assert trace.corpus["seeds"] == []
    assert trace.hydration_dropped == []
    assert result.evidence == ()
    text = trace.format()
    assert "Globex" not in text.replace(repr(question), "")


def test_the_facts_lane_takes_one_claim_per_sentence(tenant_factory, app_engine, embedder,
                                                     settings, test_db):
    """Extraction makes one claim per entity a sentence links, all with the sentence's text:
    the facts pool takes one of them, so other sentences still reach it."""
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    shared = "Lindqvist Labs maintains Quillstream in Oslo."
    with bound_session(app_engine, ident) as s:
        ids = []
        for name in ("Lindqvist Labs", "Quillstream", "Oslo", "Maren Okafor"):
            subject = kn.resolve_entity(s, "org", name, ["team"])
            ids.append(kn.assert_fact(s, kn.FactInput(
                subject_id=subject, predicate="mentioned_in", text=shared, scopes=("team",),
                value="Oslo")).claim_id)
        acme = kn.resolve_entity(s, "org", "Quillstream Press", ["team"])
        other = kn.assert_fact(s, kn.FactInput(
            subject_id=acme, predicate="maintains", text="Quillstream Press maintains the archive.",
            scopes=("team",), value="the archive")).claim_id
    embed_pending(test_db, embedder, settings, t.id)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    _, trace = recaller.trace(ident, "who maintains Quillstream?")
    facts = _claims(trace, "facts")
    assert len(facts & {str(i) for i in ids}) == 1, facts
    assert str(other) in facts
