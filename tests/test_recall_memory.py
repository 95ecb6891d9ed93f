"""The knowledge and derived-memory lanes of the recall statement, on a real database.

One corpus per module: documents, entities, facts (a keyed fact and the prose it
beats, an expired claim), relations two hops deep, a community, a RAPTOR tree,
working memory of two users, a profile, an episode, observations on both sides
of the confidence gate, decisions with a causal link and a dated journal. Every
memory row is embedded by the real worker as ``engram_worker``.

Each lane test asserts something only that lane produces and shows that the
plan shape without the lane loses it (pools are kept small so no other lane
reaches the same item by accident).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import insert, select, text

from orchestrator.audit.receipts import verify_receipt
from orchestrator.db.derive_models import Extraction
from orchestrator.db.knowledge_models import (
    Community,
    Episode,
    FactClaim,
    Observation,
    Profile,
    RaptorNode,
)
from orchestrator.db.models import Chunk, Document
from orchestrator.db.session import bound_session
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from orchestrator.recall import FULL_PLAN, Provenance
from orchestrator.recall.tail import Candidate, apply_precedence
from tests.support.provenance import auditor_engine
from tests.support.recall import doc, embed_pending, embedder, recaller_with, write_documents

__all__ = ["auditor_engine", "embedder"]

DAY = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)


def _fact(s, subject, predicate, text_, scopes=("team",), **kw):
    result = kn.assert_fact(s, kn.FactInput(subject_id=subject, predicate=predicate, text=text_,
                                            scopes=scopes, **kw))
    assert result.claim_id is not None, result
    return result.claim_id


@pytest.fixture(scope="module")
def world(tenant_factory, app_engine, embedder, settings, test_db):
    t = tenant_factory("team", "exec")
    alice = t.identity("alice", write=("team",))
    bob = t.identity("bob", write=("team",))
    boss = t.identity("carol", write=("team", "exec"))
    ids = SimpleNamespace()
    write_documents(app_engine, alice, embedder, [
        doc("acme-contract.md", "Acme contract notes",
            "Acme's SLA is 99.5% uptime according to the old contract draft."),
        doc("weather.md", "Weather", "It rained all week in the valley."),
    ], settings)
    journal = [doc(f"journal/{n}.md", f"Journal day {n}", body)
               for n, body in enumerate(("Bought seeds for the balcony garden.",
                                         "The basil sprouted after the thunderstorm.",
                                         "Repotted the tomato seedlings into big pots."), 1)]
    journal = [d.__class__(**{**d.__dict__, "collection": "journal",
                              "occurred_at": DAY + timedelta(days=n)}) for n, d in enumerate(journal)]
    write_documents(app_engine, alice, embedder, journal, settings)

    with bound_session(app_engine, alice) as s:
        ids.caroline = kn.resolve_entity(s, "person", "Caroline", ["team"])
        kn.add_aliases(s, ids.caroline, ["Caro"])
        ids.acme = kn.resolve_entity(s, "org", "Acme", ["team"])
        ids.lisbon = kn.resolve_entity(s, "place", "Lisbon", ["team"])
        ids.club = kn.resolve_entity(s, "org", "Pottery club", ["team"])
        ids.works = _fact(s, ids.caroline, "works_at", "Caroline works at Acme.", object_id=ids.acme)
        ids.hq = _fact(s, ids.acme, "headquartered_in", "Acme is headquartered in Lisbon.",
                       object_id=ids.lisbon)
        ids.classes = _fact(s, ids.club, "meets", "Pottery classes happen every Thursday evening.",
                            value="Thursday")
        ids.expired = _fact(s, ids.caroline, "works_at", "Caroline works at Initech.",
                            value="Initech", valid_from=DAY - timedelta(days=900),
                            valid_to=DAY - timedelta(days=400))
        ids.keyed = kn.assert_keyed_fact(
            s, kn.FactInput(subject_id=ids.acme, predicate="sla", text="Acme's SLA is 99.95% uptime.",
                            scopes=("team",), value="99.95%"),
            fact_key="acme.sla", as_of=DAY, authority=50).claim_id
        ids.prose_claim = _fact(s, ids.acme, "sla", "Acme's SLA is 99.5% uptime.", value="99.5%",
                                confidence=0.4)
        chunk = s.execute(select(Chunk.id, Chunk.content_hash, Chunk.scopes)
                          .join(Document, Document.id == Chunk.document_id)
                          .where(Document.path == "acme-contract.md")).one()
        ids.contract_chunk = chunk.id
        s.execute(insert(Extraction).values(chunk_id=chunk.id, content_hash=chunk.content_hash,
                                            scopes=chunk.scopes, model="test",
                                            claim_ids=[ids.prose_claim]))
        ids.community = s.execute(insert(Community).values(
            level=0, member_entity_ids=sorted([ids.caroline, ids.acme]),
            summary="Caroline and Acme: employment ties.", scopes=[t.scopes["team"]],
        ).returning(Community.id)).scalar_one()
        ids.root = s.execute(insert(RaptorNode).values(
            level=1, summary="Overview of everything: gardening, contracts and the Atlas launch.",
            scopes=[t.scopes["team"]]).returning(RaptorNode.id)).scalar_one()
        ids.leaf = s.execute(insert(RaptorNode).values(
            level=0, parent_id=ids.root, summary="Balcony gardening notes.",
            scopes=[t.scopes["team"]]).returning(RaptorNode.id)).scalar_one()
        ids.profile = s.execute(insert(Profile).values(
            subject_entity_id=ids.caroline, summary="Caroline: software engineer who loves ceramics.",
            scopes=[t.scopes["team"]]).returning(Profile.id)).scalar_one()
        ids.episode = s.execute(insert(Episode).values(
            session_id="launch", summary="Planning session for the Atlas launch date and budget.",
            started_at=DAY, ended_at=DAY + timedelta(hours=1), turn_count=12,
            scopes=[t.scopes["team"]]).returning(Episode.id)).scalar_one()
        ids.confident = s.execute(insert(Observation).values(
            text="Caroline repeatedly mentions her sourdough starter.", confidence=0.9,
            subject_entity_id=ids.caroline, scopes=[t.scopes["team"]]).returning(Observation.id)
        ).scalar_one()
        ids.doubtful = s.execute(insert(Observation).values(
            text="Caroline might be baking sourdough bread for a bakery.", confidence=0.4,
            subject_entity_id=ids.caroline, scopes=[t.scopes["team"]]).returning(Observation.id)
        ).scalar_one()
        ids.db_decision = mem.record_decision(s, mem.DecisionInput(
            category="architecture", scenario="Which database should Atlas use?",
            reasoning="PostgreSQL keeps the data model, row security and vectors in one place.",
            confidence=0.9, scopes=("team",), outcome="Running well in production."))
        ids.follow_up = mem.record_decision(s, mem.DecisionInput(
            category="hiring", scenario="Hire a second on-call engineer",
            reasoning="Pager load doubled last quarter.", confidence=0.7, scopes=("team",)))
        mem.link_decisions(s, ids.db_decision, ids.follow_up, "caused", ["team"])
        ids.alice_note = mem.add_working_memory(s, "s1", "Remember: the dentist appointment moved to "
                                                "Friday at 3pm.", ["team"])
    with bound_session(app_engine, bob) as s:
        ids.bob_note = mem.add_working_memory(s, "s9", "Bob's private note: dentist appointment "
                                              "rescheduled to Monday.", ["team"])
    with bound_session(app_engine, boss) as s:
        ids.secret = _fact(s, ids.acme, "acquirer", "Acme will be acquired by Globex for 4 billion.",
                           scopes=("exec",), value="Globex")
        ids.secret_community = s.execute(insert(Community).values(
            level=0, member_entity_ids=sorted([ids.caroline, ids.acme]),
            summary="Exec only: Caroline leads the Globex acquisition talks.",
            scopes=[t.scopes["exec"]]).returning(Community.id)).scalar_one()
    embed_pending(test_db, embedder, settings, t.id)
    return SimpleNamespace(t=t, alice=alice, bob=bob, boss=boss, ids=ids)


@pytest.fixture(scope="module")
def small(app_engine, settings, embedder):
    """Small pools, so each lane's items are reachable by that lane alone."""
    return recaller_with(app_engine, settings, embedder, recall_fact_k=1, recall_memory_k=1,
                         recall_recent_k=1, recall_raptor_roots=1, recall_observation_k=1,
                         recall_dense_k=2, recall_lexical_k=2, recall_timeline_seeds=1,
                         recall_receipts=False)


