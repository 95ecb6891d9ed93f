"""Title authority, catalogs, curation (pinned, snoozed, archived) and duplicate suppression."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import Chunk, Document
from orchestrator.db.session import bound_session
from orchestrator.recall.plan import FULL_PLAN
from tests.support.recall import doc, embedder, recaller, recaller_with, write_documents

__all__ = ["embedder", "recaller"]


def direct_titles(trace):
    return {it.label.split(" #")[0] for it in trace.pools["title"] if it.direct}


def named_titles(trace):
    return {it.label.split(" #")[0] for it in trace.pools["title"]}


def test_title_containment_longest_keeps_direct_bit_and_peers_stay(
        tenant_factory, app_engine, embedder, settings, recaller):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("n2.md", "JLPT N2", "Grammar lists and kanji for the N2 exam."),
        doc("plan.md", "JLPT N2 Window Weekly Plan", "Monday reading, Wednesday listening."),
        doc("kyoto.md", "Kyōto Trip", "Temples to visit and the ryokan booking."),
        doc("plan2.md", "Plan", "A one-word title that must not match 'planning'."),
        doc("other.md", "Unrelated", "Nothing about exams here."),
    ], settings)
    question = "What is in my jlpt n2 window weekly plan, and what about the KYOTO trip?"
    result, trace = recaller.trace(ident, question)
    assert named_titles(trace) == {"JLPT N2", "JLPT N2 Window Weekly Plan", "Kyōto Trip", "Plan"}
    # JLPT N2 and Plan are contained in the longer named title; Kyōto Trip is a peer.
    assert direct_titles(trace) == {"JLPT N2 Window Weekly Plan", "Kyōto Trip"}
    first_two = {e.source.title for e in result.evidence[:2]}
    assert first_two == {"JLPT N2 Window Weekly Plan", "Kyōto Trip"}

    # Word boundaries: "planning" does not name the document titled "Plan".
    _, t2 = recaller.trace(ident, "any planning tips?")
    assert "Plan" not in named_titles(t2)
    # Removing the title lane removes the direct-subject bit.
    from orchestrator.recall import PLAN_STUDY

    _study, st = recaller.study(ident, question, PLAN_STUDY["no-title"])
    assert not any(it.direct for it in st.ordered)


def test_an_entity_named_by_its_alias_names_the_document_titled_by_its_name(
        tenant_factory, app_engine, embedder, settings, recaller):
    from orchestrator.db.session import bound_session
    from orchestrator.ingest import knowledge as kn

    t = tenant_factory("team", "exec")
    alice = t.identity("alice", write=("team",))
    carol = t.identity("carol", write=("team", "exec"))
    write_documents(app_engine, alice, embedder, [
        doc("people/priya.md", "Priya Raman", "Staff engineer on the platform team. Works on "
            "Project Heron and the billing migration."),
        doc("people/marco.md", "Marco Rossi", "Joined the on-call rotation in November."),
        doc("daily.md", "2026-12-01", "Priya asked for the design doc; Marco paged twice."),
    ], settings)
    with bound_session(app_engine, carol) as s:
        kn.add_aliases(s, kn.resolve_entity(s, "person", "Priya Raman", ["team"]), ["Priya"])
        # Marco's entity (and so his alias) only the exec scope may read.
        kn.add_aliases(s, kn.resolve_entity(s, "person", "Marco Rossi", ["exec"]), ["Marco"])

    result, trace = recaller.trace(alice, "what does Priya work on?")
    assert trace.corpus["seeds"] == ["Priya Raman"]
    assert direct_titles(trace) == {"Priya Raman"}
    assert result.evidence[0].source.title == "Priya Raman"
    # A reader who cannot see the entity gets no document through it: alice's question
    # names no "Marco" she may read, so his note is no subject of hers; carol's is.
    _, trace = recaller.trace(alice, "what does Marco do?")
    assert trace.corpus["seeds"] == [] and named_titles(trace) == set()
    _, trace = recaller.trace(carol, "what does Marco do?")
    assert direct_titles(trace) == {"Marco Rossi"}
    # Without the title lane the entity names nothing.
    from orchestrator.recall import PLAN_STUDY

    _study, st = recaller.study(alice, "what does Priya work on?", PLAN_STUDY["no-title"])
    assert not any(it.direct for it in st.ordered)


def test_a_title_most_visible_chunks_hold_names_no_document(
        tenant_factory, app_engine, embedder, settings, recaller):
    """npm's own docs: every page says "npm", so "where does npm keep its cache?" names the
    corpus's topic, not the page titled "npm". Which chunks count is the reader's: with a
    scope of other pages in view the same word singles the page out again. A question about
    nothing else ("what is npm?") names the page, and so does any title when fewer than
    ``recall_title_common_min`` chunks outside its document hold its words."""
    t = tenant_factory("team", "exec")
    alice = t.identity("alice", write=("team",))
    carol = t.identity("carol", write=("team", "exec"))
    commands = ["access", "audit", "bugs", "ci", "config", "dedupe", "doctor", "edit", "exec",
                "explain", "fund", "init", "link", "login", "ls", "outdated", "owner", "pack",
                "ping", "prune", "publish", "query", "rebuild", "repo", "search"]
    write_documents(app_engine, alice, embedder, [
        doc("npm.md", "npm", "npm is the package manager for the Node JavaScript platform."),
        doc("cache.md", "npm-cache", "npm stores cache data in an opaque directory; "
            "npm cache clean removes it."),
        *[doc(f"commands/{c}.md", f"npm-{c}", f"Run npm {c} in a project folder; npm {c} "
              "reads the package.json file there.") for c in commands],
    ], settings)
    write_documents(app_engine, carol, embedder, [
        doc(f"exec/{i}.md", f"Board minutes {i}", f"The board met on day {i} and approved "
            "the budget for the offsite.", scopes=("exec",)) for i in range(30)
    ], settings)

    question = "where does npm keep its cache?"
    _, trace = recaller.trace(alice, question)
    assert named_titles(trace) == set()
    # 26 of the 27 visible chunks hold "npm", 26 outside npm.md's one.
    assert trace.corpus["common_titles"] == [("npm", 26, 26)]
    assert "'npm' (its rarest word in 26 of the 26 chunks outside it)" in trace.format()
    assert "Board minutes" not in trace.format()  # carol's pages count for carol only
    # A question about nothing but the title's words still names it.
    _, trace = recaller.trace(alice, "what is npm?")
    assert direct_titles(trace) == {"npm"}
    # Another named title with a rarer word is still a subject: "npm cache" names npm-cache.
    _, trace = recaller.trace(alice, "how does npm cache clean work?")
    assert direct_titles(trace) == {"npm-cache"}
    # carol also sees thirty pages without the word: 26 of 56 chunks outside npm.md hold
    # it, npm is named.
    _, trace = recaller.trace(carol, question)
    assert direct_titles(trace) == {"npm"}
    assert "common_titles" not in trace.corpus
    # Both bounds are settings: at a share of 1.0, or a floor above 26 chunks, npm is named.
    for overrides in ({"recall_title_common_share": 1.0}, {"recall_title_common_min": 27}):
        _, trace = recaller_with(app_engine, settings, embedder, **overrides).trace(alice, question)
        assert direct_titles(trace) == {"npm"}, overrides


def test_a_title_named_inside_a_longer_phrase_another_title_holds_names_no_subject(
        tenant_factory, app_engine, embedder, settings, recaller):
    """Node.js's contributor guides: "what does a security steward do?" named SECURITY.md
    (titled "Security") by its title, and its disclosure policy was served first, over the
    page about stewards that both lanes ranked first. The question's "security steward" is
    a longer phrase that a found page's title holds: the page titled "Security" is no direct
    subject then, and competes on merit. A question whose phrase no other title holds still
    names it, and so does one whose next word is filler."""
    from orchestrator.recall.tail import title_words

    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("SECURITY.md", "Security", "Report a vulnerability to the security team; a "
            "primary handler coordinates the fix and the disclosure."),
        doc("steward.md", "Security Steward Onboarding", "A security steward coordinates a "
            "security release: the steward plans it, prepares the fixes and announces it."),
        doc("triage.md", "Triage", "Label new issues within a week."),
    ], settings)
    result, trace = recaller.trace(ident, "What does a security steward do?")
    assert trace.narrower == [("Security", "security steward", "Security Steward Onboarding")]
    assert not any(it.direct for it in trace.ordered), trace.ordered
    assert result.evidence[0].source.title == "Security Steward Onboarding"
    assert ("'Security' ('security steward', of 'Security Steward Onboarding')"
            in trace.format())
    for question in ("What is the security disclosure policy?", "Is security of the team ok?"):
        _, trace = recaller.trace(ident, question)
        assert trace.narrower == [] and direct_titles(trace) == {"Security"}, question
        assert any(it.direct for it in trace.ordered), question
    assert title_words("Kyōto  Trip: day-2!") == ["kyoto", "trip", "day", "2"]


def test_a_title_is_named_with_the_articles_a_question_puts_between_its_words(
        tenant_factory, app_engine, embedder, settings, recaller):
    """CMake's commands are titled by identifiers (add_library, add_test) that a question
    says with an article between the words: "how do I add a library target?" names the page
    titled add_library, as "add library" does. The words themselves must still be there in
    order: "a library to add" names nothing."""
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("command/add_library.md", "add_library", "Add a library target built from the "
            "source files listed."),
        doc("command/add_test.md", "add_test", "Add a test to the project, run by ctest."),
        doc("notes/library.md", "Library notes", "Our team keeps notes on the library here."),
    ], settings)
    for question, named in (("How do I add a library target?", {"add_library"}),
                            ("how to add the test that ctest runs", {"add_test"}),
                            ("add library and add an test", {"add_library", "add_test"}),
                            ("is there a library to add?", set())):
        _, trace = recaller.trace(ident, question)
        assert direct_titles(trace) == named, (question, trace.pools.get("title"))


def test_a_one_word_title_whose_page_neither_lane_found_names_no_subject(
        tenant_factory, app_engine, embedder, settings, recaller):
    """CMake's reference: "how do I set the C++ standard for a target?" named the page of
    the ``set`` command by its one-word title, and it was served first, while the dense and
    lexical lanes' first forty held none of it. Such a page is no direct subject and competes
    on merit; a question about the title alone, or one whose other words find the page, still
    names it. The verdict and the trace line are the reader's own: the forty pages that push
    the page out of both lanes are exec's, and a team reader's lanes find it."""
    t = tenant_factory("team", "exec")
    ident = t.identity(write=("team", "exec"))
    write_documents(app_engine, ident, embedder, [
        doc("command/set.md", "set", "set(<variable> <value>) gives a normal, cache or "
            "environment variable the value."),
        doc("manual/features.md", "Compile features", "Require a C++ language standard for a "
            "target with target_compile_features(tgt PUBLIC cxx_std_17)."),
        # Forty pages hold "set" and the question's other words; fifty hold neither, so "set"
        # is in fewer than half of the chunks (else no title with it names anything).
        *[doc(f"command/target_{i}.md", f"target_option_{i}", f"Target option {i}: set the "
              f"C++ standard flags of target {i} for each language.", scopes=("exec",))
          for i in range(40)],
        *[doc(f"glossary/{i}.md", f"Glossary entry {i}", f"Entry {i} of the glossary: words "
              "about linking, packaging and testing.") for i in range(50)],
    ], settings)
    question = "How do I set the C++ standard for a target?"
    result, trace = recaller.trace(ident, question)
    assert trace.unfound == ["set"], trace.format()
    assert not any(it.direct for it in trace.ordered)
    assert result.evidence[0].source.title != "set"
    assert "neither the dense nor the lexical lane found (no direct subjects): 'set'" in trace.format()
    # The title alone, or a question whose other words find the page: the page is the subject.
    for named in ("what does set do?", "how do I set a cache variable to a value?"):
        result, trace = recaller.trace(ident, named)
        assert trace.unfound == [] and direct_titles(trace) == {"set"}, named
        assert result.evidence[0].source.title == "set", named
    # A plan without the lexical lane cannot tell: the title names the page as before.
    _, trace = recaller.study(ident, question, FULL_PLAN.without("no-lexical", lexical=False))
    assert trace.unfound == [] and direct_titles(trace) == {"set"}
    # A team reader does not see exec's pages: its lanes find the page, which stays named,
    # and its trace has no such line.
    result, team = recaller.trace(t.identity("ann", read=("team",)), question)
    assert team.unfound == [] and direct_titles(team) == {"set"}, team.format()
    assert "neither the dense nor the lexical lane found" not in team.format()
    assert "target_option" not in team.format()


def test_a_longer_title_the_reader_cannot_see_neither_narrows_nor_shows_in_the_trace(
        tenant_factory, app_engine, embedder, settings, recaller):
    """The trace line of ``narrower_subjects`` names another document's title: only a title
    among the reader's own candidates may clear a direct subject or be named. A team reader
    is not told of exec's page, and its "Security" page stays the subject; an exec reader's
    trace names the page and the subject competes on merit."""
    t = tenant_factory("team", "exec")
    write_documents(app_engine, t.identity(write=("team", "exec")), embedder, [
        doc("SECURITY.md", "Security", "Report a vulnerability to the security team; a "
            "primary handler coordinates the fix and the disclosure."),
        doc("steward.md", "Security Steward Onboarding", "A security steward coordinates a "
            "security release: the steward plans it and announces it.", scopes=("exec",)),
    ], settings)
    question = "What does a security steward do?"
    _, team = recaller.trace(t.identity("ann", read=("team",)), question)
    assert team.narrower == [] and any(it.direct for it in team.ordered), team.ordered
    assert "Steward Onboarding" not in team.format()
    _, both = recaller.trace(t.identity("bo", read=("team", "exec")), question)
    assert both.narrower == [("Security", "security steward", "Security Steward Onboarding")]
    assert not any(it.direct for it in both.ordered)


def test_a_long_named_document_puts_its_best_chunks_first_and_the_rest_compete(
        tenant_factory, app_engine, embedder, settings, recaller):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    places = ["harbour entrance", "north pier", "fuel dock", "slipway", "outer mole",
              "fish quay", "lock gates", "sand bar", "lifeboat station", "ferry ramp"]
    body = "\n\n".join(
        f"## {p.title()}\n\n" + f"At the {p} the tide tables give the depth at low water "
        f"and the hours of slack water; boats at the {p} wait for the flood tide. " * 6
        for p in places)
    write_documents(app_engine, ident, embedder, [
        doc("tides.md", "Tide Tables", body),
        doc("log.md", "Harbour log", "The harbour entrance silted up: at low water the "
            "harbour entrance has one metre less depth than the tide tables say."),
    ], settings)
    result, trace = recaller.trace(ident, "what do the tide tables say about the harbour "
                                          "entrance at low water?")
    named = [it for it in trace.ordered if it.label.startswith("Tide Tables")]
    assert len(named) > settings.recall_title_chunks, "the document must be long for this case"
    # Only the named document's recall_title_chunks best chunks keep the direct-subject bit
    # and come first; its other chunks compete on merit (before this stop every chunk of a
    # named document was direct: a long one filled the whole budget ahead of any other
    # evidence).
    direct = [it for it in trace.ordered if it.direct]
    assert len(direct) == settings.recall_title_chunks
    assert all(it.label.startswith("Tide Tables") for it in direct)
    assert trace.ordered[:len(direct)] == direct
    # The direct ones are the document's best by merit (what the ranker thinks), whichever
    # lane found them.
    best = sorted(named, key=lambda it: -it.merit)[:len(direct)]
    assert {it.label for it in direct} == {it.label for it in best}
    assert any(not it.direct for it in named)
    assert (f"(their best chunks, a link list only where nothing else of them was found; "
            f"{len(named) - len(direct)} more of their chunks compete on merit)") in trace.format()
    assert [e.source.title for e in result.evidence[:len(direct)]] == ["Tide Tables"] * len(direct)


def test_a_named_documents_link_list_is_no_direct_subject_while_its_prose_was_found(
        tenant_factory, app_engine, embedder, settings, recaller):
    """pip's docs (stop 40): "how do I install a package from a local directory with pip?"
    names the page titled "pip", whose two chunks were both served first: its overview and
    a chunk of nothing but link reference definitions ("[pypi]: https://pypi.org/"). The
    answer, another page, came third and was cut to fit."""
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    intro = ("# Widget\n\nWidget is the [build tool for gadgets][tool]. You can use it to "
             "build gadgets from the [Gadget Index][index] and from other indexes.\n\n")
    prose = " ".join(f"Widget reads the gadget recipe in step {n}, checks every part against "
                     "the index and writes the finished gadget to the output folder."
                     for n in range(1, 9))
    refs = "\n".join(f"[{name}]: https://widget.example/{name}/install-local-folder-{n}"
                     for n, name in enumerate(("tool", "index", "issues", "chat", "forum", "irc",
                                               "mail", "wiki")))
    write_documents(app_engine, ident, embedder, [
        doc("widget.md", "Widget", intro + prose + "\n\n" + refs + "\n"),
        doc("local.md", "Local installs", "To install a gadget from a local folder, run "
            "`widget install ./path/to/folder`: the folder is built and installed as it is."),
    ], settings)
    question = "how do I install a gadget from a local folder with widget?"
    result, trace = recaller.trace(ident, question)
    with bound_session(app_engine, ident) as session:
        overview, links = session.execute(
            select(Chunk.id).join(Document, Document.id == Chunk.document_id)
            .where(Document.path == "widget.md").order_by(Chunk.ordinal)).scalars().all()
    direct = {it.label.rsplit("#", 1)[1]: it.direct for it in trace.ordered
              if it.label.startswith("Widget #")}
    assert set(direct) == {str(overview), str(links)}, "both chunks must be candidates here"
    assert direct == {str(overview): True, str(links): False}
    assert trace.direct_lost == 1
    # The overview first (the named subject), then the answer; the link list behind it.
    titles = [e.source.title for e in result.evidence]
    assert titles[:2] == ["Widget", "Local installs"]
    assert all("[tool]: https://" not in e.text for e in result.evidence[:2])
    # With the navigation rule off both chunks of the page are direct, as before.
    off = recaller_with(app_engine, settings, embedder, recall_navigation_discount=1.0)
    _, trace = off.trace(ident, question)
    assert [it.direct for it in trace.ordered if it.label.startswith("Widget #")] == [True, True]


def test_project_catalog_lists_only_active_and_waiting_with_state_beside_area(
        tenant_factory, app_engine, embedder, settings, recaller):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("p1.md", "Roof repair", "Get three quotes.", kind="project", state="Active",
            area="Home"),
        doc("p2.md", "Visa renewal", "Waiting on the embassy.", kind="project", state="Waiting",
            area="Admin"),
        doc("p3.md", "Old website", "Shipped.", kind="project", state="Done", area="Work"),
        doc("p4.md", "Learn cello", "Someday.", kind="project", state="Someday", area="Music"),
        doc("p5.md", "Archived thing", "Gone.", kind="project", state="Active", area="Home"),
        doc("n1.md", "Active note", "A note, not a project.", kind="note", state="Active",
            area="Home"),
        doc("p6.md", "Old attic sort-out", "Done long ago.", kind="project", state="Active",
            area="Attic"),
    ], settings, **{"p5.md": {"archived_at": datetime.now(UTC)},
                    "p6.md": {"archived_at": datetime.now(UTC)}})
    result, _trace = recaller.trace(ident, "what am I working on right now?")
    catalog = next(e for e in result.evidence if e.text.startswith("Current projects"))
    lines = catalog.text.splitlines()[1:]
    assert lines == ["- Visa renewal: Waiting | area Admin", "- Roof repair: Active | area Home"]
    areas = next(e for e in result.evidence if e.text.startswith("Areas:"))
    # Every area of a current document, once; Attic's only document is archived.
    assert areas.text.splitlines()[1:] == ["- Admin", "- Home", "- Music", "- Work"]
    assert [s.name for s in catalog.scopes] == ["team"]
    _, no_catalogs = recaller.study(ident, "what am I working on right now?",
                                    __import__("orchestrator.recall", fromlist=["x"])
                                    .PLAN_STUDY["dense-only"])
    assert not no_catalogs.pools.get("project_catalog")


def test_a_question_that_asks_for_the_projects_or_areas_gets_that_catalog_first(
        tenant_factory, app_engine, embedder, settings, recaller):
    """A catalog has one fixed fused score and no ranker was trained on catalogs: "which
    projects are active?" put the Project catalog twelfth of eighteen on a vault's notes,
    past a 600-token budget. The plural that asks for the list names the catalog; "the
    project" names one project, whose note the other lanes find."""
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("p1.md", "Roof repair", "Get three quotes for the roof; the project is active.",
            kind="project", state="Active", area="Home"),
        doc("p2.md", "Visa renewal", "Waiting on the embassy.", kind="project", state="Waiting",
            area="Admin"),
        *[doc(f"n{i}.md", f"Project notes {i}", f"Active projects need weekly reviews, note {i}.")
          for i in range(6)],
    ], settings)
    result, trace = recaller.trace(ident, "which projects are active?")
    assert result.evidence[0].text.startswith("Current projects (Active or Waiting):")
    assert "catalogs the question asks for by name (direct subjects): project catalog" \
        in trace.format()
    areas, _ = recaller.trace(ident, "What areas do I have?")
    assert areas.evidence[0].text.startswith("Areas:")
    _, one = recaller.trace(ident, "is the roof repair project active?")
    assert not one.catalogs and not any(it.direct for it in one.ordered if it.kind == "project_catalog")


