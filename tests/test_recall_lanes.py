"""Recall lanes, fusion, titles and catalogs against the real database and the packaged embedder.

Each lane test asserts something only that lane can produce, so removing the
lane from ``build_recall_statement`` makes the test fail.
"""

from __future__ import annotations

import pytest

from orchestrator.recall import PLAN_STUDY
from tests.support.recall import doc, embedder, recaller, write_documents
from tests.support.tiers import tier_facts

__all__ = ["embedder", "recaller"]

CORPUS = [
    doc("cats.md", "Household pets", "My cat Whiskers sleeps on the sofa all afternoon."),
    doc("trains.md", "Commute", "The 7:42 train to Utrecht was cancelled again because of "
        "signal failure near the junction."),
    doc("code.md", "Deploy notes", "The release key is ZORBLAX-4411; rotate it every quarter."),
    doc("garden.md", "Garden", "Tomatoes need staking in June and more water in July heat."),
]


@pytest.fixture
def team(tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team", "private")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, CORPUS, settings)
    return t, ident


def source_paths(result):
    return [e.source.path for e in result.evidence if e.source is not None]


def test_dense_lane_finds_meaning_without_shared_words(team, recaller):
    _, ident = team
    question = "Which feline animal naps on the couch?"
    result, trace = recaller.trace(ident, question)
    dense = {it.key for it in trace.pools["dense"]}
    lexical = {it.key for it in trace.pools["lexical"]}
    cat_key = next(it.key for it in trace.pools["dense"] if it.label.startswith("Household pets"))
    assert cat_key in dense and cat_key not in lexical
    assert source_paths(result)[0] == "cats.md"
    # Without the dense lane the same question cannot find it.
    study, _ = recaller.study(ident, question, PLAN_STUDY["bm25-only"])
    assert "cats.md" not in source_paths(study)


def test_lexical_lane_finds_exact_rare_token(team, recaller, app_engine):
    """On every tier the lexical lane ranks the rare token's chunk first; where the tier
    scores it (both, since 0070: tests/support/tiers.py) the trace shows a positive BM25."""
    _, ident = team
    result, trace = recaller.trace(ident, "what is ZORBLAX-4411 for")
    top = trace.pools["lexical"][0]
    assert top.label.startswith("Deploy notes")
    assert top.lanes["lexical_rank"] == 1
    if tier_facts(app_engine).lexical_scores:
        assert top.lanes["bm25"] > 0
    _, dense_only = recaller.study(ident, "what is ZORBLAX-4411 for", PLAN_STUDY["dense-only"])
    assert all("lexical_rank" not in it.lanes for it in dense_only.ordered)
    assert source_paths(result)[0] == "code.md"


def test_rrf_arithmetic_and_both_contributions(team, recaller, settings):
    _, ident = team
    _, trace = recaller.trace(ident, "the train to Utrecht was cancelled")
    k = settings.recall_rrf_k
    weight = {"dense_rank": settings.recall_dense_weight, "lexical_rank": settings.recall_lexical_weight}
    sources = [it for it in trace.fused if it.kind == "source"]
    assert sources
    both = 0
    for it in sources:
        expected = sum(weight[r] / (k + it.lanes[r]) for r in ("dense_rank", "lexical_rank")
                       if r in it.lanes)
        assert it.rrf == pytest.approx(expected, abs=1e-12)
        both += "dense_rank" in it.lanes and "lexical_rank" in it.lanes
    assert both >= 1, "a chunk found by both lanes must exist in this corpus"
    train = next(it for it in sources if it.label.startswith("Commute"))
    assert train.rrf == pytest.approx(sum(weight.values()) / (k + 1))


TASKS = [
    doc("inbox.md", "Inbox", "# Inbox\n\n- [ ] Renew the observability contract before Jan 15\n"
        "- [ ] Send the refund list to finance\n- idea: reuse the stream for reconciliation\n"),
    doc("review.md", "Design review", "## Action items\n- [x] Security sign-off for the "
        "replication user\n- [x] Staging deployment\n"),
    doc("meeting.md", "Staff meeting", "1. Billing migration: fourteen special cases.\n"
        "2. On-call: Sam is out until March.\n3. [aside] a bracket in prose [ ] here\n"),
]


def test_task_list_items_are_found_by_the_words_asked_for_them(
        tenant_factory, app_engine, admin_engine, embedder, settings, recaller):
    """Markdown task items (``- [ ] ...`` open, ``- [x] ...`` done) carry the words people ask
    for them with (migration 0086: ``sources.task_words`` in the chunk's lexical vector), so
    the lexical lane finds the open ones for "open tasks" and the done ones for "completed";
    brackets that are no task item ("[ ] here" inside a line) add nothing."""
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, TASKS, settings)
    _, trace = recaller.trace(ident, "what are my open tasks?")
    lexical = [it.label.split(" #")[0] for it in trace.pools["lexical"]]
    assert lexical[:1] == ["Inbox"], lexical
    assert "Staff meeting" not in lexical
    result, trace = recaller.trace(ident, "which tasks have I completed?")
    lexical = [it.label.split(" #")[0] for it in trace.pools["lexical"]]
    assert lexical[:1] == ["Design review"], lexical
    assert source_paths(result)[0] == "review.md"
    from sqlalchemy import text

    with admin_engine.connect() as conn:
        vectors = {p: set(v) for p, v in conn.execute(text(
            "select d.path, tsvector_to_array(c.lexical) from sources.chunks c "
            "join sources.documents d on d.tenant_id = c.tenant_id and d.id = c.document_id "
            "where c.tenant_id = :t"), {"t": t.id}).all()}
    assert {"open", "task", "todo", "to-do", "pend"} <= vectors["inbox.md"]
    assert {"done", "task", "complet", "finish"} <= vectors["review.md"]
    assert "open" not in vectors["review.md"] and "done" not in vectors["inbox.md"]
    assert not {"task", "todo", "open", "done"} & vectors["meeting.md"]


def test_the_task_words_rule_is_one_rule_in_sql_and_python(admin_engine) -> None:
    """``features.task_words`` (the learned ranker's term features) says for each text what
    ``sources.task_words`` puts into its chunk's lexical vector."""
    from sqlalchemy import text

    from orchestrator.recall.features import task_words

    texts = ["- [ ] a", "* [x] b", "+ [X] c\n  - [ ] d", "1. [ ] e", "2) [x] f", "  - [ ] indented",
             "prose [ ] and [x] in a line", "-[ ] no space", "- [] empty", "- [y] other",
             "# Heading\n\ntext\n- [ ] late item", ""]
    with admin_engine.connect() as conn:
        for t in texts:
            sql, python = conn.execute(text(
                "select coalesce(tsvector_to_array(sources.task_words(:t)), '{}'), "
                "coalesce(tsvector_to_array(to_tsvector('english', :w)), '{}')"),
                {"t": t, "w": " ".join(task_words(t))}).one()
            assert sorted(sql) == sorted(python), t
    assert task_words("- [ ] a") and not task_words("prose [ ] here")