def keys(trace, lane):
    return {it.key for it in trace.pools.get(lane, [])}


def item_key(table, row_id):
    return f"{table}:{row_id}"


def served(result):
    return {(e.item_table, e.item_id) for e in result.evidence}


def test_entity_seeds_by_name_and_alias(world, small):
    _, trace = small.trace(world.alice, "What does Caro do?")
    assert trace.corpus["seeds"] == ["Caroline"]
    _, trace = small.trace(world.alice, "Tell me about Caroline and Acme")
    assert trace.corpus["seeds"] == ["Acme", "Caroline"]
    _, trace = small.trace(world.alice, "Anything about the weather?")
    assert trace.corpus["seeds"] == []


def test_fact_lane_finds_content_by_meaning_and_only_current_claims(world, small):
    ids = world.ids
    question = "When are the ceramics lessons?"
    result, trace = small.trace(world.alice, question)
    classes = item_key("knowledge.fact_claim", ids.classes)
    assert classes in keys(trace, "facts")
    hit = next(e for e in result.evidence if e.item_id == ids.classes)
    assert hit.kind == "fact" and hit.provenance is Provenance.DERIVED_MEMORY
    assert hit.fact.subject == "Pottery club" and hit.fact.object == "Thursday"
    _, without = small.study(world.alice, question, FULL_PLAN.without("no-facts", facts=False))
    assert classes not in {it.key for it in without.ordered}
    # A claim whose valid time is over is never a candidate, however close its text.
    _, t2 = small.trace(world.alice, "Caroline works at Initech")
    assert all(ids.expired != it.key.split(":")[-1] for it in t2.fused)
    assert str(ids.expired) not in t2.format()