def test_snoozed_and_archived_hidden_pinned_boosted(
        tenant_factory, app_engine, embedder, settings, recaller):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    later = datetime.now(UTC) + timedelta(days=3)
    write_documents(app_engine, ident, embedder, [
        doc("a.md", "Sourdough A", "Feed the sourdough starter with rye flour every morning."),
        doc("b.md", "Sourdough B", "The sourdough starter smells of acetone when hungry."),
        doc("c.md", "Sourdough C", "Sourdough starter jars should be loosely covered."),
        doc("d.md", "Bread pinned", "Bake at 250 degrees with steam for the first 20 minutes."),
    ], settings, **{"a.md": {"snoozed_until": later}, "b.md": {"archived_at": datetime.now(UTC)}})
    question = "how do I care for my sourdough starter?"
    result, trace = recaller.trace(ident, question)
    paths = [e.source.path for e in result.evidence if e.source]
    assert "a.md" not in paths and "b.md" not in paths
    # Never a candidate, yet the trace says a lane found them and hydration dropped them
    # (the caller may see archived and snoozed documents; recall only never serves them).
    served = [it.label for it in trace.fused + trace.ordered]
    assert not [label for label in served if label.startswith(("Sourdough A", "Sourdough B"))]
    dropped = {d.label.split(" #")[0]: d for d in trace.hydration_dropped}
    assert set(dropped) == {"Sourdough A", "Sourdough B"}
    assert dropped["Sourdough A"].reason == "snoozed" and dropped["Sourdough B"].reason == "archived"
    assert all(d.rrf > 0 and d.lanes for d in dropped.values())
    assert "dropped Sourdough B" in trace.format() and "document archived" in trace.format()
    before = next(it for it in trace.ordered if it.label.startswith("Bread pinned"))
    rank_before = trace.ordered.index(before)
    assert rank_before > 0

    write_documents(app_engine, ident, embedder, [], settings, **{"d.md": {"pinned": True}})
    _, pinned_trace = recaller.trace(ident, question)
    after = next(it for it in pinned_trace.ordered if it.label.startswith("Bread pinned"))
    assert after.pinned and not before.pinned
    assert after.merit == pytest.approx(before.merit + settings.recall_pin_boost)
    assert pinned_trace.ordered.index(after) <= rank_before


