"""The learned ranker, MMR and personalized PageRank; usage rows and per-tenant training.

Unit tests build candidates by hand (MMR, PPR, features, tie-breaking, model
refusal); the others run real recalls against the test database: which model
ranked is in the trace, a refused model falls back to fused order and says so,
every recall writes a usage row only its user can read, and a tenant's model is
trained on that tenant's feedback alone and recovers a preference planted in it.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import text

from orchestrator.db.session import bound_session
from orchestrator.derive.lifecycle import mark_evidence_used
from orchestrator.derive.service import ServiceTenant, service_session
from orchestrator.errors import BadInput
from orchestrator.recall.features import FEATURES, RankContext, feature_matrix, mentions, question_type
from orchestrator.recall.learning import record_usage, train_tenant, training_set
from orchestrator.recall.mmr import diversify
from orchestrator.recall.ppr import personalized_pagerank
from orchestrator.recall.ranker import (
    ModelRefused,
    RankModel,
    RankReport,
    default_model,
    model_card,
    model_from_text,
    train,
)
from orchestrator.recall.result import FactRef, ScopeRef, SourceRef
from orchestrator.recall.tail import (
    CLAIMS,
    Candidate,
    deprecated,
    discount_deprecated,
    discount_navigation,
    drop_redundant_derived,
    navigational,
    order,
    served_once,
    suppress_duplicates,
    unit_rows,
)
from tests.support.recall import doc, embedder, recaller_with, write_documents

__all__ = ["embedder"]

SCOPE = (ScopeRef("team", ""),)


def cand(key: str, text: str = "text", vec: list[float] | None = None, *, merit: float = 0.0,
         rrf: float = 0.0, doc_id: uuid.UUID | None = None, **kw: object) -> Candidate:
    c = Candidate(key=key, kind=str(kw.pop("kind", "source")), text=text, scopes=SCOPE,
                  embedding=None if vec is None else np.asarray(vec, dtype=np.float32),
                  document_id=doc_id, rrf=rrf, **kw)  # type: ignore[arg-type]
    c.merit = merit
    return c


# --- MMR -----------------------------------------------------------------------------------


def test_mmr_puts_a_different_item_before_a_paraphrase_of_the_first():
    a = cand("a", vec=[1.0, 0.0, 0.0], merit=1.0)
    paraphrase = cand("a2", vec=[0.97, 0.243, 0.0], merit=0.95)
    other = cand("b", vec=[0.0, 1.0, 0.0], merit=0.8)
    merit_order = [a, paraphrase, other]
    ordered, deferred = diversify(merit_order, 0.7, 0)
    assert [c.key for c in ordered] == ["a", "b", "a2"]
    assert deferred == []
    # lambda 1 is merit order exactly.
    assert [c.key for c in diversify(merit_order, 1.0, 0)[0]] == ["a", "a2", "b"]


def test_mmr_defers_a_documents_chunks_past_the_cap_and_keeps_direct_subjects_first():
    d = uuid.uuid4()
    chunks = [cand(f"c{i}", merit=1.0 - i / 10, doc_id=d) for i in range(4)]  # 1.0 .. 0.7
    other = cand("o", merit=0.45, doc_id=uuid.uuid4())
    weak = cand("weak", merit=0.03, doc_id=uuid.uuid4())
    named = cand("named", merit=0.0, doc_id=uuid.uuid4(), direct=True)
    ordered, deferred = diversify([named, *chunks, other, weak], 1.0, 2)
    # Past the cap c2 (0.8) and c3 (0.7) compete at half their merit: after the other
    # document's 0.45, before the weak item's 0.03.
    assert [c.key for c in ordered] == ["named", "c0", "c1", "o", "c2", "c3", "weak"]
    assert [c.key for c in deferred] == ["c2", "c3"]
    # With no discount they wait behind every other candidate, as the hard cap did.
    ordered, _ = diversify([named, *chunks, other, weak], 1.0, 2, cap_discount=0.0)
    assert [c.key for c in ordered] == ["named", "c0", "c1", "o", "weak", "c2", "c3"]
    # The discount is relative: a strong enough chunk past the cap still beats a weaker document.
    ordered, _ = diversify([*chunks, cand("mid", merit=0.3, doc_id=uuid.uuid4())], 1.0, 2)
    assert [c.key for c in ordered] == ["c0", "c1", "c2", "c3", "mid"]
    with pytest.raises(ValueError, match="lambda"):
        diversify(list(chunks), 1.5, 2)
    with pytest.raises(ValueError, match="discount"):
        diversify(list(chunks), 0.85, 2, cap_discount=2.0)


# --- tables of contents ------------------------------------------------------------------------


def test_a_table_of_contents_or_a_link_list_is_navigational_and_prose_is_not():
    toc = "\n".join(f"{'  ' * (i % 2)}* [Building on {os} ({i})](#building-{i})"
                    for i, os in enumerate(["Windows", "macOS", "Linux", "FreeBSD", "AIX", "SmartOS"]))
    assert navigational(toc)
    assert navigational("## Contents\n\n" + toc + "\n\nSee the sections below.")
    # Reference-style links and numbered items are links too.
    assert navigational("\n".join(f"{n}. [Step {n}][step-{n}]" for n in range(1, 7)))
    # Prose with a few links, and a list whose items say something besides their link, are not.
    assert not navigational("To build on Windows, install [Visual Studio](https://vs.example).\n"
                            "Then run `vcbuild.bat`. See [Notes](#notes).\n" * 3)
    assert not navigational("\n".join(f"* [Step {n}](#s{n}): run the installer and reboot"
                                       for n in range(8)))
    assert not navigational("* [One](#one)\n* [Two](#two)\n* [Three](#three)")  # too few
    # A long link list among more prose than it: below 60% of the lines.
    assert not navigational(toc + "\n" + "\n".join(f"Paragraph line {n}." for n in range(6)))

    # Link reference definitions (where reference-style links point) are links too; a
    # toctree directive's page names count for neither side (stop 40).
    refs = "\n".join(f"[ref-{n}]: https://example.org/{n} \"Page {n}\"" for n in range(6))
    assert navigational(refs + "\nReport security issues to the list.")
    assert not navigational(refs.replace("]: ", "] is ", 5))
    toctree = "```{toctree}\n:hidden:\n\n" + "\n".join(f"page-{n}" for n in range(12)) + "\n```"
    assert not navigational("Widget is a build tool. It builds widgets.\n\n" + toctree)
    assert navigational(toctree + "\n" + refs)
    # A longer closing fence closes it; a fence with an info string inside does not.
    longer = toctree.replace("\n```", "\n````")
    assert not navigational("Widget is a build tool.\n" + longer + "\n" + "\n".join(
        f"Widget step {n} builds a part." for n in range(6)) + "\n" + refs[:refs.index("\n[ref-5]")])
    assert navigational(longer + "\n" + refs)
    assert not navigational(toctree.replace("\n```", "\n```js") + "\n" + refs)

    nav, prose, fact = (cand("n", toc, merit=1.0), cand("p", "Install the compiler.", merit=0.8),
                        cand("f", toc, merit=1.0, kind="claim"))
    assert discount_navigation([nav, prose, fact], 0.5) == 1
    assert (nav.merit, prose.merit, fact.merit) == (0.5, 0.8, 1.0)  # source chunks only
    assert discount_navigation([off := cand("n2", toc, merit=1.0)], 1.0) == 0 and off.merit == 1.0


def test_a_chunk_with_a_deprecation_notice_competes_at_a_share_of_its_merit():
    """CMake's exec_program page opens with "Deprecated since version 3.0: Use the
    execute_process() command instead" and was served first for "how do I run an external
    program while configuring?". A notice at a line's start discounts a source chunk, unless
    the question asks about deprecations; prose that mentions the word does not."""
    for notice in ("# exec_program\n\n*Deprecated since version 3.0:* Use execute_process().",
                   "## fs.exists(path)\n\n> Stability: 0 - Deprecated: Use fs.stat() instead.",
                   "**Deprecated**: use the new flag.", "DEPRECATED. Use --user instead."):
        assert deprecated(notice), notice
    for prose in ("This option is deprecated and does nothing.",
                  "Deprecated functions are listed in the appendix.", "See the deprecations page."):
        assert not deprecated(prose), prose
    old, new, fact = (cand("o", "*Deprecated since version 3.0:* Use execute_process().",
                           merit=1.0),
                      cand("n", "execute_process runs a program.", merit=0.8),
                      cand("f", "Deprecated: a claim", merit=1.0, kind="claim"))
    assert discount_deprecated("how do I run a program?", [old, new, fact], 0.5) == 1
    assert (old.merit, new.merit, fact.merit) == (0.5, 0.8, 1.0)  # source chunks only
    again = cand("o2", old.text, merit=1.0)
    for question in ("what replaced exec_program?", "which commands are deprecated?"):
        assert discount_deprecated(question, [again], 0.5) == 0 and again.merit == 1.0
    assert discount_deprecated("how do I run a program?", [again], 1.0) == 0  # off
    # Replacing or removing something is no question about deprecations.
    for question in ("how do I replace text in a string?", "how do I remove a file?"):
        fresh = cand("o3", old.text, merit=1.0)
        assert discount_deprecated(question, [fresh], 0.5) == 1 and fresh.merit == 0.5, question


def test_a_deprecation_notice_the_reader_cannot_see_is_not_counted(
        tenant_factory, app_engine, embedder, settings):
    """The order line's count of deprecated chunks is the reader's own: exec's deprecated
    page counts for a reader of exec only, and its title is in no one else's trace."""
    t = tenant_factory("team", "exec")
    alice = t.identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, [
        doc("exec_program.md", "exec_program", "# exec_program\n\n*Deprecated since version "
            "3.0:* Use the execute_process() command instead.\n\nRun an external program "
            "while configuring the project and capture its output."),
        doc("execute_process.md", "execute_process", "# execute_process\n\nRun child "
            "processes while configuring the project and capture their output."),
    ], settings)
    write_documents(app_engine, t.identity("boss", write=("team", "exec")), embedder, [
        doc("hidden.md", "build_program", "# build_program\n\n> Stability: 0 - Deprecated: "
            "run external programs with execute_process.", scopes=("exec",))], settings)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False,
                             rank_usage_rows=False)
    question = "how do I run an external program while configuring?"
    _, trace = recaller.trace(alice, question)
    assert trace.deprecated == "1 chunk(s) with a deprecation notice, at 0.5 of their merit"
    assert "build_program" not in trace.format()
    _, boss = recaller.trace(t.identity("boss", read=("team", "exec")), question)
    assert boss.deprecated.startswith("2 chunk(s) with a deprecation notice"), boss.deprecated


