"""Bad input is one clear BAD_USER_INPUT wherever it comes in, and nothing changes (issue 16):
NUL and lone surrogates, NaN/Infinity, out-of-range ints, deep JSON, undecodable DateTimes; the
cost limit prices variables with their defaults."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from orchestrator.api.mcp import build_server
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.cli.main import app
from orchestrator.client import Engram
from orchestrator.errors import BadInput
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server  # noqa: F401
from tests.test_trust_writes import snapshot

Tenants = Callable[..., TenantFixture]

UPSERT = "mutation($i: DocumentInput!) { upsertDocument(input: $i) { created } }"
DECISION = "mutation($i: DecisionInput!) { recordDecision(input: $i) }"
FACT = "mutation($i: FactInput!) { assertFact(input: $i) { claimId } }"


def raw(server: ApiServer, token: str, body: str) -> httpx.Response:
    """A body as sent, so it can carry what json.dumps would refuse to write."""
    return httpx.post(f"{server.url}/graphql", content=body.encode("utf-8", "surrogatepass"),
                      headers={"authorization": f"Bearer {token}",
                               "content-type": "application/json"}, timeout=60)


def refused(response: httpx.Response, *fragments: str) -> None:
    """BAD_USER_INPUT errors only (never an INTERNAL one beside them), status 400 or 200."""
    assert response.status_code in (200, 400), response.text
    errors = response.json()["errors"]
    assert {e["extensions"]["code"] for e in errors} == {"BAD_USER_INPUT"}, errors
    for fragment in fragments:
        assert fragment in errors[0]["message"], errors


@pytest.fixture
def writer(api_server: ApiServer, tenant_factory: Tenants) -> tuple[TenantFixture, str]:  # noqa: F811
    t = tenant_factory("board")
    return t, api_server.token(t.org_id, "w", ("write:board", "engram:auditor"))


def _doc(**over: Any) -> dict[str, Any]:
    return {"collection": "c", "path": "p.md", "title": "T", "body": "b", "scopes": ["board"]} | over


def test_unstorable_text_is_refused_by_name_wherever_it_is(api_server: ApiServer,  # noqa: F811
                                                           writer: tuple[TenantFixture, str],
                                                           admin_engine: Engine) -> None:
    t, token = writer
    before = snapshot(admin_engine, t)
    for field in ("title", "path", "collection", "body"):
        refused(api_server.post(token, UPSERT, {"i": _doc(**{field: "a\x00b"})}),
                f"variables.i.{field} contains a NUL character")
        refused(raw(api_server, token, json.dumps({"query": UPSERT, "variables": {"i": _doc(**{
            field: "a\ud800b"})}})), f"variables.i.{field} contains a lone UTF-16 surrogate")
    refused(api_server.post(token, 'mutation { remember(sessionId: "s", text: "t", '
                                   'scopes: ["bo\\u0000ard"]) }'), "a string in the query")
    refused(api_server.post(token, 'mutation($t: String!) { resolveEntity(type: "person", '
                                   'name: $t, scopes: ["board"]) }', {"t": "Al\x00ice"}))
    question = "query($q: String!) { recall(question: $q) { rendered } }"
    refused(raw(api_server, token, json.dumps({"query": question, "variables": {"q": "x\ud800"}})),
            "variables.q")
    # A cursor carrying a NUL once decoded.
    import base64

    cursor = base64.urlsafe_b64encode(json.dumps(["a\x00", "b", str(uuid.uuid4())]).encode()).decode()
    refused(api_server.post(token, "query($a: String) { documents(after: $a) { edges { cursor } } }",
                            {"a": cursor}), "cursor")
    assert snapshot(admin_engine, t) == before


def test_numbers_out_of_range_and_undecodable_values_are_one_clear_error(
        api_server: ApiServer, writer: tuple[TenantFixture, str], admin_engine: Engine) -> None:  # noqa: F811
    t, token = writer
    before = snapshot(admin_engine, t)
    pages = "query($f: Int) { documents(first: $f) { edges { cursor } } }"
    refused(api_server.post(token, pages, {"f": "x"}), "$f")
    refused(api_server.post(token, pages, {"f": 2**31}), "32-bit")
    snooze = f'mutation($u: DateTime) {{ snooze(id: "{uuid.uuid4()}", until: $u) {{ id }} }}'
    refused(api_server.post(token, snooze, {"u": "yesterday"}), "ISO 8601")
    refused(api_server.post(token, snooze, {"u": "99999-01-01T00:00:00Z"}), "ISO 8601")
    decision = {"category": "c", "scenario": "s", "reasoning": "r", "scopes": ["board"]}
    for constant in ("NaN", "Infinity", "-Infinity"):
        body = json.dumps({"query": DECISION, "variables": {"i": decision | {"confidence": 0.5}}})
        refused(raw(api_server, token, body.replace("0.5", constant)), constant)
    refused(raw(api_server, token, json.dumps({"query": DECISION, "variables": {
        "i": decision | {"confidence": 0.5}}}).replace("0.5", "1e999")), "not a finite number")
    entity = str(uuid.uuid4())
    refused(api_server.post(token, FACT, {"i": {"subjectId": entity, "predicate": "p", "text": "t",
                                                "value": 1, "scopes": ["board"],
                                                "authority": 2**31}}), "32-bit")
    refused(api_server.post(token, '{ documents(first: 1e999) { edges { cursor } } }'))
    deep = raw(api_server, token, "[" * 100_000 + "]" * 100_000)
    assert deep.status_code == 400
    refused(deep, "nested more than 64 levels")
    refused(api_server.post(token, UPSERT, {"i": _doc(metadata=json.loads("[" * 80 + "]" * 80))}),
            "nested more than 64 levels")
    assert snapshot(admin_engine, t) == before


def test_the_cost_limit_reads_variable_defaults(api_server: ApiServer,  # noqa: F811
                                                writer: tuple[TenantFixture, str]) -> None:
    _, token = writer
    aliases = " ".join(f"a{i}: documents(first: $f) {{ edges {{ node {{ body }} }} }}" for i in range(60))
    for query in (f"query($f: Int = 100) {{ {aliases} }}",
                  f"query($f: Int) {{ {aliases} }}"):
        variables = {} if "= 100" in query else {"f": 100}
        response = api_server.post(token, query, variables)
        refused(response, "exceeds the maximum cost of 5000")
    lineage = 'query($d: Int = 100000) { provenance(table: "sources.documents", rowId: {id: "x"}, ' \
              "maxDepth: $d) { proven } }"
    refused(api_server.post(token, lineage), "maximum cost")
    deep = '{ provenance(table: "sources.documents", rowId: {id: "x"}, maxDepth: 200) { proven } }'
    response = api_server.post(token, deep)
    assert response.json()["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert "max_depth must be 1 to 100" in response.json()["errors"][0]["message"]


def test_mcp_cli_and_client_inputs_follow_the_same_rules(
        api_server: ApiServer, writer: tuple[TenantFixture, str], app_engine: Engine,  # noqa: F811
        admin_engine: Engine) -> None:
    t, token = writer
    settings = api_server.settings
    verifier = TokenVerifier.from_settings(settings)
    server = build_server(lambda: Engram(app_engine, token, settings, verifier=verifier,
                                         channel="mcp"))
    before = snapshot(admin_engine, t)
    calls = {
        "remember": {"session_id": "s", "text": "a\x00b", "scopes": ["board"]},
        "record_decision": {"category": "c", "scenario": "s\ud800", "reasoning": "r",
                            "confidence": 0.5, "scopes": ["board"]},
        "search_documents": {"first": 2**40},
    }
    for tool, arguments in calls.items():
        with pytest.raises(Exception) as caught:
            anyio.run(server.call_tool, tool, arguments)
        assert "BAD_USER_INPUT: " in str(caught.value), (tool, caught.value)
    # The command line: a lone surrogate is what bytes that are not UTF-8 become.
    result = CliRunner().invoke(app, ["recall", "caf\udce9?"])
    assert result.exit_code == 2 and "argument 2 contains a lone UTF-16 surrogate" in result.output
    # The Python client reaches the database directly: the engine refuses the value.
    client = Engram(app_engine, token, settings, verifier=verifier)
    with pytest.raises(BadInput, match="NUL character"):
        client.upsert_document("c", "p.md", "T\x00", "body", scopes=["board"])
    assert snapshot(admin_engine, t) == before