def test_pin_boost_reorders_close_candidates():
    from orchestrator.recall.result import ScopeRef
    from orchestrator.recall.tail import Candidate, assign_merit, order

    scope = (ScopeRef("team", ""),)
    cands = [Candidate(key=k, kind="source", text=k, scopes=scope, rrf=r, pinned=(k == "c"))
             for k, r in (("a", 0.030), ("b", 0.025), ("c", 0.024))]
    assign_merit(cands, 0.3)
    assert [c.key for c in order(cands)] == ["a", "c", "b"]
    for c in cands:
        c.pinned = False
    assign_merit(cands, 0.3)
    assert [c.key for c in order(cands)] == ["a", "b", "c"]


def test_near_duplicates_are_suppressed(tenant_factory, app_engine, embedder, settings, recaller):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    text = "The boiler service is booked for the 14th of March at nine."
    write_documents(app_engine, ident, embedder, [
        doc("one.md", "Boiler", text), doc("two.md", "Boiler copy", text),
        doc("three.md", "Car", "The car's MOT is due in April."),
    ], settings)
    result, trace = recaller.trace(ident, "when is the boiler service?")
    paths = [e.source.path for e in result.evidence if e.source]
    assert len({"one.md", "two.md"} & set(paths)) == 1
    assert len(trace.suppressed) == 1