def test_keyed_fact_beats_contradicting_prose(world, small):
    ids = world.ids
    question = "What is the Acme SLA uptime?"
    result, trace = small.trace(world.alice, question)
    keyed = item_key("knowledge.fact_claim", ids.keyed)
    assert keyed in keys(trace, "keyed")
    order = [(e.item_table, e.item_id) for e in result.evidence]
    kpos = order.index(("knowledge.fact_claim", ids.keyed))
    ppos = order.index(("sources.chunks", ids.contract_chunk))
    assert kpos < ppos, "the keyed fact must come before the prose it contradicts"
    assert result.evidence[kpos].kind == "keyed fact" and result.evidence[kpos].fact.fact_key == "acme.sla"
    # The prose claim itself is outranked by the keyed fact: never served.
    assert ("knowledge.fact_claim", ids.prose_claim) not in order
    assert any(c.key == f"chunk:{ids.contract_chunk}" for c, _ in trace.precedence.contradicted)
    assert "contradicted by keyed fact" in trace.format() or "demoted" in trace.format()
    # Without the keyed lane, nothing says the prose is contradicted.
    _, without = small.study(world.alice, question, FULL_PLAN.without("no-keyed", keyed=False))
    assert not without.precedence.contradicted


def test_graph_walk_reaches_two_hops_from_the_seed(world, small):
    ids = world.ids
    question = "Who is Caroline?"
    _, trace = small.trace(world.alice, question)
    graph = {it.key: it for it in trace.pools["graph"]}
    works = item_key("knowledge.fact_claim", ids.works)
    hq = item_key("knowledge.fact_claim", ids.hq)
    assert works in graph and hq in graph
    assert graph[works].lanes["graph_rank"] < graph[hq].lanes["graph_rank"]
    _, without = small.study(world.alice, question, FULL_PLAN.without("no-graph", graph=False))
    assert hq not in {it.key for it in without.fused}


