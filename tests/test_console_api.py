"""The GraphQL fields the console is built on, over real HTTP: what each allows and denies.

A reader of scope alpha must meet nothing of scope beta in any of them: no text, no id, no
count. Auditor-only fields refuse other tokens; deriveRuns needs the dba role.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from orchestrator.console import queries as q
from tests.conftest import TenantFixture, TestDatabase
from tests.support.api import ApiServer, api_home, api_server, error_of  # noqa: F401
from tests.support.console import BETA_MARKERS, Corpus, build_corpus
from tests.support.recall import embedder  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tenant_factory: Callable[..., TenantFixture], app_engine: Engine, admin_engine: Engine,
           test_db: TestDatabase, embedder: Any, api_server: ApiServer) -> Corpus:  # noqa: F811
    return build_corpus(tenant_factory, app_engine, admin_engine, test_db, embedder,
                        api_server.settings)


def token(server: ApiServer, c: Corpus, user: str, *scopes: str) -> str:
    return server.token(c.tenant.org_id, user, scopes)


def no_beta(c: Corpus, body: str, asked: str = "") -> None:
    """No beta marker and no beta id in ``body`` (but the id the caller asked for)."""
    for marker in set(c.hidden()) - {asked}:
        assert marker not in body, f"{marker!r} leaked into {body[:300]}"


TRACE = "query($q: String!, $s: String) { recallTrace(question: $q, shape: $s) { " + q.TRACE + " } }"


def test_recall_trace_shows_only_the_readers_rows(api_server: ApiServer, corpus: Corpus,  # noqa: F811
                                                  admin_engine: Engine) -> None:
    reader = token(api_server, corpus, "rita", "read:alpha")
    # Words of the beta document (covert plan, cover) but none of its markers.
    question = "Who runs the covert plan that uses the Kestrel launch as its cover?"
    response = api_server.post(reader, TRACE, {"q": question})
    assert response.status_code == 200, response.text
    trace = response.json()["data"]["recallTrace"]
    no_beta(corpus, response.text)
    assert "Kestrel" in trace["rendered"]
    lanes = {p["lane"] for p in trace["pools"] if p["items"]}
    assert {"dense", "lexical"} <= lanes
    assert trace["kept"] >= 1 and trace["ordered"] and trace["timings"]
    # Naming beta's people and places outright finds nothing of them either (the question
    # itself is echoed back, so it is taken out before looking).
    named = "Where does Zenobia Quartzfield run the Osprey plan, Reykjavik or Kestrel?"
    echoed = api_server.post(reader, TRACE, {"q": named})
    assert echoed.status_code == 200, echoed.text
    no_beta(corpus, echoed.text.replace(named, ""))
    # The lexical corpus count is the reader's: alpha's chunks, not the tenant's.
    with admin_engine.connect() as conn:
        alpha_chunks = conn.execute(text(
            "select count(*) from sources.chunks where tenant_id = :t and :a = any(scopes)"),
            {"t": corpus.tenant.id, "a": corpus.tenant.scopes["alpha"]}).scalar_one()
    assert trace["corpusChunks"] == alpha_chunks
    # A writer of both scopes sees beta in the same trace: the deny above is RLS, not luck.
    both = token(api_server, corpus, "wanda", "read:alpha", "read:beta")
    seen = api_server.post(both, TRACE, {"q": question}).text
    assert "Osprey" in seen
    # A study shape runs through the same rules; an unknown one is bad input.
    study = api_server.post(reader, TRACE, {"q": question, "s": "bm25-only"})
    no_beta(corpus, study.text)
    assert study.json()["data"]["recallTrace"]["shape"] == "bm25-only"
    bad = api_server.post(reader, TRACE, {"q": question, "s": "everything"})
    assert error_of(bad)["extensions"]["code"] == "BAD_USER_INPUT"


def test_unknown_trace_steps_come_through_generically() -> None:
    from dataclasses import dataclass

    from orchestrator.api import tracing
    from orchestrator.recall.result import RecallResult
    from orchestrator.recall.trace import Trace

    @dataclass
    class Newer(Trace):
        mmr: dict[str, Any] | None = None

    trace = Newer("q", None, "full", None, 100, mmr={"lambda": 0.5, "dropped": ["x"]})
    out = tracing.recall_trace(RecallResult("q", None, 100, 0), trace, [])
    assert [s for s in out["steps"] if s["name"] == "mmr"] == [
        {"name": "mmr", "data": {"lambda": 0.5, "dropped": ["x"]}, "text": None, "idle": False}]
    assert "replay" not in {s["name"] for s in out["steps"]}, "evaluation state is never shown"
    # A step the trace has words for says them; one that had nothing to do is idle.
    trace.deprecated = "2 chunk(s) with a deprecation notice, at 0.5 of their merit"
    trace.clipped = (80, 1100)
    steps = {s["name"]: s for s in tracing.recall_trace(RecallResult("q", None, 100, 0), trace,
                                                        [])["steps"]}
    assert steps["deprecated"]["text"] == trace.deprecated and not steps["deprecated"]["idle"]
    assert steps["clipped"]["text"] == ("the last is a part of its chunk, 80 of 1100 characters, "
                                        "cut to fit the room left")
    assert steps["navigation"] == {"name": "navigation", "data": "", "text": None, "idle": True}
    assert steps["unfound"]["idle"] and steps["redundant"]["idle"]
    # The same words as the trace's text (what `engram trace` prints).
    assert steps["clipped"]["text"] in trace.format()


def test_a_long_list_of_the_trace_shows_its_first_lines_and_says_how_many_more() -> None:
    """On this project's docs one question's Recall page listed 17 redundant derived items and
    12 duplicates in full, cards a screen long (stop 50): the first five are shown, the rest
    behind a disclosure that says how many."""
    from orchestrator.config import Settings
    from orchestrator.console.routes import Console

    env = Console(Settings(), None, None).env  # type: ignore[arg-type]
    capped = env.get_template("_capped.j2").module.capped  # type: ignore[attr-defined]
    lines = [f"dropped fact {i}: its text is in <Notes #{i}>" for i in range(12)]
    html = str(capped(lines))
    assert html.count("<li>") == 12 and "<summary>7 more</summary>" in html
    assert html.index("dropped fact 4:") < html.index("<details") < html.index("dropped fact 5:")
    assert "&lt;Notes #3&gt;" in html and "<Notes" not in html  # escaped as everything else
    said = str(capped("\n".join(lines[:6]).split("\n"), said=True))
    assert said.count('<p class="said">') == 2 and "<summary>1 more</summary>" in said
    few = str(capped(lines[:5]))
    assert "<details" not in few and few.count("<li>") == 5
    line = env.filters["duplicate_line"]({"label": "a", "twin": "b", "similarity": 0.98765})
    assert line == "a: near-duplicate of b (0.988)"


def test_memory_fields_deny_other_scopes(api_server: ApiServer, corpus: Corpus) -> None:  # noqa: F811
    reader = token(api_server, corpus, "rita", "read:alpha")
    for query, variables in (
            (q.DOCUMENTS, {}), (q.ENTITIES, {}), (q.KEYED, {}), (q.CONFLICTS, {"status": None}),
            (q.QUARANTINE, {"status": None}), (q.DERIVED, {}), (q.OPERATIONS, {}), (q.CHARTS, {})):
        response = api_server.post(reader, query, variables)
        assert response.status_code == 200 and "errors" not in response.json(), response.text
        no_beta(corpus, response.text)
    # Beta rows by id: the same NOT_FOUND as an id that exists nowhere.
    beta_doc = corpus.docs["osprey.md"]
    for query, variables in ((q.DOCUMENT, {"id": beta_doc, "direction": "forward"}),
                             (q.LINEAGE, {"table": "sources.documents", "id": beta_doc})):
        response = api_server.post(reader, query, variables)
        assert error_of(response)["extensions"]["code"] == "NOT_FOUND"
        no_beta(corpus, response.text, asked=beta_doc)
    claim_id = next(i for i in corpus.beta_ids)
    response = api_server.post(reader, "query($i: ID!) { claim(id: $i) { text } }", {"i": claim_id})
    assert error_of(response)["extensions"]["code"] in ("NOT_FOUND", "BAD_USER_INPUT")


def test_document_lineage_reaches_extracted_claims(api_server: ApiServer, corpus: Corpus) -> None:  # noqa: F811
    reader = token(api_server, corpus, "rita", "read:alpha")
    data = api_server.gql(reader, q.DOCUMENT, {"id": corpus.docs["kestrel.md"],
                                               "direction": "forward"})
    tables = {n["table"] for n in data["readableLineage"]["nodes"]}
    assert {"sources.documents", "sources.chunks", "knowledge.fact_claim"} <= tables
    assert data["documentById"]["embedding"]["state"] == "embedded"
    assert data["documentById"]["embedding"]["chunksEmbedded"] == data["documentById"]["chunkCount"]
    # Back from a claim: its chunk, readable.
    claim = next(n for n in data["readableLineage"]["nodes"] if n["table"] == "knowledge.fact_claim")
    back = api_server.gql(reader, q.LINEAGE, {"table": "knowledge.fact_claim", "id": claim["id"],
                                              "direction": "back"})
    assert "sources.chunks" in {n["table"] for n in back["readableLineage"]["nodes"]}


def test_quarantine_release_and_discard(api_server: ApiServer, corpus: Corpus,  # noqa: F811
                                        tenant_factory: Callable[..., TenantFixture],
                                        app_engine: Engine, admin_engine: Engine,
                                        test_db: TestDatabase, embedder: Any) -> None:  # noqa: F811
    # A corpus of its own: releasing changes it.
    c = build_corpus(tenant_factory, app_engine, admin_engine, test_db, embedder, api_server.settings)
    reader, writer = token(api_server, c, "rita", "read:alpha"), token(api_server, c, "alice",
                                                                       "write:alpha")
    held = c.quarantine["alpha"]
    refused = api_server.post(reader, q.RELEASE, {"id": held, "corrections": {"object_value": "senior"}})
    assert error_of(refused)["extensions"]["code"] in ("FORBIDDEN", "NOT_FOUND", "BAD_USER_INPUT")
    still = api_server.gql(writer, q.RELEASE, {"id": held, "corrections": {"object_value": "expert"}})
    assert still["releaseQuarantine"]["quarantined"] and still["releaseQuarantine"]["reasons"]
    done = api_server.gql(writer, q.RELEASE, {"id": held, "corrections": {"object_value": "senior"}})
    assert done["releaseQuarantine"]["claimId"] and not done["releaseQuarantine"]["quarantined"]
    bad = api_server.post(writer, q.RELEASE, {"id": held, "corrections": ["x"]})
    assert error_of(bad)["extensions"]["code"] == "BAD_USER_INPUT"
    # Beta's entry: a reader of alpha cannot discard it, nor learn it exists.
    foreign = api_server.post(writer, q.DISCARD, {"id": c.quarantine["beta"]})
    assert error_of(foreign)["extensions"]["code"] == "NOT_FOUND"
    bob = token(api_server, c, "bob", "write:beta")
    gone = api_server.gql(bob, q.DISCARD, {"id": c.quarantine["beta"]})
    assert gone["discardQuarantine"]["status"] == "discarded"
    again = api_server.post(bob, q.DISCARD, {"id": c.quarantine["beta"]})
    assert error_of(again)["extensions"]["code"] == "NOT_FOUND"


AUDITOR_ONLY = [
    ("{ chainHead { seq } }", {}),
    ("{ verifyChainStep { ok } }", {}),
    ('{ checkAnchors(anchors: "") { ok } }', {}),
    ("{ receipts { id } }", {}),
    ('{ verifyReceipt(id: "00000000-0000-4000-8000-000000000000") { ok } }', {}),
    ("{ provenanceExport }", {}),
]


def test_audit_fields_are_for_auditors_of_their_own_tenant(api_server: ApiServer,  # noqa: F811
                                                           corpus: Corpus,
                                                           tenant_factory: Callable[..., TenantFixture]
                                                           ) -> None:
    app_token = token(api_server, corpus, "alice", "write:alpha")
    for query, variables in AUDITOR_ONLY:
        response = api_server.post(app_token, query, variables)
        assert error_of(response)["extensions"]["code"] == "FORBIDDEN", (query, response.text)
    auditor = token(api_server, corpus, "audrey", "read:alpha", "engram:auditor")
    api_server.gql(auditor, "{ recall(question: \"Kestrel launch\") { rendered } }")
    head = api_server.gql(auditor, "{ chainHead { seq hash anchor } }")["chainHead"]
    assert head["seq"] > 0 and json.loads(head["anchor"])["seq"] == head["seq"]
    start, steps = 1, 0
    while True:
        step = api_server.gql(auditor, q.VERIFY_STEP, {"from": start, "limit": 40})["verifyChainStep"]
        steps += 1
        assert step["ok"], step
        if step["done"]:
            break
        start = step["lastSeq"] + 1
    assert steps >= 2 and step["lastSeq"] >= head["seq"]
    checked = api_server.gql(auditor, q.ANCHORS, {"a": head["anchor"]})["checkAnchors"]
    assert checked == [{"seq": head["seq"], "ok": True, "problem": None}]
    forged = json.loads(head["anchor"])
    forged["hash"] = "00" * 32
    assert not api_server.gql(auditor, q.ANCHORS, {"a": json.dumps(forged)})["checkAnchors"][0]["ok"]
    receipts = api_server.gql(auditor, "{ receipts { id evidenceCount } }")["receipts"]
    assert receipts
    r = api_server.gql(auditor, q.RECEIPT, {"id": receipts[0]["id"]})["receipt"]
    assert r["proven"] and len(r["seal"]) == 64
    export = api_server.gql(auditor, q.EXPORT, {"format": "jsonld"})["provenanceExport"]
    assert "prov" in export and corpus.tenant.org_id not in ("",)
    # Another tenant's auditor: the receipt is NOT_FOUND, the anchor refused.
    other = tenant_factory("team")
    stranger = api_server.token(other.org_id, "eve", ("read:team", "engram:auditor"))
    assert error_of(api_server.post(stranger, q.RECEIPT, {"id": receipts[0]["id"]}))[
        "extensions"]["code"] == "NOT_FOUND"
    assert error_of(api_server.post(stranger, q.ANCHORS, {"a": head["anchor"]}))[
        "extensions"]["code"] == "BAD_USER_INPUT"


def test_operations_fields(api_server: ApiServer, corpus: Corpus) -> None:  # noqa: F811
    reader = token(api_server, corpus, "rita", "read:alpha")
    response = api_server.post(reader, q.DERIVE_RUNS)
    assert error_of(response)["extensions"]["code"] == "FORBIDDEN"
    dba = token(api_server, corpus, "dora", "read:alpha", "engram:dba")
    # A failed scheduler run, as the scheduler records it: the DBA sees it with its error,
    # through GraphQL and on the console's operations page.
    from orchestrator.derive.jobs import RUN_LOG, JobResult

    RUN_LOG.record(JobResult("extract", corpus.tenant.org_id, False,
                             "ExtractionError: chunk 7 could not be parsed", 0.25))
    runs = api_server.gql(dba, q.DERIVE_RUNS)["deriveRuns"]
    assert all(r["source"] in ("scheduler", "provenance") for r in runs)
    failed = [r for r in runs if not r["ok"]]
    assert [(r["job"], r["source"], r["error"]) for r in failed] == [
        ("extract", "scheduler", "ExtractionError: chunk 7 could not be parsed")]
    assert any(r["source"] == "provenance" and r["ok"] for r in runs), "the extraction's activity"
    # An activity's parameters read as words ("days 2026-12-06, 2026-12-07", not a Python list).
    from orchestrator.api.operations import _words

    assert _words(["2026-12-06", "2026-12-07"]) == "2026-12-06, 2026-12-07" and _words([]) == "none"
    assert not any("['" in (r["summary"] or "") for r in runs), runs
    page = httpx.get(f"{api_server.url}/console/operations", cookies={"engram_console": dba},
                     timeout=60)
    assert page.status_code == 200 and "chunk 7 could not be parsed" in page.text
    other = httpx.get(f"{api_server.url}/console/operations", cookies={"engram_console": reader},
                      timeout=60)
    assert "chunk 7" not in other.text and "engram:dba" in other.text
    data = api_server.gql(reader, q.OPERATIONS)
    chunks = next(t for t in data["embedQueue"]["tables"] if t["table"] == "sources.chunks")
    both = token(api_server, corpus, "wanda", "read:alpha", "read:beta")
    all_chunks = next(t for t in api_server.gql(both, q.OPERATIONS)["embedQueue"]["tables"]
                      if t["table"] == "sources.chunks")
    # Counts are the reader's own: beta's chunks are not in alpha's figures.
    assert 0 < chunks["ready"] < all_chunks["ready"]
    for variables in ({"h": 0}, {"h": 100000}):
        bad = api_server.post(reader, "query($h: Int) { embedQueue(hours: $h) { series { depth } } }",
                              variables)
        assert error_of(bad)["extensions"]["code"] == "BAD_USER_INPUT"
    assert [m for m in BETA_MARKERS if m in json.dumps(data)] == []


def test_the_console_reads_only_through_graphql() -> None:
    """No private back door: the console's modules import nothing that reaches the database,
    so whatever it shows came from a GraphQL operation any client can run."""
    import ast

    from tests.conftest import REPO

    allowed = ("orchestrator.auth", "orchestrator.config", "orchestrator.console",
               "orchestrator.errors", "orchestrator.messages")
    for path in (REPO / "orchestrator" / "console").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith("orchestrator"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"
                assert not name.startswith(("sqlalchemy", "psycopg")), f"{path.name} imports {name}"


def test_verify_in_steps_finds_what_a_tampering_superuser_did(
        api_server: ApiServer, tenant_factory: Callable[..., TenantFixture],  # noqa: F811
        app_engine: Engine, admin_engine: Engine) -> None:
    from tests.support.provenance import as_superuser, put

    t = tenant_factory("team")
    first = put(app_engine, t, "one.md")
    for i in range(5):
        put(app_engine, t, f"more-{i}.md")
    auditor = api_server.token(t.org_id, "audrey", ("read:team", "engram:auditor"))

    def walk() -> list[dict[str, Any]]:
        steps, start = [], 1
        while True:
            step = api_server.gql(auditor, q.VERIFY_STEP, {"from": start, "limit": 4})[
                "verifyChainStep"]
            steps.append(step)
            if step["done"]:
                return steps
            start = step["lastSeq"] + 1

    clean = walk()
    assert len(clean) >= 2 and all(s["ok"] for s in clean)
    # A memory row changed behind the chain's back: the step at the head says which.
    as_superuser(admin_engine, "update sources.documents set title = 'rewritten' where id = :d",
                 {"d": first})
    last = walk()[-1]
    assert not last["ok"] and last["brokenAt"] is None
    assert [p for p in last["rowProblems"] if str(first) in p]
    # An event edited in place: the walk stops at it.
    as_superuser(admin_engine, "update provenance.events set actor_user = 'mallory' "
                               "where tenant_id = :t and seq = 6", {"t": t.id})
    broken = walk()
    assert broken[-1]["done"] and not broken[-1]["ok"] and broken[-1]["brokenAt"] == 6
    assert all(s["ok"] for s in broken[:-1])
    response = api_server.post(auditor, q.VERIFY_STEP, {"from": 0, "limit": 4})
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"
    response = api_server.post(auditor, q.VERIFY_STEP, {"from": 1, "limit": 100000})
    assert error_of(response)["extensions"]["code"] == "BAD_USER_INPUT"


def test_console_actions_need_its_origin_and_a_live_token(api_server: ApiServer,  # noqa: F811
                                                          corpus: Corpus, admin_engine: Engine) -> None:
    writer = token(api_server, corpus, "alice", "write:alpha")
    conflict = corpus.conflicts["alpha"]
    url = f"{api_server.url}/console/memory/conflicts/{conflict}/resolve"
    form = {"strategy": "keep_both"}

    def status() -> str:
        with admin_engine.connect() as conn:
            return str(conn.execute(text("select status from knowledge.conflicts where id = :c"),
                                    {"c": conflict}).scalar_one())

    # A form posted from another site (or with no origin at all) changes nothing.
    for headers in ({"origin": "https://evil.example"}, {}):
        refused = httpx.post(url, data=form, cookies={"engram_console": writer}, headers=headers,
                             timeout=60)
        assert refused.status_code == 403 and status() == "open"
    # An expired token: back to sign-in, with the reason, and nothing changed.
    import time

    past = int(time.time()) - 600
    expired = api_server.token(corpus.tenant.org_id, "alice", ("write:alpha",),
                               extra={"iat": past, "nbf": past, "exp": past + 60})
    for method, target in (("GET", f"{api_server.url}/console/recall"), ("POST", url)):
        response = httpx.request(method, target, data=form if method == "POST" else None,
                                 cookies={"engram_console": expired},
                                 headers={"origin": api_server.url}, timeout=60)
        assert response.status_code == 303 and "no+longer+verifies" in response.headers["location"]
    assert status() == "open"


def test_derive_runs_show_the_kept_job_runs_to_readers_of_all_their_scopes(
        api_server: ApiServer, corpus: Corpus, app_engine: Engine) -> None:  # noqa: F811
    """A run of another process that skipped an item (memory.job_runs, e.g. the worker's)
    shows in deriveRuns and on the operations page with what it skipped and why; a DBA who
    cannot read every scope the run covered does not see it (its item names span them)."""
    from datetime import UTC, datetime

    from orchestrator.db.session import bound_session
    from orchestrator.derive import poison

    t = corpus.tenant
    service = t.identity("svc-test", read=("alpha", "beta"), write=("alpha", "beta"))
    poison.record_run(lambda: bound_session(app_engine, service), "consolidate", ok=True,
                      line="3 observations written; 1 skipped",
                      skipped=[poison.Skipped("observation obs-7", "the database refused it")],
                      started_at=datetime.now(UTC))
    both = token(api_server, corpus, "dora", "read:alpha", "read:beta", "engram:dba")
    kept = [r for r in api_server.gql(both, q.DERIVE_RUNS)["deriveRuns"] if r["source"] == "job_runs"]
    assert [(r["job"], r["ok"]) for r in kept] == [("consolidate", True)]
    assert "skipped observation obs-7: the database refused it" in kept[0]["summary"]
    page = httpx.get(f"{api_server.url}/console/operations", cookies={"engram_console": both},
                     timeout=60)
    assert page.status_code == 200 and "obs-7" in page.text
    alpha_only = token(api_server, corpus, "dan", "read:alpha", "engram:dba")
    runs = api_server.gql(alpha_only, q.DERIVE_RUNS)["deriveRuns"]
    assert not [r for r in runs if r["source"] == "job_runs"]
    page = httpx.get(f"{api_server.url}/console/operations", cookies={"engram_console": alpha_only},
                     timeout=60)
    assert page.status_code == 200 and "obs-7" not in page.text


def test_a_console_page_refusing_a_value_answers_400(api_server: ApiServer,  # noqa: F811
                                                    corpus: Corpus) -> None:
    """A page that shows a refusal carries the API's status for it (it answered 200 with
    BAD_USER_INPUT on the page): 400 for a refused value, 404 for what does not exist."""
    reader = token(api_server, corpus, "alice", "read:alpha")

    def get(path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{api_server.url}{path}", params=params or None,
                         cookies={"engram_console": reader}, timeout=60)

    for path, params, words in (
            ("/console/memory/conflicts", {"status": "weird"}, "is not one of"),
            ("/console/memory/quarantine", {"status": "gone"}, "is not one of"),
            ("/console/memory/entities/not-a-uuid", {}, "BAD_USER_INPUT"),
            ("/console/recall", {"question": "roof", "budget": "many"}, "is not a whole number"),
            ("/console/recall", {"question": "roof", "mode": "psychic"}, "unknown mode")):
        page = get(path, **params)
        assert page.status_code == 400 and words in page.text, (path, page.status_code)
    # A budget that serves nothing says the budget that would, not "nothing matched".
    tight = get("/console/recall", question="Kestrel launch", budget="5")
    assert tight.status_code == 200
    assert re.search(r"no evidence fits within 5 tokens: evidence matched, and the first item "
                     r"needs a budget of at least \d+ tokens", tight.text), tight.text[-2000:]
    missing = get("/console/memory/documents/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404 and "NOT_FOUND" in missing.text
    assert get("/console/memory/conflicts").status_code == 200
    step = get("/console/audit/verify", **{"from": "abc"})
    assert step.status_code == 400 and "abc&#39; is not an event number" in step.text
    # A fragment htmx asked for keeps 200, or htmx would not swap the refusal into the page.
    fragment = httpx.post(f"{api_server.url}/console/memory/conflicts/{corpus.conflicts['alpha']}"
                          "/resolve", data={"strategy": "psychic"},
                          cookies={"engram_console": token(api_server, corpus, "alice",
                                                           "write:alpha")},
                          headers={"origin": api_server.url, "hx-request": "true"}, timeout=60)
    assert fragment.status_code == 200 and "psychic" in fragment.text, fragment.text
