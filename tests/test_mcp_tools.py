"""Every MCP tool, allowed and denied, through the SDK's client against Engram's server.

One server per identity, as ``engram mcp`` builds it for a token (the in-memory
transport; the stdio and HTTP transports and per-call token checks are tested in
``test_api_mcp.py``). The identities: a writer of ``team``, a second writer, a
reader of ``team``, an auditor, a stranger from another tenant and that tenant's
auditor. Each tool's deny is what the GraphQL field gives the same identity: a
refusal with Engram's code, or nothing of another's memory. The last assertion
checks that no tool of the server went untested.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import anyio
import pytest
from mcp import Client
from sqlalchemy import Engine

from orchestrator.api.audit import AuditorEngine
from orchestrator.api.mcp import build_server
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from orchestrator.recall import Recaller
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server  # noqa: F401
from tests.support.knowledge import define_shape, strict_shapes
from tests.support.recall import embed_pending, embedder  # noqa: F401

Tenants = Callable[..., TenantFixture]


class Tools:
    """One identity's MCP server, called tool by tool; records what was exercised."""

    tested: ClassVar[set[str]] = set()

    def __init__(self, server: Any) -> None:
        self.server = server

    def call(self, tool: str, **arguments: Any) -> Any:
        Tools.tested.add(tool)

        async def go() -> Any:
            async with Client(self.server) as client:
                return await client.call_tool(tool, arguments)

        return anyio.run(go)

    def ok(self, tool: str, **arguments: Any) -> Any:
        result = self.call(tool, **arguments)
        assert not result.is_error, (tool, result.content)
        if result.structured_content is not None:
            content = result.structured_content
            return content.get("result", content) if isinstance(content, dict) else content
        return json.loads(result.content[0].text) if result.content else None

    def refused(self, tool: str, code: str, says: str = "", **arguments: Any) -> str:
        result = self.call(tool, **arguments)
        message = result.content[0].text
        assert result.is_error and f": {code}: " in message and says in message, (tool, message)
        return str(message)


@pytest.fixture(scope="module")
def tools_for(api_server: ApiServer, app_engine: Engine  # noqa: F811
              ) -> Any:
    settings = api_server.settings
    verifier = TokenVerifier.from_settings(settings)
    recaller = Recaller(app_engine, settings)
    auditor = AuditorEngine(settings)

    def make(token: str) -> Tools:
        return Tools(build_server(lambda: Engram(app_engine, token, settings, verifier=verifier,
                                                 recaller=recaller, auditor=auditor,
                                                 channel="mcp")))

    yield make
    auditor.dispose()