def test_community_raptor_profile_episode_lanes(world, small):
    ids = world.ids
    cases = [
        ("Who is Caroline?", "communities", item_key("memory.communities", ids.community),
         "community summary"),
        ("Give me an overview of everything", "raptor", item_key("memory.raptor_nodes", ids.root),
         "overview"),
        ("Tell me about Caroline", "profiles", item_key("memory.profiles", ids.profile), "profile"),
        ("When did we plan the Atlas launch?", "episodes", item_key("memory.episodes", ids.episode),
         "episode"),
    ]
    for question, lane, key, kind in cases:
        result, trace = small.trace(world.alice, question)
        assert key in keys(trace, lane), (lane, trace.format())
        assert any(f"{e.item_table}:{e.item_id}" == key and e.kind == kind for e in result.evidence)
        _, without = small.study(world.alice, question, FULL_PLAN.without(f"no-{lane}", **{lane: False}))
        assert key not in {it.key for it in without.fused}, lane


def test_working_memory_is_the_askers_own_and_recent(world, small):
    ids = world.ids
    question = "When is the dentist appointment?"
    result, trace = small.trace(world.alice, question)
    mine = item_key("memory.working_memory", ids.alice_note)
    assert mine in keys(trace, "working_memory")
    note = next(e for e in result.evidence if e.item_id == ids.alice_note)
    assert note.provenance is Provenance.RECENT_SESSION_MEMORY and note.kind == "session note"
    assert "Bob's private note" not in trace.format() and "Bob's private note" not in result.rendered
    bob_result, _ = small.trace(world.bob, question)
    assert ids.bob_note in {e.item_id for e in bob_result.evidence}
    assert ids.alice_note not in {e.item_id for e in bob_result.evidence}
    _, without = small.study(world.alice, question,
                             FULL_PLAN.without("no-wm", working_memory=False))
    assert mine not in {it.key for it in without.fused}


def test_observations_below_the_gate_are_never_recalled(world, small, app_engine, settings, embedder):
    ids = world.ids
    wide = recaller_with(app_engine, settings, embedder, recall_observation_k=10, recall_receipts=False)
    result, trace = wide.trace(world.alice, "Is Caroline baking sourdough bread?")
    got = {e.item_id for e in result.evidence}
    assert ids.confident in got
    assert ids.doubtful not in got and str(ids.doubtful) not in trace.format()
    # The tail applies the same gate to whatever reaches it.
    low = Candidate(key="x", kind="observation", text="maybe", scopes=(), confidence=0.64)
    high = Candidate(key="y", kind="observation", text="surely", scopes=(), confidence=0.65)
    kept, report = apply_precedence([low, high])
    assert kept == [high] and report.below_gate == [low]


def test_decisions_and_their_causal_links(world, small):
    ids = world.ids
    question = "Why did we choose PostgreSQL as the database for Atlas?"
    result, trace = small.trace(world.alice, question)
    assert item_key("memory.decisions", ids.db_decision) in keys(trace, "decisions")
    follow = item_key("memory.decisions", ids.follow_up)
    assert follow in keys(trace, "causal")
    linked = next(it for it in trace.pools["causal"] if it.key == follow)
    assert linked.lanes["causal_rank"] == 1
    assert ids.follow_up in {e.item_id for e in result.evidence}
    _, without = small.study(world.alice, question, FULL_PLAN.without("no-causal", causal=False))
    assert follow not in {it.key for it in without.fused}
    # A causal mode doubles the causal lanes' weight; it never removes another lane.
    _, causal = small.trace(world.alice, question, mode="causal")
    before = next(it.rrf for it in trace.fused if it.key == follow)
    after = next(it.rrf for it in causal.fused if it.key == follow)
    assert after == pytest.approx(2 * before)
    assert set(causal.pools) == set(trace.pools)