_SECTIONS = [f"{what} on {os}" for os in ("Windows", "Linux", "macOS", "FreeBSD")
             for what in ("Prerequisites", "Building Widget", "Build options", "Testing a build",
                          "Packaging Widget", "Debugging a build")]
BUILDING = doc("building.md", "Building Widget", "# Building Widget\n\n## Contents\n\n" + "\n".join(
    f"* [{name}](#{name.lower().replace(' ', '-')})" for name in _SECTIONS) + """

## Building on Linux

Install gcc 12 and make, then run `./configure && make -j4` in the checkout.
""" + "\n".join(f"Paragraph {n} about release engineering, changelogs and tagging." for n in range(24))
    + """

## Building on Windows

Install Visual Studio 2022 with the C++ workload and Python 3.12, open a developer
prompt in the checkout and run `vcbuild.bat release`: it builds Widget into `out\\Release`.
""")


def test_a_table_of_contents_gives_way_to_the_chunks_it_points_at(
        tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team", "exec")
    alice = t.identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, [BUILDING], settings)
    # A second table of contents alice may not read: the trace's count never counts it.
    hidden = doc("hidden.md", "Building Widget for exec", BUILDING.body, scopes=("exec",))
    write_documents(app_engine, t.identity("boss", write=("team", "exec")), embedder, [hidden],
                    settings)
    question = "how do I build Widget on Windows?"
    served = {}
    for discount in (1.0, 0.5):
        recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False,
                                 rank_usage_rows=False, recall_navigation_discount=discount)
        result, trace = recaller.trace(alice, question)
        served[discount] = [e.text for e in result.evidence]
        if discount == 1.0:
            assert trace.navigation == ""
        else:
            assert trace.navigation.startswith("1 chunk(s) a table of contents")
            assert "at 0.5 of their merit" in trace.format()
            # The boss reads both: the hidden one is pooled and counted where it is visible.
            _, boss = recaller.trace(t.identity("boss", read=("team", "exec")), question)
            assert boss.navigation.startswith("2 chunk(s) a table of contents"), boss.navigation
    # Without the discount the table of contents (it repeats every heading's words) comes
    # first; with it, it gives way (here to the chunk after it: three chunks, merit 1.0 ->
    # 0.5 against 0.84; nothing is dropped).
    assert "## Contents" in served[1.0][0]
    assert "## Contents" not in served[0.5][0] and len(served[0.5]) == len(served[1.0])