def test_a_day_the_question_names_makes_the_documents_dated_that_day_its_subjects(
        tenant_factory, app_engine, embedder, settings, recaller):
    from orchestrator.recall.dates import day_bounds, named_days

    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
    other = day - timedelta(days=1)
    busy = day - timedelta(days=30)
    write_documents(app_engine, ident, embedder, [
        doc("daily/a.md", f"{day:%Y-%m-%d}", "Fixed the flaky build; lunch with Marco.",
            occurred_at=day + timedelta(hours=9)),
        doc("daily/b.md", f"{other:%Y-%m-%d}", "Reviewed the billing migration plan.",
            occurred_at=other),
        doc("what.md", "What happened in the outage", "What happened: the disk filled up and "
            "everything that happened after that happened because of it."),
        *(doc(f"chat/{i}.md", f"Message {i}", f"Chat line {i} about lunch.",
              occurred_at=busy + timedelta(minutes=i)) for i in range(settings.recall_title_docs + 1)),
    ], settings)
    asked = day.strftime("%B ") + str(day.day)  # "December 2": no year
    result, trace = recaller.trace(ident, f"what happened on {asked}?")
    assert direct_titles(trace) == {f"{day:%Y-%m-%d}"}
    assert result.evidence[0].source.title == f"{day:%Y-%m-%d}"
    assert f"the question names the day(s) {day:%Y-%m-%d}" in trace.format()
    # The ISO form names it too, and two days name two documents.
    _, t2 = recaller.trace(ident, f"notes from {day:%Y-%m-%d} and {other:%Y-%m-%d}")
    assert direct_titles(t2) == {f"{day:%Y-%m-%d}", f"{other:%Y-%m-%d}"}
    # A day more documents are dated than the title lane takes names none of them; what the
    # lanes found of that day comes first after the direct subjects (merit + recall_day_boost).
    r3, t3 = recaller.trace(ident, f"what did we say about lunch on {busy:%Y-%m-%d}?")
    assert not any(it.label.startswith("Message") and it.direct for it in t3.pools["title"])
    messages = [n for n, it in enumerate(t3.ordered) if it.label.startswith("Message")]
    assert messages and messages == list(range(len(messages)))  # (near-equal lines suppressed)
    assert r3.evidence[0].source.title.startswith("Message")
    assert f"{settings.recall_title_docs + 1} item(s) from a day the question names, merit +1" \
        in t3.format()
    off = recaller_with(app_engine, settings, embedder, recall_day_boost=0.0)
    _, t5 = off.trace(ident, f"what did we say about lunch on {busy:%Y-%m-%d}?")
    assert "from a day the question names" not in t5.format()
    # No day named: the dated notes are no subjects (the same question without its date).
    _, t4 = recaller.trace(ident, "what happened?")
    assert not direct_titles(t4)
    assert day_bounds(named_days("what happened?")) == {"days": None, "days_end": None}