def test_timeline_neighbours_in_time(world, small):
    question = "When did the basil sprout?"
    result, trace = small.trace(world.alice, question)
    titles = {e.source.title for e in result.evidence if e.source is not None}
    assert {"Journal day 1", "Journal day 2", "Journal day 3"} <= titles
    timeline = trace.pools["timeline"]
    assert {it.label.split(" #")[0] for it in timeline} == {"Journal day 1", "Journal day 3"}
    day2 = next(e for e in result.evidence if e.source and e.source.title == "Journal day 2")
    assert day2.occurred_at == DAY + timedelta(days=1)
    assert "on 2026-10-02" in result.rendered
    _, without = small.study(world.alice, question, FULL_PLAN.without("no-timeline", timeline=False))
    assert "Journal day 3" not in {it.label.split(" #")[0] for it in without.fused}
    # A timeline mode doubles the neighbours' credit; every lane still runs.
    _, timeline = small.trace(world.alice, question, mode="timeline")
    before = {it.key: it.rrf for it in trace.fused if "timeline_rank" in it.lanes}
    after = {it.key: it.rrf for it in timeline.fused if "timeline_rank" in it.lanes}
    assert before and set(after) == set(before)
    assert all(after[k] > before[k] for k in before)
    assert set(timeline.pools) == set(trace.pools)


def test_other_scope_memory_never_reaches_recall_or_trace(world, small):
    for question in ("Who will acquire Acme?", "Who is Caroline?"):
        result, trace = small.trace(world.alice, question)
        text_ = result.rendered + trace.format()
        assert "Globex" not in text_
        assert str(world.ids.secret) not in text_ and str(world.ids.secret_community) not in text_
    # The exec reader sees both.
    boss_result, _ = small.trace(world.boss, "Who will acquire Acme?")
    assert world.ids.secret in {e.item_id for e in boss_result.evidence}


def test_served_facts_bump_counters_and_the_receipt_verifies(world, app_engine, settings, embedder,
                                                           admin_engine, auditor_engine):
    recaller = recaller_with(app_engine, settings, embedder)
    recaller.settle()  # what earlier recalls over this engine left to the background

    def counts():
        with admin_engine.connect() as conn:
            return dict(conn.execute(select(FactClaim.id, FactClaim.access_count)
                                     .where(FactClaim.tenant_id == world.t.id)).all())

    before = counts()
    result, trace = recaller.trace(world.alice, "What is the Acme SLA uptime?", budget_tokens=150)
    served_claims = {e.item_id for e in result.evidence if e.item_table == "knowledge.fact_claim"}
    assert served_claims and trace.touched_claims == len(served_claims)
    # Sealed in the recall; the counters and the receipt's chain event follow in the background.
    recaller.settle()
    after = counts()
    for claim, n in after.items():
        assert n == before[claim] + (1 if claim in served_claims else 0), claim
    with auditor_engine.connect() as conn:
        check = verify_receipt(conn, trace.receipt_id, rendered=result.rendered)
        stored = conn.execute(text("select evidence from provenance.receipts where id = :i"),
                              {"i": trace.receipt_id}).scalar_one()
    # Proven; the served facts' access counters moved after the seal, nothing else did.
    assert check.proven and not check.queued, check.problems()
    assert {e.row_id["id"] for e in check.evidence if e.status == "changed"} == {
        str(c) for c in served_claims}
    assert all(e.status == "unchanged" for e in check.evidence
               if e.table != "knowledge.fact_claim")
    assert [(x["table"], x["row_id"]["id"]) for x in stored] == [
        (e.item_table, str(e.item_id)) for e in result.evidence if e.item_id is not None]
    # Served again, the counters move on: the first receipt is still proven, no longer unchanged.
    recaller.recall(world.alice, "What is the Acme SLA uptime?", budget_tokens=150)
    recaller.settle()
    with auditor_engine.connect() as conn:
        again = verify_receipt(conn, trace.receipt_id)
    assert again.proven and not again.ok