# --- duplicates and the shared unit embeddings ------------------------------------------------


def test_a_duplicate_is_judged_against_kept_items_only():
    deg = np.pi / 180
    a = cand("a", "first", [1.0, 0.0])
    b = cand("b", "second", [np.cos(15 * deg), np.sin(15 * deg)])  # cos 0.966 to a: dropped
    c = cand("c", "third", [np.cos(30 * deg), np.sin(30 * deg)])  # 0.966 to b, 0.866 to a: kept
    same_text = cand("d", "  FIRST ", [0.0, 1.0])  # the same text as a, whatever its vector
    no_vector = cand("e", "fifth")
    kept, dropped = suppress_duplicates([a, b, c, same_text, no_vector], 0.95)
    assert [k.key for k in kept] == ["a", "c", "e"]
    assert [(x.key, y.key) for x, y, _ in dropped] == [("b", "a"), ("d", "a")]
    assert dropped[0][2] == pytest.approx(np.cos(15 * deg), abs=1e-6) and dropped[1][2] == 1.0
    assert suppress_duplicates([], 0.95) == ([], [])


def test_a_derived_item_an_excerpt_holds_is_served_by_the_excerpt_once():
    src = SourceRef(collection="notes", path="d1.md", title="D1")
    holder = cand("excerpt", "Melanie: We went camping. We love painting together lately.",
                  source=src, merit=0.4)
    fact = cand("fact", "We love  painting together lately.", kind="fact", merit=0.9)
    other = cand("other", "Caroline: the adoption agency called.", source=src, merit=0.6)
    observation = cand("obs", "melanie: we went camping.", kind="observation", merit=0.2)
    profile = cand("profile", "We love painting together lately.", kind="profile", merit=0.1)
    novel = cand("novel", "Melanie paints sunrises.", kind="fact", merit=0.05)
    kept, dropped = drop_redundant_derived([fact, other, holder, observation, profile, novel])
    # The fact ranked above the excerpt that holds it: the excerpt takes its place (and its
    # merit) and is not served again further down; the observation below the excerpt is
    # dropped; a profile is not a sentence of a source and stays, as does a fact no
    # excerpt holds.
    assert [c.key for c in kept] == ["excerpt", "other", "profile", "novel"]
    assert holder.merit == 0.9
    assert dropped == [("fact", "excerpt", True), ("obs", "excerpt", False)]
    # Nothing held: the order is untouched.
    assert drop_redundant_derived([novel, other])[0] == [novel, other]
    # The same words with Markdown around them in the excerpt (a link reference, a code
    # span): the fact is still the excerpt's sentence.
    marked = cand("marked", "The runner can be invoked by passing the\n[`--test`][] flag:\n\n"
                  "```bash\nnode --test\n```", source=src, merit=0.7)
    flag = cand("flag", "The runner can be invoked by passing the `--test` flag:", kind="fact",
                merit=0.3)
    kept, dropped = drop_redundant_derived([marked, flag])
    assert [c.key for c in kept] == ["marked"] and dropped == [("flag", "marked", False)]
    # A profile of one sentence the excerpt holds says nothing more (its title aside); one
    # that summarises more than the excerpt says stays.
    single = cand("single", "Listens: Listens once to the `abort` event.", kind="profile",
                  merit=0.8)
    wider = cand("wider", "Listens: Listens once to the `abort` event. It returns a handle.",
                 kind="profile", merit=0.7)
    source = cand("api", "## once\n\nListens once to the `abort` event. Returns a disposable.",
                  source=src, merit=0.5)
    kept, dropped = drop_redundant_derived([single, wider, source])
    assert [c.key for c in kept] == ["api", "wider"] and dropped == [("single", "api", True)]