def test_the_days_a_question_names() -> None:
    from datetime import date

    from orchestrator.recall.dates import MOST_DAYS, day_bounds, named_days

    today = date(2026, 12, 5)

    def days(q: str, on: date = today) -> list[str]:
        return [f"{d:%Y-%m-%d}" for d in named_days(q, on)]

    assert days("what happened on December 1?") == ["2026-12-01"]
    assert days("notes from 2026-11-30") == ["2026-11-30"]
    assert days("the 3rd of March 2025, and Dec. 24th, 2024") == ["2025-03-03", "2024-12-24"]
    assert days("what did Priya say yesterday? and today?") == ["2026-12-04", "2026-12-05"]
    # Without a year: the last occurrence, and the next when it is near (a plan).
    assert days("May 5") == ["2026-05-05"]
    assert days("the offsite on January 22") == ["2026-01-22", "2027-01-22"]
    assert days("December 1", date(2027, 1, 5)) == ["2026-12-01"]
    # No whole day, no day: a month, a year, an impossible date, "may" the verb, a version.
    for q in ("in March 2025", "back in 2025", "on 2026-02-30", "you may 5 times",
              "release 2026-12-01-rc1", "20261201", "February 29"):
        assert days(q) == [], q
    assert days("Feb 29 2028") == ["2028-02-29"]
    assert len(days(" ".join(f"2026-01-{d:02d}" for d in range(1, 10)))) == MOST_DAYS
    bounds = day_bounds(named_days("on 2026-12-01", today))
    assert [f"{d:%Y-%m-%d %H:%M %Z}" for d in bounds["days"] + bounds["days_end"]] == \
        ["2026-12-01 00:00 UTC", "2026-12-02 00:00 UTC"]


