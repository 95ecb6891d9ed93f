"""Recall's fixed-cost mechanisms: reused plans under RLS, the query embedding cache, receipts
sealed in the recall and chained in batches (crash included).

Each test builds its own tenants, so nothing it asserts can come from another test's rows.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from orchestrator.audit import chain
from orchestrator.audit.receipts import append_served, chain_receipts, verify_receipt
from orchestrator.db.engine import make_app_engine
from orchestrator.db.session import bound_session
from orchestrator.recall import FULL_PLAN
from orchestrator.recall.plans import size_class, tenant_size
from orchestrator.recall.query_cache import QueryEmbeddingCache
from orchestrator.recall.service import vector_text
from tests.support.provenance import auditor_engine
from tests.support.recall import doc, embedder, recaller_with, write_documents
from tests.support.sealed_run import kill_after_seal

__all__ = ["auditor_engine", "embedder"]


def _corpus(tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any, name: str) -> Any:
    t = tenant_factory("team", "exec", org_prefix=name)
    docs = [doc(f"{name}-{n}.md", f"{name.title()} note {n}",
                f"The {name} team wrote note {n} about the river bridge, the budget and the "
                f"harbour lights. Item {n} of {name}.") for n in range(6)]
    docs.append(doc(f"{name}-plan.md", f"{name.title()} secret plan",
                    f"Only exec may read the {name} river bridge plan and its budget.",
                    scopes=("exec",)))
    write_documents(app_engine, t.identity("writer", write=("team", "exec")), embedder, docs,
                    settings)
    return t


def _rows(rows: Any) -> list[tuple[str, str, float]]:
    return sorted((str(r.lane), str(r.item_id), round(float(r.rrf or 0.0), 9)) for r in rows)


def test_a_reused_plan_returns_the_fresh_plans_rows_for_two_tenants_and_two_scope_sets(
        tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any, test_db: Any) -> None:
    a = _corpus(tenant_factory, app_engine, embedder, settings, "alpha")
    b = _corpus(tenant_factory, app_engine, embedder, settings, "beta")
    # One connection, so the recall statement is prepared there and its generic plan reused
    # across both tenants and both scope sets.
    engine = make_app_engine(test_db.database.app_url(), pool_size=1)
    try:
        # No receipts and no usage rows: the background writer would take the one connection
        # now and then, and the recalls would be prepared on a second.
        recaller = recaller_with(engine, settings, embedder, recall_receipts=False,
                                 rank_usage_rows=False)
        readers = [t.identity("reader", read=scopes) for t in (a, b)
                   for scopes in (("team",), ("team", "exec"))]
        question = "what about the river bridge budget?"
        vector = embedder.embed_query(question)
        params = {"question": question, "query_embedding": vector, "mode": None, "session": None,
                  "days": None, "days_end": None}

        def klass(reader: Any) -> int:
            with bound_session(engine, reader) as s:
                return size_class(tenant_size(s).chunks)

        reused: dict[int, list[tuple[str, str, float]]] = {}
        for _ in range(3):  # psycopg prepares a statement the fifth time a connection sends it
            for n, reader in enumerate(readers):
                assert "reused plan" in recaller.trace(reader, question)[1].format()
                stmt = recaller.statement(FULL_PLAN, klass(reader))
                with bound_session(engine, reader,
                                   settings={"plan_cache_mode": "force_generic_plan"}) as s:
                    reused[n] = _rows(s.execute(stmt, params).all())
        with engine.connect() as conn:
            plans = conn.execute(text(
                "select generic_plans, custom_plans from pg_prepared_statements "
                "where statement like '%engram recall full%'")).all()
        assert plans and sum(p.generic_plans for p in plans) >= 4, plans
        for n, reader in enumerate(readers):
            stmt = recaller.statement(FULL_PLAN, klass(reader))
            with bound_session(engine, reader, settings={"plan_cache_mode": "force_custom_plan"}) as s:
                fresh = _rows(s.execute(stmt, params).all())
            assert reused[n] == fresh, reader
        # The plan is shared; the rows are not: each tenant and scope set sees its own.
        ids = [{i for _, i, _ in reused[n] if i != "None"} for n in range(4)]
        assert ids[0] < ids[1] and ids[2] < ids[3]
        assert not (ids[1] & ids[3])
    finally:
        engine.dispose()


def test_a_long_question_is_split_once_not_once_per_n_gram(
        tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any) -> None:
    """The title and entity-seed lanes read the question's n-grams from its words. Inlined,
    the words CTE split (and keyed) the whole question again for every n-gram: a question of
    2,000 words (the 4,000-character limit) took 57 s in the statement. Both CTEs are
    materialized, and a title named at the end of such a question is still found."""
    t = _corpus(tenant_factory, app_engine, embedder, settings, "gamma")
    reader = t.identity("reader", read=("team",))
    recaller = recaller_with(app_engine, settings, embedder)
    question = ("so " * 1300)[:3960] + "gamma note 3?"
    vector = embedder.embed_query(question)
    with bound_session(app_engine, reader) as s:
        plan = "\n".join(r[0] for r in s.connection().exec_driver_sql(
            "explain (costs off) " + recaller.sql(FULL_PLAN, 1),
            {"question": question, "query_embedding": vector_text(vector), "mode": None,
             "session": None, "days": None, "days_end": None}).all())
    assert "CTE question_words" in plan and "CTE seed_words" in plan
    result, trace = recaller.trace(reader, question)
    assert trace.pools["title"] and result.evidence[0].source is not None
    assert result.evidence[0].source.path == "gamma-3.md"


def test_a_recall_past_its_time_limit_is_stopped_and_answered_timeout(
        tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any,
        admin_engine: Engine) -> None:
    """recall_statement_timeout_ms bounds every statement of the recall's transaction: past it
    the statement is stopped, the answer is TIMEOUT (the database's wording names no SQL), the
    receipt is not written, and the next recall under the default limit is served."""
    from orchestrator.errors import TimedOut
    from orchestrator.recall.plans import transaction_settings

    assert transaction_settings(10, settings)["statement_timeout"] == "30000"
    assert "statement_timeout" not in transaction_settings(
        10, settings.model_copy(update={"recall_statement_timeout_ms": 0}))
    t = _corpus(tenant_factory, app_engine, embedder, settings, "delta")
    reader = t.identity("reader", read=("team",))

    def receipts() -> int:
        with admin_engine.connect() as conn:
            return int(conn.execute(text("select count(*) from provenance.receipts "
                                         "where tenant_id = :t"), {"t": t.id}).scalar_one())

    before = receipts()
    hasty = recaller_with(app_engine, settings, embedder, recall_statement_timeout_ms=1)
    hasty.sizes.put(t.org_id, 7)  # the tenant's size known: the limit holds from the statement on
    with pytest.raises(TimedOut) as refused:
        hasty.recall(reader, "what about the river bridge budget?")
    assert refused.value.code == "TIMEOUT" and "time limit" in refused.value.message
    from orchestrator.errors import STATUS_BY_CODE

    assert STATUS_BY_CODE[refused.value.code] == 504  # REST's status (GraphQL: the code)
    assert receipts() == before
    served = recaller_with(app_engine, settings, embedder).recall(reader, "the river bridge")
    assert served.evidence and receipts() == before + 1


def test_every_size_class_text_is_the_one_compiled_statement_behind_its_comment(
        app_engine: Engine, settings: Any, embedder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling the statement takes about 100 ms: once per shape, never once per size class
    (a tenant of a class not seen before paid it in its first recall, after the warm-up)."""
    from orchestrator.recall import service
    from orchestrator.recall.statement import size_class_comment

    recaller = recaller_with(app_engine, settings, embedder)
    compiled: list[Any] = []
    real = service.runtime_sql
    monkeypatch.setattr(service, "runtime_sql", lambda stmt: compiled.append(stmt) or real(stmt))
    base = recaller.sql(FULL_PLAN, None)
    texts = {recaller.sql(FULL_PLAN, k) for k in range(7)}
    assert len(compiled) == 1 and len(texts) == 7
    assert all(t == f"{size_class_comment(FULL_PLAN, k)} {base}"
               for k, t in enumerate(recaller.sql(FULL_PLAN, k) for k in range(7)))


def test_the_warm_up_plans_the_small_classes_on_every_pooled_connection(
        tenant_factory: Any, test_db: Any, app_engine: Engine, embedder: Any,
        settings: Any) -> None:
    """The warm-up leaves the generic plan of each size class below
    ``recall_warm_plan_classes`` on every pooled connection, made for a tenant id no tenant
    has (a small tenant's estimates; never for no tenant, whose plan expects one row
    everywhere), so a small tenant's first recall plans nothing and serves what a recall
    planned for itself serves. With the setting at 0 it leaves no plan."""
    from orchestrator.recall import Recaller

    t = _corpus(tenant_factory, app_engine, embedder, settings, "lambda")
    reader = t.identity("reader", read=("team",))
    question = "what about the lambda budget?"
    # No receipt: no background thread may take a connection between a recall and the look
    # at its prepared statements.
    quiet = settings.model_copy(update={"recall_receipts": False, "rank_usage_rows": False})

    def plans(engine: Engine) -> list[dict[str, tuple[int, int]]]:
        """Each pooled connection's prepared recall statements (all checked out at once)."""
        conns = [engine.connect() for _ in range(2)]
        try:
            found = []
            for conn in conns:
                rows = conn.execute(text(
                    "select substring(statement from 'tenant size class [0-9]') as klass, "
                    "generic_plans, custom_plans from pg_prepared_statements "
                    "where statement like '/* engram recall full,%'")).all()
                conn.commit()  # a ROLLBACK would make psycopg drop them all
                found.append({r.klass: (r.generic_plans, r.custom_plans) for r in rows})
            return found
        finally:
            for conn in conns:
                conn.close()

    cold = make_app_engine(test_db.database.app_url(), pool_size=1)
    try:
        planned_here = Recaller(cold, quiet, embedder=embedder).recall(reader, question)
    finally:
        cold.dispose()

    none = make_app_engine(test_db.database.app_url(), pool_size=2)
    try:
        recaller = Recaller(none, quiet.model_copy(update={"recall_warm_plan_classes": 0}),
                            embedder=embedder)
        assert {"models", "statement", "reads", "tail", "ranker"} <= set(recaller.warm_up())
        assert plans(none) == [{}, {}]
    finally:
        none.dispose()

    engine = make_app_engine(test_db.database.app_url(), pool_size=2)
    try:
        recaller = Recaller(engine, quiet, embedder=embedder)
        assert recaller.warm_up() and recaller.warmed
        # The reads a tenant's first recall makes ran for no tenant: nothing is kept for one.
        assert recaller.sizes.get(t.org_id) is None and recaller.models._cache == {}
        warm = {"tenant size class 0": (1, 0), "tenant size class 1": (1, 0)}
        assert plans(engine) == [warm, warm]
        # The throwaway tenant id was the warm-up transaction's alone: a connection it
        # warmed carries no binding into the next checkout.
        with engine.connect() as conn:
            assert conn.execute(text("select current_setting('engram.tenant_id', true), "
                                     "auth.read_scopes()")).one() in (("", []), (None, []))
            conn.commit()
        served, trace = recaller.trace(reader, question)
        assert "tenant size class 0" in trace.plan_note
        # The first recall reused the warmed plan of its class on the connection it got.
        after = plans(engine)
        assert sorted(after, key=str) == sorted([warm, {**warm, "tenant size class 0": (2, 0)}],
                                                key=str), after
        assert [e.text for e in served.evidence] == [e.text for e in planned_here.evidence]
        assert served.evidence and "lambda" in served.rendered
    finally:
        engine.dispose()


class _CountingEmbedder:
    """The packaged model behind a counter of the questions it was asked to embed."""

    def __init__(self, inner: Any, model_name: str) -> None:
        self.inner = inner
        self.model_name = model_name
        self.asked: Counter[str] = Counter()

    def embed_query(self, question: str, asker: str | None = None) -> Any:
        self.asked[question] += 1
        return self.inner.embed_query(question, asker)


def test_the_query_cache_never_crosses_tenants_or_models(tenant_factory: Any, app_engine: Engine,
                                                         embedder: Any, settings: Any) -> None:
    a = _corpus(tenant_factory, app_engine, embedder, settings, "gamma")
    b = _corpus(tenant_factory, app_engine, embedder, settings, "delta")
    counting = _CountingEmbedder(embedder, embedder.model_name)
    recaller = recaller_with(app_engine, settings, counting, recall_receipts=False)
    question = "what about the harbour lights?"
    alice, bob = a.identity("alice", read=("team",)), b.identity("bob", read=("team",))
    first, t1 = recaller.trace(alice, question)
    again, t2 = recaller.trace(alice, question)
    assert (t1.embedding_cached, t2.embedding_cached) == (False, True)
    assert counting.asked[question] == 1
    assert [e.chunk_id for e in again.evidence] == [e.chunk_id for e in first.evidence]
    # Another user of the same tenant shares the entry; another tenant never does.
    assert recaller.trace(a.identity("carol", read=("team",)), question)[1].embedding_cached
    _, t3 = recaller.trace(bob, question)
    assert not t3.embedding_cached and counting.asked[question] == 2
    # Another asker is another query text.
    assert not recaller.trace(alice, question, asker="alice")[1].embedding_cached
    # Another activation of a model (engram models activate) or another version of its weights
    # embeds again: no vector of the old one answers the new one.
    import dataclasses

    active = recaller.active_model
    assert not recaller.query_vector(alice, question, None,
                                     dataclasses.replace(active, generation=active.generation + 1))[1]
    assert counting.asked[question] == 4
    assert recaller.query_vector(alice, question, None, active)[1]
    counting.model_version = "2"  # type: ignore[attr-defined]
    assert not recaller.trace(alice, question)[1].embedding_cached


def test_the_query_cache_is_bounded_and_read_only() -> None:
    cache = QueryEmbeddingCache(2)
    model = ("m", "1")
    calls = []

    def embed(n: int) -> Any:
        calls.append(n)
        return np.full(3, float(n), dtype=np.float32)

    for n in (1, 2, 1, 3):  # 1 is used again before 3 arrives: 2 is the least recent
        cache.get_or_embed("t", model, f"q{n}", None, lambda n=n: embed(n))
    assert len(cache) == 2 and calls == [1, 2, 3]
    vector, hit = cache.get_or_embed("t", model, "q1", None, lambda: embed(9))
    assert hit and float(vector[0]) == 1.0
    assert not cache.get_or_embed("t", model, "q2", None, lambda: embed(2))[1]
    with pytest.raises(ValueError):
        vector[0] = 5.0
    off = QueryEmbeddingCache(0)
    assert not off.get_or_embed("t", model, "q", None, lambda: embed(4))[1]
    assert not off.get_or_embed("t", model, "q", None, lambda: embed(4))[1] and len(off) == 0


def _pending(auditor: Engine, tenant: uuid.UUID) -> list[str]:
    with auditor.connect() as conn:
        return [r.problem for r in chain.verify(conn, tenant)[0].row_problems]


def test_a_receipt_is_sealed_in_the_recall_and_chained_in_a_batch(
        tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any, test_db: Any,
        auditor_engine: Engine) -> None:
    t = _corpus(tenant_factory, app_engine, embedder, settings, "epsilon")
    # An engine of its own: its background thread waits an hour unless asked to settle.
    engine = make_app_engine(test_db.database.app_url(), pool_size=1)
    recaller = recaller_with(engine, settings, embedder, recall_chain_delay_s=3600.0,
                             recall_chain_interval_s=3600.0)
    result, trace = recaller.trace(t.identity("reader", read=("team",)), "the river bridge?")
    assert trace.receipt_id is not None
    with auditor_engine.connect() as conn:
        waiting = verify_receipt(conn, trace.receipt_id, rendered=result.rendered)
    assert waiting.queued and waiting.seal_ok and not waiting.proven
    assert any("waits in the queue" in p for p in waiting.problems())
    # A queued receipt is not a row without a chain event: the chain verifies meanwhile.
    assert _pending(auditor_engine, t.id) == []
    # Chained by this settle, unless another background chainer of this test process (each
    # flushes every tenant's queue every few seconds) took it in the moments since the recall:
    # settle then finds nothing, and either way the receipt ends chained exactly once.
    recaller.settle()
    with auditor_engine.connect() as conn:
        done = verify_receipt(conn, trace.receipt_id, rendered=result.rendered)
        events = conn.execute(text(
            "select count(*) from provenance.events where tenant_id = :t "
            "and table_name = 'provenance.receipts' and row_id = jsonb_build_object('id', cast(:r as text))"),
            {"t": t.id, "r": str(trace.receipt_id)}).scalar_one()
    assert done.ok and not done.queued and events == 1, done.problems()
    engine.dispose()


def test_receipts_survive_a_sigkill_between_seal_and_chain(
        tenant_factory: Any, app_engine: Engine, embedder: Any, settings: Any, test_db: Any,
        auditor_engine: Engine) -> None:
    t = _corpus(tenant_factory, app_engine, embedder, settings, "zeta")
    child = kill_after_seal(test_db.database.app_url(),
                            {"org": t.org_id, "user": "reader", "read": ["team"]},
                            "what about the harbour lights?")
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    receipt = uuid.UUID(json.loads(child.stdout.strip().splitlines()[-1])["receipt"])
    with auditor_engine.connect() as conn:
        left = verify_receipt(conn, receipt)
    # Sealed and still queued, unless a background chainer of this test process (each polls
    # every tenant's queue) appended it first: either way nothing the dead process sealed is lost.
    assert left.seal_ok and left.queued != left.proven, left
    assert _pending(auditor_engine, t.id) == []
    # Whichever process runs next chains what the dead one left: here the worker role (or
    # this process's own background thread, if it came first: it chains every tenant's queue).
    worker = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=1)
    try:
        with worker.begin() as conn:
            chain_receipts(conn)
    finally:
        worker.dispose()
    with auditor_engine.connect() as conn:
        after = verify_receipt(conn, receipt)
        report = chain.verify(conn, t.id)[0]
    assert after.proven and not after.queued, after.problems()
    assert report.ok, report