def test_a_fact_ranked_above_its_near_duplicate_turn_is_served_by_the_turn():
    """LoCoMo with every derive job run: a fact is a sentence of a short turn, as near the
    turn as a duplicate (cosine 0.99); ranked above it, duplicate suppression dropped the
    turn first and the fact was served alone, without the rest of what was said. The turn
    serves it now, in its place; a duplicate of another kind still goes."""
    src = SourceRef(collection="locomo", path="D8:6", title="D8:6")
    deg = np.pi / 180
    near = [np.cos(8 * deg), np.sin(8 * deg)]  # cosine 0.990 to [1, 0]
    fact = cand("fact", "Melanie: We love painting together lately, especially nature-inspired "
                "ones.", [1.0, 0.0], kind="fact", merit=0.9)
    turn = cand("turn", "Melanie: We love painting together lately, especially nature-inspired "
                "ones. Here's our latest work from last weekend.", near, source=src, merit=0.5)
    twin = cand("twin", "Melanie: Our latest work from last weekend, the lake at sunrise.",
                [np.cos(9 * deg), np.sin(9 * deg)], source=src, merit=0.4)  # 0.9998 to turn
    kept, redundant, dropped = served_once([fact, turn, twin], 0.95)
    assert [c.key for c in kept] == ["turn"] and turn.merit == 0.9
    assert redundant == [("fact", "turn", True)]
    assert [(a.key, b.key) for a, b, _ in dropped] == [("twin", "turn")]


def test_unit_rows_mask_missing_zero_and_foreign_dimension_embeddings():
    rows = [cand("a", vec=[3.0, 4.0]), cand("none"), cand("zero", vec=[0.0, 0.0]),
            cand("wide", vec=[1.0, 0.0, 0.0]), cand("b", vec=[0.0, 2.0])]
    mat, mask = unit_rows(rows)
    assert mask.tolist() == [True, False, False, False, True]
    assert mat.shape == (5, 2) and mat[0].tolist() == pytest.approx([0.6, 0.8])
    assert mat[4].tolist() == [0.0, 1.0] and not mat[1:4].any()
    assert rows[0].unit is not None and rows[2].unit is None  # cached on the candidate
    empty, none = unit_rows([])
    assert empty.shape[0] == 0 and none.shape == (0,)


# --- PPR -----------------------------------------------------------------------------------


def claim(key: str, subject: str, obj: str | None) -> Candidate:
    return cand(key, f"{subject} relates to {obj}", item_table=CLAIMS,
                fact=FactRef(subject=subject, predicate="relates_to", object=obj,
                             epistemic_kind="world_fact", perspective_key="world",
                             author_role="extractor"), kind="fact")


def test_ppr_ranks_a_two_hop_neighbour_above_an_unrelated_node():
    one_hop = claim("c1", "Ada", "Acme")
    two_hop = claim("c2", "Acme", "London")
    chunk_two_hops = cand("chunk-london", "The office in London opened in May.")
    unrelated = cand("chunk-other", "Bob grows tomatoes in Lisbon.")
    result = personalized_pagerank([one_hop, two_hop, chunk_two_hops, unrelated], ["Ada"])
    scores = result.scores
    assert scores["c1"] > scores["c2"] > 0
    assert scores["chunk-london"] > scores.get("chunk-other", 0.0) == 0.0
    assert result.iterations >= 1 and result.edges == 5
    assert personalized_pagerank([one_hop], []).note == "no entity seeds in the question"


# --- features, ties, models ----------------------------------------------------------------


def test_features_are_aligned_and_missing_values_are_nan():
    when = datetime(2026, 1, 1, tzinfo=UTC)
    a = cand("chunk:a", "Caroline: I went to the support group yesterday.", [1.0, 0.0],
             rrf=0.2, author="Caroline", occurred_at=when,
             lanes={"dense_rank": 1, "dense_distance": 0.1, "lexical_rank": 2, "bm25": 3.0},
             source=SourceRef("c", "D1:1", "D1:1"))
    b = cand("chunk:b", "Melanie: I painted a lake.", [0.0, 1.0], rrf=0.1, author="Melanie",
             occurred_at=when + timedelta(hours=5), lanes={"dense_rank": 2, "dense_distance": 0.6},
             source=SourceRef("c", "D1:2", "D1:2"))
    fact = cand("claim:c", "Caroline attends a support group.", [0.6, 0.8], rrf=0.05,
                kind="fact", lanes={"facts_rank": 3, "graph_rank": 2, "keyed_rank": None})
    m = feature_matrix([a, b, fact], RankContext("When did Caroline go to the support group?",
                                                 query_vector=[1.0, 0.0]))
    f = {name: m[:, i] for i, name in enumerate(FEATURES)}
    assert m.shape == (3, len(FEATURES))
    assert f["lanes"].tolist() == [2.0, 1.0, 3.0]
    assert np.isnan(f["memory_rank"][:2]).all() and f["memory_rank"][2] == 2.0
    assert f["bm25_share"][0] == 1.0 and np.isnan(f["bm25_share"][1:]).all()
    assert f["author_named"].tolist() == [1.0, 0.0, 0.0]
    assert f["rrf_rank"].tolist() == [1.0, 2.0, 3.0]
    assert f["term_hits"][0] >= 2 and f["term_hits"][1] == 0
    assert f["cosine"][0] == pytest.approx(1.0) and f["cosine_rank"].tolist() == [1.0, 3.0, 2.0]
    assert np.isnan(f["lexical_rank"][1]) and np.isnan(f["rerank"]).all()
    assert f["hours_to_best"][0] == 0.0 and f["hours_to_best"][1] > 0


def test_question_and_answer_shape_features():
    assert [question_type(q) for q in (
        "When did Caroline go to the support group?", "Who supports Caroline?",
        "Where did Melanie camp?", "What has Melanie painted?", "How did she feel?",
        "Why did he move?", "How many times has Melanie gone to the beach?",
        "Would Caroline pursue writing?")] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0]
    # times: "last week", "May", "2023"; numbers: "7", "2023"; names (roughly): "May", "Anna"
    assert mentions("Last week, on 7 May 2023, I met Anna at the lake.") == (3.0, 2.0, 2.0)
    assert mentions("nothing of the kind here") == (0.0, 0.0, 0.0)
    # Distinct words: a number said twice counts once; "three" is a number too.
    assert mentions("3 cats, 3 dogs and three birds, on Monday 12/05")[:2] == (1.0, 4.0)
    # A sentence's first word is not a name; one inside it is.
    assert mentions("Painting calms me. Ask Bob.")[2] == 1.0