def test_an_item_of_a_named_day_gains_the_day_boost() -> None:
    from orchestrator.recall.tail import Candidate, boost_named_days

    day = datetime(2023, 10, 13, tzinfo=UTC)

    def item(key: str, at: datetime | None, until: datetime | None = None) -> Candidate:
        return Candidate(key=key, kind="source", text=key, scopes=(), occurred_at=at,
                         ended_at=until, merit=0.5)

    items = [item("on", day + timedelta(hours=13)), item("naive", datetime(2023, 10, 13, 23, 59)),
             item("before", day - timedelta(seconds=1)), item("after", day + timedelta(days=1)),
             item("span", day - timedelta(days=2), day + timedelta(hours=1)),
             item("undated", None)]
    assert boost_named_days(items, [day], 1.0) == 3
    assert {c.key: c.merit for c in items} == {"on": 1.5, "naive": 1.5, "before": 0.5,
                                               "after": 0.5, "span": 1.5, "undated": 0.5}
    assert boost_named_days(items, [day], 0.0) == 0 and boost_named_days(items, [], 1.0) == 0


def test_what_a_named_day_does_counts_only_what_the_reader_may_see(
        tenant_factory, app_engine, embedder, settings, recaller):
    """Isolation of the day subjects and the day boost: documents of that day in a scope the
    reader lacks neither count toward the day's "too many to name" bound nor appear in the
    trace's count of boosted items."""
    t = tenant_factory("team", "exec")
    day = datetime(2026, 3, 4, tzinfo=UTC)
    write_documents(app_engine, t.identity(write=("team", "exec")), embedder, [
        doc("team/day.md", "Team day note", "The team shipped the harbour release.",
            occurred_at=day + timedelta(hours=9)),
        *(doc(f"exec/{i}.md", f"Board memo {i}", f"Board memo {i} on the harbour budget.",
              scopes=("exec",), occurred_at=day + timedelta(hours=10, minutes=i))
          for i in range(settings.recall_title_docs + 1)),
    ], settings)
    question = "what happened on 2026-03-04?"
    team_reader = t.identity("reader", read=("team",))
    _, trace = recaller.trace(team_reader, question)
    assert direct_titles(trace) == {"Team day note"}
    assert "1 item(s) from a day the question names" in trace.format()
    assert "Board memo" not in trace.format()
    # A reader of both scopes sees ten documents that day: too many to name any of them.
    _, both = recaller.trace(t.identity("reader", read=("team", "exec")), question)
    assert not direct_titles(both)
    assert "Board memo" in both.format()