def test_concurrent_chainers_chain_each_receipt_once(tenant_factory: Any, app_engine: Engine,
                                                      embedder: Any, settings: Any,
                                                      auditor_engine: Engine) -> None:
    t = _corpus(tenant_factory, app_engine, embedder, settings, "eta")
    reader = t.identity("reader", read=("team",))
    with bound_session(app_engine, reader) as s:
        docs = list(s.execute(text("select id from sources.documents")).scalars())
    receipts = []
    for n in range(12):
        with bound_session(app_engine, reader) as s:
            receipts.append(append_served(s, f"question {n}",
                                          [("sources.documents", docs[n % len(docs)])], "r"))
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            while True:
                with app_engine.begin() as conn:
                    if chain_receipts(conn, 3) == 0:
                        return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    with auditor_engine.connect() as conn:
        counts = dict(conn.execute(text(
            "select row_id ->> 'id', count(*) from provenance.events where tenant_id = :t "
            "and table_name = 'provenance.receipts' group by 1"), {"t": t.id}).all())
        report = chain.verify(conn, t.id)[0]
    assert {uuid.UUID(k) for k in counts} == set(receipts) and set(counts.values()) == {1}
    assert report.ok, report


def test_the_budget_cut_is_the_longest_fitting_prefix_whatever_its_first_guess() -> None:
    """budget_cut starts from a guess made from text lengths; the cut is still exact."""
    import random

    from orchestrator.recall.render import render, render_prefixes
    from orchestrator.recall.tail import Candidate, budget_cut, token_cost

    rng = random.Random(3)
    for _ in range(200):
        cands = [Candidate(key=f"k{i}", kind="source", text="word " * rng.randint(1, 300), scopes=())
                 for i in range(rng.randint(0, 20))]
        budget = rng.randint(1, 2500)
        kept, text, cost = budget_cut([c.evidence() for c in cands], budget, 4.0,
                                      lambda ev: render_prefixes("q?", ev))
        evidence = [c.evidence() for c in cands]
        best = max(k for k in range(len(cands) + 1)
                   if token_cost(render("q?", evidence[:k]), 4.0) <= budget)
        assert kept == best
        assert text == render("q?", evidence[:kept]) and cost == token_cost(text, 4.0) <= budget