def test_context_in_time_and_pool_weighted_terms():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    common = "Caroline: "
    a = cand("chunk:a", common + "we went camping at the lake", [1.0, 0.0], rrf=0.3, occurred_at=t0)
    b = cand("chunk:b", common + "the kids loved it", [0.0, 1.0], rrf=0.1,
             occurred_at=t0 + timedelta(seconds=2))
    far = cand("chunk:c", common + "I read a book about camping", [0.6, 0.8], rrf=0.2,
               occurred_at=t0 + timedelta(days=30))
    undated = cand("chunk:d", common + "hello", [0.0, 1.0], rrf=0.05)
    m = feature_matrix([a, b, far, undated],
                       RankContext("Where did Caroline go camping at the lake?", query_vector=[1.0, 0.0]))
    f = {name: m[:, i] for i, name in enumerate(FEATURES)}
    # a and b are each other's context; the far one has none; the undated one has no time at all.
    assert f["near_count"][:3].tolist() == [1.0, 1.0, 0.0] and np.isnan(f["near_count"][3])
    assert f["near_best_cosine"][1] == pytest.approx(1.0) and f["near_best_cosine"][0] == pytest.approx(0.0)
    assert f["near_best_rrf_share"][1] == pytest.approx(1.0)
    assert f["near_best_rrf_share"][0] == pytest.approx(1 / 3)
    assert np.isnan(f["near_best_cosine"][2]) and np.isnan(f["near_best_rrf_share"][2])
    # "caroline" is in every candidate, "lake" in one: the one with "lake" outweighs the one
    # that shares only "camping" with the question, though both hold two question terms.
    assert f["term_hits"][0] == 3.0 and f["term_hits"][2] == 2.0
    assert f["term_weight_share"][0] > f["term_weight_share"][2] > f["term_weight_share"][1] > 0
    assert f["question_type"].tolist() == [3.0] * 4


def test_ties_are_broken_by_document_and_position_not_by_row_id():
    def at(key: str, path: str, start: int) -> Candidate:
        return cand(key, merit=0.5, rrf=0.1, source=SourceRef("notes", path, path), char_start=start)

    items = [at("chunk:f", "b.md", 0), at("chunk:0", "a.md", 900), at("chunk:9", "a.md", 10)]
    assert [c.key for c in order(items)] == ["chunk:9", "chunk:0", "chunk:f"]


def _tiny_model() -> tuple[str, dict[str, object]]:
    rng = np.random.default_rng(3)
    x = rng.random((60, len(FEATURES))).astype(np.float32)
    y = (x[:, FEATURES.index("term_share")] > 0.5).astype(float)
    artifact = train(x, y, [10] * 6, rounds=5)
    return artifact, model_card(version="t1", text=artifact, trained_on={}, params={}, metrics={},
                                position_bias="none")


def test_a_model_artifact_is_refused_when_its_checksum_features_or_text_are_wrong():
    artifact, card = _tiny_model()
    model = model_from_text(artifact, card, name="test")
    assert model.label.startswith("test t1 (sha256 ")
    with pytest.raises(ModelRefused, match="checksum mismatch"):
        model_from_text(artifact + "\n", card, name="test")
    with pytest.raises(ModelRefused, match="feature set"):
        model_from_text(artifact, {**card, "features": list(FEATURES[:-1])}, name="test")
    garbage = "this is not a LightGBM model"
    with pytest.raises(ModelRefused, match="does not parse"):
        model_from_text(garbage, {**card, "sha256": None}, name="test")


def test_the_packaged_default_model_loads_and_scores_in_feature_order():
    model = default_model()
    assert isinstance(model, RankModel), model
    assert model.card["features"] == list(FEATURES)
    assert "locomo" in json.dumps(model.card["trained_on"]).lower()
    scores = model.score(np.zeros((3, len(FEATURES)), dtype=np.float32))
    assert scores.shape == (3,)


def test_events_recorded_with_another_feature_list_are_skipped_and_counted_apart():
    from types import SimpleNamespace

    width = len(FEATURES)
    ok = SimpleNamespace(feature_count=width, features=[0.5] * (2 * width), used=[True, False],
                         served_ranks=[1, 0])
    unused = SimpleNamespace(feature_count=width, features=[0.5] * (2 * width), used=[False, False],
                             served_ranks=[1, 2])
    older = SimpleNamespace(feature_count=33, features=[0.5] * 66, used=[True, False],
                            served_ranks=[1, 0])
    ts = training_set([ok, unused, older])
    assert (ts.events, ts.skipped, ts.other_features) == (1, 1, 1)
    assert ts.matrix.shape == (2, width) and ts.positions.tolist() == [0, 1]


# --- recalls against the database ----------------------------------------------------------

NOTES = [
    doc("boiler.md", "Boiler", "The boiler in the basement is serviced every March by Nordheat."),
    doc("garden.md", "Garden", "The garden hose is stored in the shed next to the boiler manual."),
    doc("recipes.md", "Recipes", "The lasagne needs two hours in the oven at 180 degrees."),
]


def test_the_trace_names_the_model_that_ranked_and_a_refused_one_falls_back(
        tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team")
    alice = t.identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, NOTES, settings)
    default = default_model()
    assert isinstance(default, RankModel)
    _, trace = recaller_with(app_engine, settings, embedder).trace(alice, "when is the boiler serviced?")
    assert trace.ranker == f"{default.label} scored {len(trace.fused)} candidates"
    assert trace.ranking.features is not None and trace.ranking.features.shape[1] == len(FEATURES)
    assert "learned ranker: default" in trace.format()
    assert all(k in trace.timings_ms for k in ("ranker.ppr", "ranker.features", "ranker.predict", "mmr"))

    from orchestrator.recall import Recaller

    refused = Recaller(app_engine, settings, embedder=embedder,
                       ranker="the packaged default model is refused: checksum mismatch")
    result, trace = refused.trace(alice, "when is the boiler serviced?")
    assert trace.ranker == ("the packaged default model is refused: checksum mismatch; "
                            "fused order is used")
    assert result.evidence and all(it.merit <= 1.0 for it in trace.ordered)
    fused = sorted(trace.ordered, key=lambda it: -it.rrf)
    assert [it.key for it in trace.ordered][:1] == [fused[0].key]