def _changelog_body() -> str:
    parts = ["# Widget ChangeLog\n\nEvery release of Widget, newest first.\n\n"]
    for i in range(6, 0, -1):
        filler = " ".join(f"Release {i} also tidies module {k} of the parser and its tests."
                          for k in range(8))
        parts.append(f'<a id="1.{i}.0"></a>\n\n## 2023-07-{i:02d}, Version 1.{i}.0\n\n### Notable Changes\n\n'
                     f"{filler}\n\n{filler}\n\n{filler}\n\n")
        if i == 5:
            parts.append("The new frobnicator option rotates the spline caches on every request.\n\n")
        parts.append(f"### Commits\n\n* fix release {i}\n\n")
    return "".join(parts)


def test_an_excerpt_names_the_sections_it_stands_under(
        tenant_factory, app_engine, embedder, settings, recaller):
    # Over Node.js's changelogs an excerpt of a release's changes named only "Node.js 20
    # ChangeLog": which release it listed was in a heading one or two chunks up.
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [doc("CHANGELOG.md", "Widget ChangeLog", _changelog_body())],
                    settings)
    with bound_session(app_engine, ident) as s:
        chunks = s.execute(select(Chunk.text, Chunk.section).order_by(Chunk.ordinal)).all()
    assert len(chunks) >= 10
    for text, section in chunks:
        if text.startswith('<a id="1.') or text.startswith("# Widget"):
            assert section is None, text[:60]  # its own heading opens it; the title is said
        else:
            assert section[0]["level"] == 2 and section[0]["text"].startswith("2023-07-"), text[:60]
    found = next(text for text, _ in chunks if "frobnicator" in text)
    assert not found.startswith("<a id=")  # the trail is what names its release

    result = recaller.recall(ident, "which release added the frobnicator option?", budget_tokens=2000)
    first = result.evidence[0]
    assert "frobnicator" in first.text
    assert first.source is not None and first.source.section_titles == [
        "2023-07-05, Version 1.5.0", "Notable Changes"]
    assert ("| Widget ChangeLog › 2023-07-05, Version 1.5.0 › Notable Changes (notes/CHANGELOG.md)"
            in result.rendered)
    # The text trace names a chunk by its title and innermost section, its id kept.
    _, trace = recaller.trace(ident, "which release added the frobnicator option?",
                              budget_tokens=2000)
    traced = trace.format()
    assert f"Widget ChangeLog › Notable Changes #{first.chunk_id}: rank" in traced, traced
    # Its lexical terms are said to be stemmed ("releas", not a typo of "release").
    assert "lexical terms as stemmed, rarest first" in traced and " releas " in traced, traced
    # The chunk goes on with "Notable Changes" and ends with it: "### Commits" opens the next
    # chunk (stop 52; it ended before the next release and held the commits).
    assert "### Commits" not in first.text
    assert any(text.startswith("### Commits") for text, _ in chunks)
    # A part cut to fit starts later in its chunk: its trail follows the headings it skipped
    # (a chunk that opens with a heading still packs short sections, so one can hold another
    # heading; here the chunk's text with the next section after it, as such a chunk holds it).
    from orchestrator.recall.tail import part_of

    packed = replace(first, text=first.text + "\n\n### Commits\n\n* fix release 5\n")
    at = packed.text.index("### Commits") + len("### Commits\n\n")
    part = part_of(packed, at, text=packed.text[at:])
    assert part.source.section_titles == ["2023-07-05, Version 1.5.0", "Commits"]
    assert part_of(first, 0, text=first.text).source == first.source
    # The API serves the trail as it is stored: GraphQL and REST (one view), MCP.
    from orchestrator.api.bundles import evidence_view
    from orchestrator.api.mcp import _evidence

    assert evidence_view(first)["source"]["section"] == ["2023-07-05, Version 1.5.0", "Notable Changes"]
    assert _evidence(first)["section"] == ["2023-07-05, Version 1.5.0", "Notable Changes"]
    # A long heading is stored whole and printed cut.
    from orchestrator.recall.result import SourceRef

    long = SourceRef("notes", "a.md", "A", ((2, "x" * 100), (3, "Options")))
    assert long.section_line == "x" * 79 + "… › Options" and long.section_titles[0] == "x" * 100