def test_the_part_cut_to_fit_never_exceeds_the_budget_and_is_the_chunks_own_text() -> None:
    """``excerpt.fit_next`` over random orders and budgets: the rendering with the part is
    the template's, within the budget, and the part is a slice of its item at the offsets
    it names."""
    import random

    from orchestrator.recall.excerpt import MIN_ROOM_TOKENS, best_run, fit_next, parts
    from orchestrator.recall.render import render, render_prefixes
    from orchestrator.recall.result import Evidence, Provenance, SourceRef
    from orchestrator.recall.tail import budget_cut, token_cost

    rng = random.Random(5)
    words = ["venue", "Lisbon", "budget", "hiring", "plan", "the", "river", "quote", "x" * 30]
    fitted = fenced = 0
    for _ in range(300):
        evidence = []
        for i in range(rng.randint(1, 6)):
            text = " ".join(
                " ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) + rng.choice(".!?\n")
                + ("\n```\nselect venue;\nfrom plan.\n```\n" if rng.random() < 0.2 else "")
                for _ in range(rng.randint(1, 12))).strip()
            at = rng.randint(0, 500)
            evidence.append(Evidence(text=text, provenance=Provenance.SOURCE_EXCERPT, scopes=(),
                                     source=SourceRef("notes", f"n{i}.md", f"Note {i}"),
                                     char_start=at, char_end=at + len(text)))
        budget = rng.randint(1, 600)
        prefixes = render_prefixes("venue?", evidence)
        kept, text, cost = budget_cut(evidence, budget, 4.0, lambda _, p=prefixes: p)
        got = fit_next("venue?", evidence, kept, budget, 4.0, cost, prefixes)
        if got is None:
            continue
        fitted += 1
        part, rendered, used = got
        assert budget - cost >= MIN_ROOM_TOKENS and part.clipped
        assert rendered == render("venue?", [*evidence[:kept], part])
        assert used == token_cost(rendered, 4.0) <= budget
        whole = evidence[kept]
        offset = part.char_start - whole.char_start
        assert part.text and whole.text[offset:offset + len(part.text)] == part.text
        assert part.char_end - part.char_start == len(part.text)
        assert part.text.count("```") % 2 == 0, part.text  # no fence opened and left open
        fenced += "```" in part.text
    assert fitted > 50 and fenced > 0, (fitted, fenced)
    text = "# Title\n\n- one. Two! three?\n\nfour"
    assert [text[a:b] for a, b in parts(text)] == ["# Title", "- one.", "Two!", "three?", "four"]
    text = "Run it.\n\n```sql\n-- the diff. Nightly.\nselect 1;\n```\nThen.\n~~~\nopen\nto the end"
    assert [text[a:b] for a, b in parts(text)] == [
        "Run it.", "```sql\n-- the diff. Nightly.\nselect 1;\n```", "Then.", "~~~\nopen\nto the end"]
    # An ordered list's marker stays with its item, so a numbered task item keeps the
    # checkbox its task words come from (``features.task_words``); a sentence ending in a
    # number inside a line still ends there.
    text = "Inbox\n1. [ ] Renew the lease. Call Sam.\n  12. [x] Pay rent\n\nVersion 2. Then."
    assert [text[a:b] for a, b in parts(text)] == [
        "Inbox", "1. [ ] Renew the lease.", "Call Sam.", "12. [x] Pay rent", "Version 2.", "Then."]
    # A paragraph's wrapped lines are one run of sentences: a part opens at a sentence's
    # start, never at a line the writer's editor wrapped ("current version of a row the asker
    # can see, seals ...", stop 50); a list item's continuation line is the item's.
    text = ("A receipt stores who asked and the evidence; the database refuses evidence that\n"
            "is not the current version of a row the asker can see. It seals the receipt\n"
            "and chains it.\n- one item that runs on\n  over two lines\n\nOptions:\nfast")
    assert [text[a:b] for a, b in parts(text)] == [
        "A receipt stores who asked and the evidence; the database refuses evidence that\n"
        "is not the current version of a row the asker can see.",
        "It seals the receipt\nand chains it.", "- one item that runs on\n  over two lines",
        "Options:", "fast"]
    # A wrapped line may open with "-1" or "#42": no list item, no heading without its space.
    wrapped = "The sensor read\n-1 degrees at noon, as issue\n#42 says. Then it warmed."
    assert [wrapped[a:b] for a, b in parts(wrapped)] == [
        "The sensor read\n-1 degrees at noon, as issue\n#42 says.", "Then it warmed."]
    a, b = best_run(text, "which version of a row may the asker see?", 160)
    assert text[a:b].startswith("A receipt stores"), text[a:b]
    # Nor on a plain text's title line over a blank line (or at the text's end): it heads
    # what the cut leaves out ("O modelo de memória", stop 50).
    text = ("The fusion merges the lanes by rank. The graph rerank promotes connected notes.\n\n"
            "O modelo de memória\n\nMemory holds documents, facts and episodes of the team.")
    a, b = best_run(text, "how does the fusion merge the lanes?", 130)
    assert text[a:b].endswith("connected notes."), text[a:b]
    a, b = best_run("Notes on the fusion of lanes.\nRelease checklist", "fusion lanes", 200)
    assert (a, b) == (0, len("Notes on the fusion of lanes.")), (a, b)
    text = "Inbox of the week here.\n1. [ ] Renew the lease.\n2. [x] Pay rent"
    a, b = best_run(text, "what are my open tasks?", 25)
    assert text[a:b] == "1. [ ] Renew the lease."
    # A run never ends on a heading (what it heads is cut off), and on a tie it opens on
    # what was asked for rather than before it.
    text = ("## Decisions\n- Use Debezium with the plugin.\n- Alert at 10 GB.\n\n"
            "## Action items\n- [ ] Priya: staging by week 45\n- [x] Tomas: security sign-off")
    a, b = best_run(text, "which action items are done?", 50)
    assert text[a:b] == "## Action items\n- [ ] Priya: staging by week 45"
    # The run with the most question terms; the title's own words count only alone.
    text = "Offsite planning began. Berlin was cold. The venue is in Lisbon."
    a, b = best_run(text, "where is the offsite venue?", 30, shown="Offsite")
    assert text[a:b] == "The venue is in Lisbon."
    a, b = best_run(text, "offsite?", 30, shown="Offsite")
    assert text[a:b] == "Offsite planning began."
    # On a tie a run opens on prose rather than on a code block that only names the term.
    text = "```bash\nnpm\n```\n\n### Description\n\nnpm is the package manager for Node."
    a, b = best_run(text, "what is npm?", 60, shown="npm")
    assert text[a:b] == "npm is the package manager for Node."
    # A block indented under a list item is code too.
    listed = "- Synopsis:\n\n  ```bash\n  npm\n  ```\n\n  npm is the package manager for Node."
    a, b = best_run(listed, "what is npm?", 60, shown="npm")
    assert listed[a:b] == "npm is the package manager for Node."
    a, b = best_run(text, "what does npm --version print in bash?", 60, shown="npm")
    assert text[a:b] == "```bash\nnpm\n```"  # more of the question: the block