def test_usage_rows_are_written_per_recall_and_readable_by_their_user_only(
        tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team")
    other = tenant_factory("team")
    alice = t.identity("alice", write=("team",))
    bob = t.identity("bob", read=("team",))
    write_documents(app_engine, alice, embedder, NOTES, settings)
    recaller = recaller_with(app_engine, settings, embedder)
    result, trace = recaller.trace(alice, "boiler service", channel="cli")
    assert trace.usage_rows == 1 + len(result.served_rows())
    assert "usage row(s) queued" in trace.format()
    recaller.settle()  # written by the background writer, moments after the recall
    with bound_session(app_engine, alice) as s:
        row = s.execute(text("select operation, channel, model, served_ranks, feature_count, "
                             "cardinality(features) as n, receipt_id from memory.rank_events")).one()
        served = s.execute(text("select count(*) from memory.usage_ledger "
                                "where operation = 'recall.served' and channel = 'cli'")).scalar()
    assert (row.operation, row.channel, row.feature_count) == ("recall", "cli", len(FEATURES))
    assert row.n == len(FEATURES) * len(row.served_ranks)
    assert sorted(r for r in row.served_ranks if r > 0) == list(range(1, len(result.evidence) + 1))
    assert row.receipt_id == trace.receipt_id and row.model.startswith("default ")
    assert served == len(result.served_rows())
    for who in (bob, other.identity("alice", write=("team",))):
        with bound_session(app_engine, who) as s:
            assert s.execute(text("select count(*) from memory.rank_events")).scalar() == 0
            assert s.execute(text("select count(*) from memory.rank_training_rows(null, "
                                  "interval '1 hour')")).scalar() == 0
    _prepared, _ = recaller.prepare(alice, "boiler service", channel="mcp")
    recaller.settle()
    with bound_session(app_engine, alice) as s:
        assert s.execute(text("select operation from memory.rank_events where channel = 'mcp'")
                         ).scalar() == "prepare"
    with bound_session(app_engine, alice) as s, pytest.raises(BadInput, match="unknown channel"):
        record_usage(s, operation="recall", channel="fax", question="q", report=RankReport(),
                     served=[], pooled=[], model_id=None, receipt_id=None, pooled_limit=5)


def _usage_event() -> dict:
    """What one recall of one served chunk queues for the usage writer."""
    from types import SimpleNamespace

    from orchestrator.recall.learning import usage_params

    pooled = [SimpleNamespace(key="k0", item_table="sources.chunks", item_id=uuid.uuid4(),
                              document_id=None)]
    report = RankReport(model="test", keys=["k0"],
                        features=np.zeros((1, len(FEATURES)), dtype=np.float32))
    event = usage_params(operation="recall", channel="cli", question="q", report=report,
                         served=[("sources.chunks", pooled[0].item_id)], pooled=pooled,
                         model_id=None, receipt_id=None, pooled_limit=5)
    assert event is not None
    return event


def test_usage_rows_are_written_per_reader_and_a_refused_event_never_holds_the_rest(
        tenant_factory, app_engine, caplog):
    """The background writer writes each reader's queued events in one transaction, each under
    a savepoint: an event the database refuses (here a model id that names no stored model)
    is skipped, counted and logged, and the reader's other events are written; a reader the
    database no longer accepts is dropped and counted, not retried forever; a reader whose
    flush fails for another reason keeps its events, in order, for the next flush."""

    from orchestrator.auth import Identity
    from orchestrator.recall.access import UsageRows

    t = tenant_factory("team")
    alice, bob = t.identity("alice", write=("team",)), t.identity("bob", read=("team",))
    good = _usage_event()
    rows = UsageRows(app_engine)
    rows.add(alice, good)
    rows.add(alice, dict(good, model_id=uuid.uuid4()))  # no such stored model: refused
    rows.add(alice, dict(good, ch="mcp"))
    rows.add(bob, good)
    ghost = Identity.of(str(uuid.uuid4()), "nobody", read=["team"])  # no such tenant
    rows.add(ghost, good)
    assert rows.waiting == 5
    with caplog.at_level("WARNING", logger="engram.recall.access"):
        assert rows.flush() == 3
    assert (rows.written, rows.poisoned, rows.dropped, rows.waiting) == (3, 1, 1, 0)
    assert any("refused and skipped" in r.getMessage() for r in caplog.records)
    with bound_session(app_engine, alice) as s:
        assert sorted(s.execute(text("select channel from memory.rank_events")).scalars()) == \
            ["cli", "mcp"]
        assert s.execute(text("select count(*) from memory.usage_ledger "
                              "where operation = 'recall.served'")).scalar() == 2  # hers
    with bound_session(app_engine, bob) as s:
        assert s.execute(text("select count(*) from memory.rank_events")).scalar() == 1

    # A failure that is not the reader's (the database unreachable) keeps everything queued.
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    gone = create_engine(make_url(app_engine.url).set(port=9))
    stuck = UsageRows(gone)
    stuck.add(alice, good)
    stuck.add(alice, dict(good, ch="mcp"))
    assert stuck.flush() == 0 and stuck.waiting == 2 and stuck.dropped == 0
    gone.dispose()


def test_a_usage_event_that_fails_the_same_way_every_time_is_skipped_not_retried_forever(
        tenant_factory, app_engine, monkeypatch):
    """One bad event never stops the rest: a unique violation and parameters that cannot be
    written at all fail the same way on every flush, so they are skipped and counted (they
    used to keep the whole reader's queue, retried on every flush, forever); a deadlock is
    another transaction's doing and keeps the queue, in order, for the next flush."""

    import psycopg
    from sqlalchemy.exc import DBAPIError

    import orchestrator.recall.learning as learning
    from orchestrator.recall.access import UsageRows

    t = tenant_factory("team")
    alice = t.identity("alice", write=("team",))
    good = _usage_event()
    write = learning.write_usage
    refusals = {"duplicate": psycopg.errors.UniqueViolation, "deadlock": psycopg.errors.DeadlockDetected}

    def failing(session, params):
        if params["model"] in refusals:
            raise DBAPIError("insert", {}, refusals[params["model"]]("refused"))
        return write(session, params)

    monkeypatch.setattr(learning, "write_usage", failing)
    rows = UsageRows(app_engine)
    rows.add(alice, dict(good, model="duplicate"))
    rows.add(alice, dict(good, features="not a feature matrix"))
    rows.add(alice, dict(good, ch="mcp"))
    assert rows.flush() == 1
    assert (rows.written, rows.poisoned, rows.waiting) == (1, 2, 0)

    rows.add(alice, dict(good, ch="graphql", model="deadlock"))
    rows.add(alice, dict(good, ch="rest"))
    assert rows.flush() == 0 and rows.waiting == 2 and rows.poisoned == 2
    monkeypatch.setattr(learning, "write_usage", write)  # the other transaction is gone
    assert rows.flush() == 2 and rows.waiting == 0
    with bound_session(app_engine, alice) as s:
        assert sorted(s.execute(text("select channel from memory.rank_events")).scalars()) == \
            ["graphql", "mcp", "rest"]


def test_candidates_carry_the_stored_embeddings_exactly(tenant_factory, app_engine, embedder,
                                                        settings):
    """The statement sends embeddings in pgvector's binary form (``VectorBytes``): each
    chunk candidate's vector is the stored one, float for float."""
    from pgvector.sqlalchemy import Vector

    alice = tenant_factory("team").identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, NOTES, settings)
    recaller = recaller_with(app_engine, settings, embedder)
    recaller.keep_candidates = True
    _result, trace = recaller.trace(alice, "when is the boiler serviced?")
    assert trace.replay is not None
    found = [c for c in trace.replay[2] if c.item_table == "sources.chunks"]
    assert len(found) >= 2 and all(c.embedding is not None for c in found)
    with bound_session(app_engine, alice) as s:
        for c in found:
            stored = s.execute(text("select embedding from sources.chunks where id = :i")
                               .columns(embedding=Vector()), {"i": c.item_id}).scalar_one()
            assert c.embedding.dtype == np.float32
            assert np.array_equal(c.embedding, np.asarray(stored, dtype=np.float32))