def test_memory_prepare_bundles_every_section_under_one_budget(world, app_engine, settings, embedder):
    from orchestrator.recall.tail import token_cost

    ids = world.ids
    recaller = recaller_with(app_engine, settings, embedder)
    question = "What is the Acme SLA and what did we decide about the database?"
    bundle, trace = recaller.prepare(world.alice, question, budget_tokens=4000)
    assert ids.keyed in {e.item_id for e in bundle.keyed_facts}
    assert all(e.kind == "keyed fact" for e in bundle.keyed_facts)
    assert ids.db_decision in {e.item_id for e in bundle.lessons}  # it has an outcome
    assert ids.follow_up not in {e.item_id for e in bundle.lessons}  # it has none
    assert ids.episode in {e.item_id for e in bundle.episodes}
    assert "acme-contract.md" in {d.path for d in bundle.documents}
    in_sections = [e.item_id for e in bundle.keyed_facts + bundle.lessons + bundle.episodes]
    assert not set(in_sections) & {e.item_id for e in bundle.evidence}, "an item is in one section"
    for heading in ("## Current keyed facts", "## Relevant evidence",
                    "## Lessons (decisions with outcomes)", "## Recent episodes", "## Top documents"):
        assert heading in bundle.rendered
    assert token_cost(bundle.rendered, settings.recall_chars_per_token) == bundle.used_tokens <= 4000
    assert trace.receipt_id is not None
    assert ("sources.documents", bundle.documents[0].document_id) in bundle.served_rows()

    # A tight budget still shows the first item of every section that fits, round-robin.
    tight, _ = recaller.prepare(world.alice, question, budget_tokens=260)
    assert tight.used_tokens <= 260
    assert tight.keyed_facts and tight.evidence
    assert len(tight.evidence) < len(bundle.evidence)
    tiny, _ = recaller.prepare(world.alice, question, budget_tokens=5)
    assert tiny.rendered == "" and tiny.used_tokens == 0


def test_feedback_on_served_evidence(world, app_engine, settings, embedder, admin_engine):
    from orchestrator.derive.lifecycle import mark_evidence_used
    from orchestrator.errors import BadInput, NotFound

    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False)
    result = recaller.recall(world.alice, "What is the Acme SLA uptime?")
    recaller.settle()  # the recall's own access counts are applied in the background
    excerpt = next(e for e in result.evidence if e.item_table == "sources.chunks")
    fact = next(e for e in result.evidence if e.item_table == "knowledge.fact_claim")

    def state():
        with admin_engine.connect() as conn:
            uses = conn.execute(text("select uses from memory.document_use where document_id = :d"),
                                {"d": excerpt.document_id}).scalar()
            ledger = conn.execute(text("select count(*) from memory.usage_ledger where tenant_id = :t"),
                                  {"t": world.t.id}).scalar_one()
            access = conn.execute(select(FactClaim.access_count).where(FactClaim.id == fact.item_id)
                                  ).scalar_one()
        return uses or 0, ledger, access

    uses, ledger, access = state()
    with bound_session(app_engine, world.alice) as s:
        n = mark_evidence_used(s, [(excerpt.item_table, excerpt.item_id), (fact.item_table, fact.item_id)])
    assert n == 2
    assert state() == (uses + 1, ledger + 2, access + 1)
    # Another user's working memory is not readable by alice: not found, and nothing recorded.
    with pytest.raises(NotFound), bound_session(app_engine, world.alice) as s:
        mark_evidence_used(s, [(fact.item_table, fact.item_id),
                               ("memory.working_memory", world.ids.bob_note)])
    with pytest.raises(BadInput, match="not a table recall serves"), \
            bound_session(app_engine, world.alice) as s:
        mark_evidence_used(s, [("auth.scopes", fact.item_id)])
    assert state() == (uses + 1, ledger + 2, access + 1)