def test_every_prefix_renders_as_the_template_renders_it() -> None:
    """``render_prefixes`` (each item rendered once) gives, for every k, exactly what the
    template renders for the first k items, over every kind of item the macro formats."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from orchestrator.recall.render import render, render_prefixes
    from orchestrator.recall.result import Evidence, FactRef, Provenance, ScopeRef, SourceRef

    day = datetime(2026, 3, 14, 9, 30, tzinfo=UTC)
    team = (ScopeRef("team", "Everyone"), ScopeRef("exec", ""))
    fact = FactRef("Ada", "works_at", "Lindqvist Labs", "world_fact", "world", "extractor",
                   fact_key="employer", as_of=day)
    belief = FactRef("Bob", "prefers", None, "belief", "user:bob", "user")
    evidence = [
        Evidence("The roof costs 4,200 euros.\n\nSecond paragraph.", Provenance.SOURCE_EXCERPT,
                 team, SourceRef("notes", "roof.md", "Roof"), updated_at=day, author="alice"),
        Evidence("Ada works at Lindqvist Labs.", Provenance.DERIVED_MEMORY, team[:1],
                 kind="keyed fact", fact=fact, author="service:derive"),
        Evidence("Bob prefers tea.", Provenance.DERIVED_MEMORY, (), kind="fact", fact=belief,
                 author="bob", occurred_at=day, ended_at=day),
        Evidence("Sprint review, {{ not a template }} {% neither %}",
                 Provenance.RECENT_SESSION_MEMORY, team, kind="episode", occurred_at=day),
        Evidence("", Provenance.SOURCE_EXCERPT, (), kind="catalog"),
    ]
    question = "what about [the roof] and {{ Ada }}?"
    prefix = render_prefixes(question, evidence)
    for k in (3, 0, 5, 1, 4, 2):  # any order: entries are rendered once, as they are needed
        assert prefix(k) == render(question, evidence[:k]), k
    assert prefix(0) == "" and prefix(5).startswith(f"Relevant memory for: {question}\n")
    # Any prefix followed by another item (the part the cut's last item is cut to), a
    # clipped one included.
    part = replace(evidence[0], text="The roof costs 4,200 euros.", clipped=True)
    for k in (0, 2, 5):
        assert prefix.then(k, part) == render(question, [*evidence[:k], part]), k
    assert "| part, cut to fit the budget" in prefix.then(0, part)


def test_a_failing_task_never_holds_the_chain_back(tenant_factory: Any, app_engine: Engine,
                                                   embedder: Any, settings: Any,
                                                   auditor_engine: Engine) -> None:
    """The access counts run before each chaining; one that fails is counted and logged, and
    the queued receipts are chained anyway."""
    from orchestrator.audit.chainer import ReceiptChainer

    t = _corpus(tenant_factory, app_engine, embedder, settings, "theta")
    reader = t.identity("reader", read=("team",))
    with bound_session(app_engine, reader) as s:
        doc_id = s.execute(text("select id from sources.documents limit 1")).scalar_one()
        receipt = append_served(s, "a question", [("sources.documents", doc_id)], "r")

    def broken() -> None:
        raise RuntimeError("a poisoned access count")

    chainer = ReceiptChainer(app_engine)
    chainer.tasks.append(broken)
    chainer.flush()
    assert chainer.failures == 1
    with auditor_engine.connect() as conn:
        assert verify_receipt(conn, receipt).proven


def test_an_unreachable_database_backs_off_and_logs_once(test_db: Any,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A chainer whose database is gone waits longer after each failed round and logs the
    outage once (with its cause), not a traceback every round."""
    import logging
    import time

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from orchestrator.audit.chainer import ReceiptChainer

    url = make_url(test_db.admin_url).set(database=f"engram_gone_{uuid.uuid4().hex[:8]}")
    gone = create_engine(url)
    chainer = ReceiptChainer(gone, delay_s=0.0, interval_s=0.02, max_backoff_s=0.16)
    caplog.set_level(logging.DEBUG, logger="engram.audit.chainer")
    try:
        chainer.start()
        deadline = time.monotonic() + 30
        while chainer.failing < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chainer.failing >= 4
        assert chainer.wait_s() == 0.16, "doubled per failed round, capped"
    finally:
        chainer.close()
        gone.dispose()
    warnings = [r for r in caplog.records
                if r.name == "engram.audit.chainer" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "does not exist" in warnings[0].getMessage()
    assert not chainer._thread or not chainer._thread.is_alive()


def test_disposing_an_engine_stops_its_recall_background(test_db: Any, settings: Any) -> None:
    """A test or a server that disposes its engine (before its database goes away) also stops
    the recall chainer of that engine, which would otherwise poll a database that is gone."""
    from orchestrator.recall.service import _BACKGROUND, _background

    engine = make_app_engine(test_db.database.app_url())
    chainer = _background(engine, settings).chainer
    chainer.start()
    assert chainer._thread is not None and chainer._thread.is_alive()
    engine.dispose()
    assert engine not in _BACKGROUND
    assert not chainer._thread.is_alive()
    again = _background(engine, settings).chainer
    assert again is not chainer, "a later recall over the engine starts a new one"
    engine.dispose()


def test_the_background_writes_through_a_pool_of_its_own(test_db: Any, tenant_factory: Any,
                                                          app_engine: Engine, embedder: Any,
                                                          settings: Any) -> None:
    """Usage rows, access counts and receipt chaining never take a connection from the
    recalls' pool: the background returned one moments after each recall returned its own,
    LIFO handed it to the next recall, and at light load every other recall planned its
    statement again (45-70 ms against 11-17, benchmarks/api_load.py's first recalls)."""
    from sqlalchemy import event

    from orchestrator.recall import Recaller

    t = _corpus(tenant_factory, app_engine, embedder, settings, "lambda")
    reader = t.identity("reader", read=("team",))
    engine = make_app_engine(test_db.database.app_url(), pool_size=2)
    checkouts: list[int] = []
    event.listen(engine, "checkout", lambda conn, *_: checkouts.append(id(conn)))
    try:
        recaller = Recaller(engine, settings, embedder=embedder)
        served = []
        for question in ("lambda river bridge", "lambda harbour lights", "lambda budget",
                         "lambda note 3"):
            before = len(checkouts)
            _, trace = recaller.trace(reader, question)
            assert trace.receipt_id is not None and trace.usage_rows
            served.append(checkouts[before:])
            recaller.chainer.wake()  # the background writes now, between recalls
            recaller.chainer.flush()
        # The first recall also reads the installation's index tier and active model once.
        # Every later one takes one connection, the one returned last: the same each time.
        assert all(len(taken) == 1 for taken in served[1:]), served
        assert len({taken[0] for taken in served[1:]}) == 1, served
        recalls = len(checkouts)
        recaller.settle()
        assert len(checkouts) == recalls, "the background took a connection of the recalls"
        with bound_session(app_engine, reader) as s:
            assert s.execute(text("select count(*) from memory.rank_events")).scalar_one() >= 3
    finally:
        engine.dispose()


def test_a_recaller_follows_its_engines_background_across_a_dispose(test_db: Any,
                                                                     settings: Any) -> None:
    """The recaller looks its background up on each use: after its engine is disposed (which
    stops the old thread) it wakes the new one, not the stopped one."""
    from orchestrator.recall import Recaller

    engine = make_app_engine(test_db.database.app_url())
    recaller = Recaller(engine, settings)
    first = recaller.chainer
    engine.dispose()
    assert recaller.chainer is not first and recaller.chainer is recaller.chainer
    engine.dispose()


def test_a_recaller_without_a_database_replays_traces(tenant_factory: Any, app_engine: Engine,
                                                      embedder: Any, settings: Any) -> None:
    """An evaluation replays kept candidates with a fixed model per fold through recallers
    that have no engine (benchmarks/recall_quality.py --cv): with the model the recall used,
    the replay gives the recall's own result; what needs the database says there is none."""
    from orchestrator.errors import BadInput
    from orchestrator.recall import Recaller
    from orchestrator.recall.plan import PLAN_STUDY
    from orchestrator.recall.ranker import default_model

    t = _corpus(tenant_factory, app_engine, embedder, settings, "kappa")
    reader = t.identity("reader", read=("team",))
    live = recaller_with(app_engine, settings, embedder)
    live.keep_candidates = True
    result, trace = live.trace(reader, "kappa budget review")
    offline = Recaller(None, settings, ranker=default_model())  # type: ignore[arg-type]
    replayed, _ = offline.replay(trace, PLAN_STUDY["learned"])
    assert replayed.rendered == result.rendered and replayed.evidence == result.evidence
    with pytest.raises(BadInput, match="no database"):
        offline.settle()


def test_the_dense_lanes_candidate_list_grows_with_the_tenant() -> None:
    """hnsw.ef_search by visible chunks: the largest threshold at or below the count wins;
    a table that names nothing that low leaves pgvector's default (40)."""
    from orchestrator.config import Settings
    from orchestrator.recall.plans import ef_search_for, transaction_settings

    defaults = Settings()
    assert [transaction_settings(n, defaults)["hnsw.ef_search"]
            for n in (0, 3999, 4000, 49999, 50000, 10**7)] == ["200", "200", "800", "800",
                                                                "1000", "1000"]
    assert ef_search_for(5, {10: 300, 1000: 500}) == 40
    assert ef_search_for(999, {1000: 500, 10: 300}) == 300