def test_the_candidates_and_their_features_do_not_follow_the_statements_row_order(
        tenant_factory, app_engine, embedder, settings, monkeypatch):
    """The statement's rows come in its plan's order, which follows the random row ids: the
    same notes ingested twice came back in another order, and the features that read the
    list in order (what is fused above a candidate, the best source's time), the models
    trained on them and the cross-validated figures changed from run to run. The candidates
    are put in fused order with meaningful ties, whatever order the rows came in."""
    from orchestrator.recall import service
    from orchestrator.recall.tail import candidates_from_rows

    alice = tenant_factory("team").identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, NOTES, settings)
    captured: list[list[dict]] = []
    loaded = service._loaded
    monkeypatch.setattr(service, "_loaded", lambda result: captured.append(loaded(result))
                        or captured[-1])
    recaller_with(app_engine, settings, embedder).trace(alice, "when is the boiler serviced?")
    rows = captured[-1]
    assert len(rows) > 5
    ctx = RankContext("when is the boiler serviced?", "alice",
                      embedder.embed_query("when is the boiler serviced?"))
    got = []
    for ordered in (rows, rows[::-1]):
        candidates, _ = candidates_from_rows(ordered, catalog_rrf=0.01)
        got.append(([c.key for c in candidates], feature_matrix(candidates, ctx)))
    assert got[0][0] == got[1][0]
    assert np.array_equal(got[0][1], got[1][1], equal_nan=True)


def test_usage_rows_store_the_feature_values_exactly_and_missing_ones_as_null(
        tenant_factory, app_engine):
    """The features go to PostgreSQL as one real[] literal: every float32 value comes back
    as it was, a missing value (NaN) is NULL, infinities stay infinite, and the rows are
    the pooled items' in the order given (served first)."""
    from types import SimpleNamespace

    alice = tenant_factory("team").identity("alice", write=("team",))
    rng = np.random.default_rng(5)
    matrix = (rng.standard_normal((3, len(FEATURES))) * 1e3).astype(np.float32)
    matrix[0, 1] = np.nan
    matrix[1, 2], matrix[2, 3] = np.inf, -np.inf
    matrix[2, 0] = np.float32(1.0000001e-30)
    pooled = [SimpleNamespace(key=f"k{i}", item_table="sources.chunks", item_id=uuid.uuid4(),
                              document_id=None) for i in range(3)]
    report = RankReport(model="test", keys=["k2", "k0", "k1"], features=matrix)
    with bound_session(app_engine, alice) as s:
        event = record_usage(s, operation="recall", channel="cli", question="q", report=report,
                             served=[], pooled=pooled, model_id=None, receipt_id=None,
                             pooled_limit=5)
        row = s.execute(text("select item_ids, features from memory.rank_events where id = :e"),
                        {"e": event}).one()
    assert row.item_ids == [p.item_id for p in pooled]
    stored = np.array([np.nan if v is None else v for v in row.features],
                      dtype=np.float32).reshape(3, len(FEATURES))
    expected = matrix[[1, 2, 0]]  # pooled k0, k1, k2 are report rows 1, 2, 0
    assert np.array_equal(stored, expected, equal_nan=True)
    assert row.features.count(None) == 1