def test_a_section_trail_reaches_only_the_readers_of_its_chunk(
        tenant_factory, app_engine, embedder, settings, recaller):
    # The trail is a column of the chunk's own row: a reader who cannot see the board's page
    # meets neither its headings in any item, nor its words through the lexical vector.
    t = tenant_factory("team", "board")
    carol = t.identity("carol", read=("team", "board"), write=("team", "board"))
    team = t.identity("alice", read=("team",))
    filler = " ".join(f"Frobnicator rollout step {k} is logged and reviewed." for k in range(40))
    write_documents(app_engine, carol, embedder, [
        doc("board.md", "Board minutes", f"# Board minutes\n\n## Acquisition of Zephyrcorp\n\n"
            f"{filler}\n\n{filler}\n", scopes=("board",)),
        doc("team.md", "Team notes", "# Team notes\n\n## Rollout\n\nThe frobnicator rollout "
            "starts on Monday.\n")], settings)
    question = "what do we know about Zephyrcorp and the frobnicator rollout?"
    seen, trace = recaller.trace(carol, question, budget_tokens=4000)
    assert any(e.source and "Acquisition of Zephyrcorp" in e.source.section_titles
               for e in seen.evidence)  # the board's reader meets it
    df = {term: n for term, n, _ in trace.corpus.get("terms", [])}
    assert df["zephyrcorp"] >= 2  # the heading's chunk and those under it, by their trail
    result, trace = recaller.trace(team, question, budget_tokens=4000)
    assert result.evidence and all(e.source.title == "Team notes"
                                   for e in result.evidence if e.source)
    served = [result.rendered, *(str(e.source) for e in result.evidence),
              *(it.label for pool in trace.pools.values() for it in pool),
              *(it.label for it in trace.ordered)]
    assert not any("Acquisition" in text for text in served)  # the question names Zephyrcorp
    df = {term: n for term, n, _ in trace.corpus.get("terms", [])}
    assert df.get("zephyrcorp", 0) == 0