@pytest.mark.slow
def test_every_tool_allows_and_denies(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                                      admin_engine: Engine, app_engine: Engine, tools_for: Any,
                                      test_db: Any, embedder: Any) -> None:  # noqa: F811
    t, other = tenant_factory("team", "board"), tenant_factory("team", "lab")
    define_shape(admin_engine, t.id, "lives_in", max_count=1)
    define_shape(admin_engine, t.id, "level", allowed_values=["junior", "senior"])
    strict_shapes(admin_engine, t.id)
    writer = tools_for(api_server.token(t.org_id, "alice", ("write:team",)))
    bruno = tools_for(api_server.token(t.org_id, "bruno", ("write:team",)))
    reader = tools_for(api_server.token(t.org_id, "rita", ("read:team",)))
    auditor = tools_for(api_server.token(t.org_id, "audrey", ("read:team", "engram:auditor")))
    stranger = tools_for(api_server.token(other.org_id, "sam", ("write:team",)))
    their_auditor = tools_for(api_server.token(other.org_id, "otto",
                                               ("read:team", "engram:auditor")))

    # -- who is asking: the token's identity and its tenant's scopes, none of another's ----
    me = writer.ok("whoami")
    assert (me["org_id"], me["user_id"], me["write_scopes"]) == (t.org_id, "alice", ["team"])
    assert {s["name"]: (s["can_read"], s["can_write"]) for s in me["scopes"]} \
        == {"team": (True, True), "board": (False, False)}
    assert {s["name"]: (s["can_read"], s["can_write"])
            for s in reader.ok("whoami")["scopes"]}["team"] == (True, False)
    theirs = stranger.ok("whoami")
    assert theirs["org_id"] == other.org_id and theirs["user_id"] == "sam"
    assert {s["name"] for s in theirs["scopes"]} == {"team", "lab"}, "another tenant's scopes"

    days = {1: "Planted tomatoes along the fence.", 2: "The heron came back to the pond.",
            3: "Harvested the first courgettes."}
    docs = {}
    for day, body in days.items():
        written = writer.ok("upsert_document", collection="journal", path=f"day{day}.md",
                            title=f"Journal day {day}", body=body, scopes=["team"],
                            occurred_at=f"2026-05-0{day}T08:00:00+00:00")
        assert written["created"] and written["chunks"] == 1
        assert written["document"]["occurred_at"] == f"2026-05-0{day}T08:00:00+00:00"
        docs[day] = written["document"]["id"]
    reader.refused("upsert_document", "FORBIDDEN", collection="journal", path="x.md", title="X",
                   body="x", scopes=["team"])
    writer.refused("upsert_document", "BAD_USER_INPUT", "has no time zone", collection="journal",
                   path="x.md", title="X", body="x", scopes=["team"],
                   occurred_at="2026-05-04T08:00:00")
    doc = reader.ok("get_document", collection="journal", path="day2.md")
    assert doc["body"] == days[2] and doc["embedding"]["state"] == "pending"
    assert stranger.ok("get_document", collection="journal", path="day2.md") is None
    assert [d["path"] for d in reader.ok("search_documents", collection="journal")["documents"]] \
        == ["day1.md", "day2.md", "day3.md"]
    assert stranger.ok("search_documents")["documents"] == []
    assert writer.ok("pin", document_id=docs[2])["pinned"] is True
    reader.refused("pin", "FORBIDDEN", document_id=docs[2])
    stranger.refused("pin", "NOT_FOUND", document_id=docs[2])
    assert writer.ok("snooze", document_id=docs[3], until="2999-01-01T00:00:00+00:00")[
        "snoozed_until"].startswith("2999-01-01")
    assert writer.ok("snooze", document_id=docs[3])["snoozed_until"] is None
    reader.refused("snooze", "FORBIDDEN", document_id=docs[3])
    writer.refused("snooze", "BAD_USER_INPUT", "not an ISO 8601", document_id=docs[3],
                   until="next tuesday")
    assert writer.ok("archive", document_id=docs[1])["archived_at"] is not None
    assert writer.ok("archive", document_id=docs[1], archived=False)["archived_at"] is None
    reader.refused("archive", "FORBIDDEN", document_id=docs[1])

    # -- recall, prepare, trace: the timeline lane sees the dated neighbours -----------
    found = reader.ok("recall", question="Did the heron come back?")
    assert found["evidence"][0]["text"] == days[2]
    first = found["evidence"][0]
    assert (first["occurred_at"], first["author"], first["fact"], first["clipped"]) == (
        "2026-05-02T08:00:00+00:00", "alice", None, False)
    assert "heron" not in json.dumps(stranger.ok("recall", question="Did the heron come back?"))
    assert found["needed_tokens"] is None
    tight = reader.ok("recall", question="Did the heron come back?", budget_tokens=8)
    assert tight["evidence"] == [] and tight["needed_tokens"] > 8 and tight["receipt_id"] is None
    assert reader.ok("memory_prepare", question="Did the heron come back?",
                     budget_tokens=8)["needed_tokens"] > 8
    bundle = reader.ok("memory_prepare", question="Did the heron come back?")
    assert "heron" in bundle["rendered"] and bundle["evidence"][0]["text"] == days[2]
    assert {d["item_id"] for d in bundle["documents"]} <= set(docs.values())
    assert "heron" not in json.dumps(stranger.ok("memory_prepare",
                                                 question="Did the heron come back?"))
    traced = reader.ok("trace", question="Did the heron come back?")
    assert "1. candidate pools" in traced and "7. rendered" in traced and days[2] in traced
    timeline = re.split(r"\n   (?=\S)", traced.split("\n   timeline:")[1])[0]
    assert "Journal day 1" in timeline and "Journal day 3" in timeline
    receipt = re.search(r"receipt ([0-9a-f-]{36})", traced)
    assert receipt is not None
    assert days[2] not in stranger.ok("trace", question="Did the heron come back?")
    reader.refused("trace", "BAD_USER_INPUT", "unknown mode", question="x", mode="sideways")

    # -- notes, decisions, episodes ------------------------------------------------------
    assert uuid.UUID(writer.ok("remember", session_id="s1", text="Prefers tea.", scopes=["team"]))
    reader.refused("remember", "FORBIDDEN", session_id="s1", text="x", scopes=["team"])
    writer.refused("remember", "BAD_USER_INPUT", "is above the limit", session_id="s1",
                   text="x", scopes=["team"], ttl_seconds=10**9)
    assert writer.ok("session_notes", session_id="s1") == ["Prefers tea."]
    assert reader.ok("session_notes") == [], "session notes are their writer's own"
    assert uuid.UUID(writer.ok("record_decision", category="garden", scenario="Which beds?",
                               reasoning="Sun in the morning.", confidence=0.8, scopes=["team"]))
    reader.refused("record_decision", "FORBIDDEN", category="g", scenario="s", reasoning="r",
                   confidence=0.5, scopes=["team"])
    assert uuid.UUID(writer.ok("record_episode", session_id="s1", summary="Talked about tea.",
                               started_at="2026-05-02T08:00:00+00:00",
                               ended_at="2026-05-02T08:10:00+00:00", scopes=["team"]))
    reader.refused("record_episode", "FORBIDDEN", session_id="s1", summary="x",
                   started_at="2026-05-02T08:00:00+00:00", ended_at="2026-05-02T08:10:00+00:00",
                   scopes=["team"])
    writer.refused("record_episode", "BAD_USER_INPUT", "started_at", session_id="s1",
                   summary="x", started_at="yesterday", ended_at="2026-05-02T08:10:00+00:00",
                   scopes=["team"])

    # -- entities, claims, keyed facts, conflicts, quarantine ------------------------------
    ann = writer.ok("resolve_entity", entity_type="person", name="Ann", scopes=["team"])
    reader.refused("resolve_entity", "FORBIDDEN", entity_type="person", name="Rex",
                   scopes=["team"])
    assert reader.ok("entity", entity_type="person", name="ann") == ann
    assert stranger.ok("entity", entity_type="person", name="ann") is None
    assert [e["id"] for e in reader.ok("search_entities", query="an")["entities"]] == [ann]
    assert stranger.ok("search_entities", query="an")["entities"] == []
    porto = writer.ok("assert_fact", subject_id=ann, predicate="lives_in", text="Ann lives in Porto",
                      scopes=["team"], value="Porto")
    braga = bruno.ok("assert_fact", subject_id=ann, predicate="lives_in", text="Ann lives in Braga",
                     scopes=["team"], value="Braga")
    assert porto["claim_id"] and braga["claim_id"]
    reader.refused("assert_fact", "FORBIDDEN", subject_id=ann, predicate="lives_in", text="x",
                   scopes=["team"], value="Lisbon")
    assert {f["object_value"] for f in reader.ok("facts", entity_id=ann)} == {"Porto", "Braga"}
    embed_pending(test_db, embedder, api_server.settings, t.id)  # the facts lane reads meaning
    claimed = [e["fact"] for e in reader.ok("recall", question="Where does Ann live?")["evidence"]
               if e["fact"] is not None]
    assert {(f["subject"], f["predicate"]) for f in claimed} == {("Ann", "lives_in")}, claimed
    assert not any(e["fact"] for e in stranger.ok("recall", question="Where does Ann live?")[
        "evidence"])
    stranger.refused("facts", "NOT_FOUND", entity_id=ann)
    [conflict] = writer.ok("conflicts", status="open")
    assert {conflict["claim_a"], conflict["claim_b"]} == {porto["claim_id"], braga["claim_id"]}
    assert stranger.ok("conflicts") == []
    stranger.refused("resolve_conflict", "NOT_FOUND", conflict_id=conflict["id"],
                     strategy="newest_wins")
    assert writer.ok("resolve_conflict", conflict_id=conflict["id"],
                     strategy="newest_wins") == braga["claim_id"]
    writer.refused("resolve_conflict", "CONFLICT", "is already", conflict_id=conflict["id"],
                   strategy="keep_both")
    held = writer.ok("assert_fact", subject_id=ann, predicate="level", text="Ann is a wizard",
                     scopes=["team"], value="wizard")
    assert held["quarantined"] and held["reasons"]
    assert [q["id"] for q in writer.ok("quarantine")] == [held["quarantine_id"]]
    assert stranger.ok("quarantine") == []
    stranger.refused("release_quarantine", "NOT_FOUND", quarantine_id=held["quarantine_id"])
    writer.refused("release_quarantine", "BAD_USER_INPUT", "cannot correct",
                   quarantine_id=held["quarantine_id"], corrections={"author": "mallory"})
    released = writer.ok("release_quarantine", quarantine_id=held["quarantine_id"],
                         corrections={"object_value": "senior"})
    assert released["claim_id"] and not released["quarantined"]

    # -- feedback ----------------------------------------------------------------------
    item = {"table": found["evidence"][0]["item_table"], "id": found["evidence"][0]["item_id"]}
    assert reader.ok("mark_used", items=[item], claim_ids=[braga["claim_id"]]) == 2
    stranger.refused("mark_used", "NOT_FOUND", items=[item])
    # What memory_prepare served carries the same handles (a top document its document's).
    prepared = [{"table": x["item_table"], "id": x["item_id"]}
                for x in (bundle["evidence"][0], bundle["documents"][0])]
    assert reader.ok("mark_used", items=prepared) == 2
    stranger.refused("mark_used", "NOT_FOUND", items=prepared[1:])

    # -- provenance, auditors only ------------------------------------------------------
    checked = auditor.ok("verify_receipt", receipt_id=receipt.group(1))
    assert checked["proven"] is True and checked["asked_by"] == "rita" and checked["evidence"]
    # A recall's and a bundle's own receipt: what the caller got is what the receipt proves
    # (chained now, not by the recaller's background thread: twice is a no-op).
    from orchestrator.audit.receipts import chain_receipts

    with app_engine.begin() as conn:
        chain_receipts(conn)
    for answer in (found, bundle):
        served = auditor.ok("verify_receipt", receipt_id=answer["receipt_id"],
                            rendered=answer["rendered"])
        assert served["proven"] is True and served["rendered_ok"] is True, served
        assert auditor.ok("verify_receipt", receipt_id=answer["receipt_id"],
                          rendered=answer["rendered"] + " ")["rendered_ok"] is False
    reader.refused("verify_receipt", "FORBIDDEN", "engram:auditor", receipt_id=receipt.group(1))
    their_auditor.refused("verify_receipt", "NOT_FOUND", receipt_id=receipt.group(1))
    traced_doc = auditor.ok("lineage", table="sources.documents", row_id={"id": docs[2]})
    assert traced_doc["nodes"] and traced_doc["proven"] is True
    writer.refused("lineage", "FORBIDDEN", "engram:auditor", table="sources.documents",
                   row_id={"id": docs[2]})
    their_auditor.refused("lineage", "NOT_FOUND", table="sources.documents", row_id={"id": docs[2]})
    auditor.refused("lineage", "BAD_USER_INPUT", "max_depth must be 1 to 100", max_depth=10**6,
                    table="sources.documents", row_id={"id": docs[2]})
    assert auditor.ok("verify_chain", rows=False)["ok"] is True
    writer.refused("verify_chain", "FORBIDDEN", "engram:auditor")

    # -- and out again --------------------------------------------------------------------
    reader.refused("delete_document", "FORBIDDEN", "needs write", collection="journal", path="day3.md")
    assert writer.ok("delete_document", collection="journal", path="day3.md") == docs[3]
    assert writer.ok("get_document", collection="journal", path="day3.md") is None

    async def names() -> set[str]:
        async with Client(writer.server) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    untested = anyio.run(names) - Tools.tested
    assert not untested, f"MCP tools without an allow/deny test: {sorted(untested)}"


def test_every_tool_parameter_says_what_it_takes() -> None:
    """An agent picks a tool and fills its arguments from the input schema alone: every tool
    has a description, and so has every parameter; closed sets of values are named."""

    def unused() -> Engram:
        raise AssertionError("listing tools calls no tool")

    async def listed() -> list[Any]:
        async with Client(build_server(unused)) as client:
            return list((await client.list_tools()).tools)

    tools = {tool.name: tool for tool in anyio.run(listed)}
    missing = [f"{name}.{param}" for name, tool in tools.items()
               for param, schema in tool.input_schema.get("properties", {}).items()
               if not str(schema.get("description", "")).strip()]
    assert not missing, f"parameters without a description: {missing}"
    assert not [n for n, tool in tools.items() if not (tool.description or "").strip()]
    props = {n: tool.input_schema.get("properties", {}) for n, tool in tools.items()}
    assert "causal, timeline" in props["recall"]["mode"]["description"]
    assert "newest_wins, highest_authority_wins, keep_both, manual" \
        in props["resolve_conflict"]["strategy"]["description"]
    assert "held, released, discarded" in props["quarantine"]["status"]["description"]
    assert "whoami" in props["remember"]["scopes"]["description"]