def _service(t) -> ServiceTenant:
    return ServiceTenant(t.id, t.org_id, ("team",))


def test_a_tenant_model_trained_on_planted_feedback_learns_it_and_only_from_that_tenant(
        tenant_factory, app_engine, embedder, settings):
    """Users of tenant A always use the excerpt about the Nordheat contract, which fused order
    puts below the boiler manual; tenant B has the same documents and no feedback."""
    a, b = tenant_factory("team"), tenant_factory("team")
    docs = [doc(f"n{i}.md", f"Note {i}", body) for i, body in enumerate([
        "Boiler manual: the boiler pressure should read 1.5 bar; bleed the radiators in autumn.",
        "Boiler log: the boiler was repaired in January and the boiler pump replaced.",
        "Nordheat contract: yearly service visit, invoices go to the landlord.",
        "Kitchen: the dishwasher filter is cleaned every Sunday."])]
    questions = ["boiler service", "who services the boiler?", "boiler maintenance visit",
                 "when is the boiler checked?", "boiler repairs", "heating service contract"]
    tuned = settings.model_copy(update={"rank_min_events": 12, "rank_holdout_share": 0.25})
    recaller = recaller_with(app_engine, tuned, embedder)
    for tenant in (a, b):
        write_documents(app_engine, tenant.identity("w", write=("team",)), embedder, docs, tuned)
    for n in range(24):
        user = a.identity(f"user{n % 3}", read=("team",))
        result = recaller.recall(user, questions[n % len(questions)])
        used = [(e.item_table, e.item_id) for e in result.evidence
                if e.source is not None and e.source.path == "n2.md"]
        assert used, "the planted item must be served to be used"
        with bound_session(app_engine, user) as s:
            mark_evidence_used(s, used, channel="python")
    with service_session(app_engine, _service(b)) as s:
        report_b = train_tenant(s, b.org_id, tuned)
    assert report_b.events == 0 and report_b.version is None
    assert "not trained: 0 event(s)" in report_b.reason
    with service_session(app_engine, _service(a)) as s:
        report = train_tenant(s, a.org_id, tuned, activate="always")
    assert report.events == 24 and report.held_back == 6 and report.version == 1
    assert report.figures["new"] > report.figures["fused"]
    assert any("unbiased LambdaMART" in line for line in report.lines())
    with bound_session(app_engine, a.identity("reader", read=("team",))) as s:
        stored = s.execute(text("select version, active, events from memory.rank_models")).one()
    assert (stored.version, stored.active, stored.events) == (1, True, 18)
    fresh = recaller_with(app_engine, tuned, embedder)
    ranked, trace = fresh.trace(a.identity("user9", read=("team",)), "boiler service")
    assert trace.ranker.startswith("tenant v1")
    assert ranked.evidence[0].source is not None and ranked.evidence[0].source.path == "n2.md"
    with bound_session(app_engine, b.identity("reader", read=("team",))) as s:
        assert s.execute(text("select count(*) from memory.rank_models")).scalar() == 0
    with bound_session(app_engine, a.identity("user0", read=("team",))) as s, \
            pytest.raises(BadInput, match="service identity"):
        train_tenant(s, a.org_id, tuned)


def test_every_plan_study_shape_runs_and_learned_and_fused_differ_only_in_the_ranker(
        tenant_factory, app_engine, embedder, settings):
    from orchestrator.recall import PLAN_STUDY

    t = tenant_factory("team")
    alice = t.identity("alice", write=("team",))
    write_documents(app_engine, alice, embedder, NOTES, settings)
    recaller = recaller_with(app_engine, settings, embedder, recall_receipts=False,
                             rank_usage_rows=False)
    for name, shape in PLAN_STUDY.items():
        result, trace = recaller.study(alice, "boiler service in March", shape)
        assert trace.plan == name and result.evidence, name
    assert PLAN_STUDY["learned"].same_plan(PLAN_STUDY["full"])
    assert not PLAN_STUDY["fused"].same_plan(PLAN_STUDY["full"])
    _, learned = recaller.study(alice, "boiler service in March", PLAN_STUDY["learned"])
    _, fused = recaller.study(alice, "boiler service in March", PLAN_STUDY["fused"])
    assert learned.ranker.startswith("default ") and fused.ranker == (
        "off in plan shape fused; fused order is used")
    assert {it.key for it in learned.ordered} == {it.key for it in fused.ordered}


def test_kinds_the_model_never_saw_are_placed_by_their_fused_score():
    from orchestrator.recall.features import KIND_CODES
    from orchestrator.recall.ranker import place_unseen

    m = np.zeros((4, len(FEATURES)), dtype=np.float32)
    m[:, FEATURES.index("kind")] = [0, 0, 0, KIND_CODES["session note"]]
    m[:, FEATURES.index("rrf")] = [0.3, 0.2, 0.1, 0.25]
    scores = np.array([3.0, 1.0, 2.0, -9.0])
    assert place_unseen(scores, m, [KIND_CODES["source"]]) == 1
    # fused above two of the three known candidates: two thirds up the model's scores
    assert scores[3] == pytest.approx(np.quantile([1.0, 2.0, 3.0], 2 / 3))
    assert place_unseen(scores, m, None) == 0


def test_the_trace_names_a_seed_shared_by_two_entities_once():
    """Two entities may share a name (a parser typed "Installs" both a place and an
    organisation); the trace said "entity seeds: Installs, Installs"."""
    from orchestrator.recall.trace import Trace

    t = Trace("q", None, "full", None, 100, corpus={"seeds": ["Ada", "Installs", "Installs"]})
    assert "entity seeds: Ada, Installs (2 entities)" in t.format()
    assert "entity seeds: none" in Trace("q", None, "full", None, 100,
                                         corpus={"seeds": []}).format()
