"""MCP tools over stdio with the SDK's real client session against ``engram mcp``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from orchestrator.db.server import free_port
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server  # noqa: F401
from tests.support.knowledge import counts

Tenants = Callable[..., TenantFixture]


def server_env(server: ApiServer, token: str) -> dict[str, str]:
    s = server.settings
    env = {**os.environ, "ENGRAM_HOME": str(s.home), "ENGRAM_DB_PORT": str(s.db_port),
           "ENGRAM_DB_NAME": s.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(s.auth_dev_key_path),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true", "ENGRAM_TOKEN": token}
    for name in ("database_url", "app_password"):
        if getattr(s, name):
            env[f"ENGRAM_{name.upper()}"] = getattr(s, name)
    return env


ENGRAM = str(Path(sys.executable).with_name("engram"))


def wait_until_warm(log_path: Path, proc: Any = None, timeout_s: float = 180.0) -> str:
    """The server's stderr once it says its models are loaded and every recall stage warmed,
    which it does on its own before any tool call (``mcp.warm_in_background``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        said = log_path.read_text(errors="replace")
        if "MCP ready:" in said:
            return said
        assert "did not load" not in said, said
        assert proc is None or proc.poll() is None, said
        assert time.monotonic() < deadline, f"no warm-up line after {timeout_s:.0f} s: {said}"
        time.sleep(0.2)


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if isinstance(content, dict) else content
    return json.loads(result.content[0].text)


def test_tools_over_stdio(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                          admin_engine: Engine, tmp_path: Path) -> None:
    t = tenant_factory("team")
    writer = api_server.token(t.org_id, "agent", ("write:team",))
    api_server.gql(writer, """mutation { upsertDocument(input: {collection: "notes", path: "a.md",
        title: "Alpha", body: "Alpha body.", scopes: ["team"]}) { created } }""")
    acme = api_server.gql(writer, 'mutation { resolveEntity(type: "org", name: "Acme", '
                                  'scopes: ["team"]) }')["resolveEntity"]
    params = StdioServerParameters(command=ENGRAM, args=["mcp"], env=server_env(api_server, writer))

    errlog = tmp_path / "mcp-stderr.txt"

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with errlog.open("w") as err:
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write) as client:
                await client.initialize()
                # The models load and every recall stage warms before the agent asks anything.
                await anyio.to_thread.run_sync(wait_until_warm, errlog)
                await calls(client, seen)
        return seen

    async def calls(client: Any, seen: dict[str, Any]) -> None:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        seen["tools"] = tools
        seen["doc"] = payload(await client.call_tool("get_document",
                                                     {"collection": "notes", "path": "a.md"}))
        seen["search"] = payload(await client.call_tool("search_documents", {"collection": "notes"}))
        seen["remember"] = payload(await client.call_tool(
            "remember", {"session_id": "s1", "text": "Prefers tea.", "scopes": ["team"]}))
        seen["decision"] = payload(await client.call_tool("record_decision", {
            "category": "infra", "scenario": "Pick a queue", "reasoning": "rows are the queue",
            "confidence": 0.9, "scopes": ["team"]}))
        seen["bad"] = await client.call_tool("record_decision", {
            "category": "infra", "scenario": "s", "reasoning": "r", "confidence": 2.0,
            "scopes": ["team"]})
        seen["foreign"] = await client.call_tool("remember", {
            "session_id": "s1", "text": "x", "scopes": ["nosuch"]})
        seen["fact"] = payload(await client.call_tool("assert_fact", {
            "subject_id": acme, "predicate": "headcount", "text": "Acme has 40 people",
            "scopes": ["team"], "value": "40"}))
        for as_of, value in (("2025-01-01T00:00:00+00:00", "50"), ("2026-01-01T00:00:00+00:00", "55")):
            seen[f"keyed {value}"] = payload(await client.call_tool("assert_fact", {
                "subject_id": acme, "predicate": "headcount", "text": f"Acme has {value} people",
                "scopes": ["team"], "value": value, "fact_key": "acme.headcount", "as_of": as_of,
                "authority": 10}))
        seen["half keyed"] = await client.call_tool("assert_fact", {
            "subject_id": acme, "predicate": "headcount", "text": "x", "scopes": ["team"],
            "value": "1", "fact_key": "acme.headcount"})
        seen["recall"] = payload(await client.call_tool("recall", {"question": "alpha body"}))
        seen["used"] = payload(await client.call_tool("mark_used", {
            "items": [{"table": e["item_table"], "id": e["item_id"]}
                      for e in seen["recall"]["evidence"][:1]],
            "claim_ids": [seen["keyed 55"]["claim_id"]]}))
        seen["unused"] = await client.call_tool("mark_used", {
            "claim_ids": ["00000000-0000-4000-8000-000000000000"]})
        seen["prepare"] = await client.call_tool("memory_prepare", {"question": "alpha body",
                                                                    "budget_tokens": 400})

    seen = anyio.run(session)
    assert {"recall", "memory_prepare", "remember", "assert_fact", "record_decision",
            "search_documents", "get_document", "mark_used"} <= seen["tools"]
    assert seen["doc"]["title"] == "Alpha" and seen["doc"]["body"] == "Alpha body."
    assert [d["path"] for d in seen["search"]["documents"]] == ["a.md"]
    assert seen["remember"] and seen["decision"]
    assert seen["bad"].is_error and "BAD_USER_INPUT" in seen["bad"].content[0].text
    assert seen["foreign"].is_error and "unknown scope" in seen["foreign"].content[0].text
    assert seen["recall"]["evidence"][0]["text"] == "Alpha body."
    assert seen["recall"]["evidence"][0]["kind"] == "excerpt"
    prepared = payload(seen["prepare"])
    assert "## Relevant evidence" in prepared["rendered"] and "Alpha body." in prepared["rendered"]
    assert prepared["evidence"][0]["text"] == "Alpha body."
    assert [d["path"] for d in prepared["documents"]] == ["a.md"]
    assert prepared["used_tokens"] <= 400
    assert seen["fact"]["claim_id"] and not seen["fact"]["quarantined"]
    assert seen["keyed 50"]["claim_id"] and seen["keyed 55"]["claim_id"]
    half = seen["half keyed"]
    assert half.is_error and "needs both fact_key and as_of" in half.content[0].text
    assert seen["used"] == 2
    unused = seen["unused"]
    assert unused.is_error and ": NOT_FOUND: no knowledge.fact_claim" in unused.content[0].text
    c = counts(admin_engine, t.id)
    assert (c["memory.working_memory"], c["memory.decisions"], c["knowledge.fact_claim"]) == (1, 1, 3)
    # The keyed fact with the newest as_of is current, and beats the prose claim.
    facts = api_server.gql(writer, "query($e: ID!) { facts(entityId: $e) { objectValue factKey } }",
                           {"e": acme})["facts"]
    assert facts == [{"objectValue": "55", "factKey": "acme.headcount"}]
    with admin_engine.connect() as conn:
        ledger = conn.execute(text("select channel, item_table from memory.usage_ledger "
                                   "where tenant_id = :t and operation = 'mark_used' order by 2"),
                              {"t": t.id}).all()
    assert [tuple(r) for r in ledger] == [("mcp", "knowledge.fact_claim"), ("mcp", "sources.documents")]


def test_stdio_refuses_a_token_once_it_expires(api_server: ApiServer,  # noqa: F811
                                               tenant_factory: Tenants, admin_engine: Engine) -> None:
    t = tenant_factory("team")
    remember = {"session_id": "s1", "text": "Prefers tea.", "scopes": ["team"]}

    async def session(params: StdioServerParameters, expires: float) -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            before = await client.call_tool("remember", remember)
            # The same process, later: the token has expired since the server started.
            await anyio.sleep(max(0.0, expires - time.time()) + 1.5)
            return before, await client.call_tool("remember", remember)

    # A short-lived token, longer ones only if the machine was too slow to start `engram mcp`
    # (and make its first call) before the short one expired.
    for ttl in (6, 20, 60):
        token = api_server.token(t.org_id, "agent", ("write:team",), ttl_s=ttl)
        expires = time.time() + ttl
        env = {**server_env(api_server, token), "ENGRAM_AUTH_LEEWAY_S": "0"}
        try:
            before, after = anyio.run(session, StdioServerParameters(command=ENGRAM, args=["mcp"],
                                                                     env=env), expires)
        except Exception:  # `engram mcp` refused the token at start: it had expired already
            if ttl == 60:
                raise
            continue
        if not (before.is_error and "expired" in before.content[0].text):
            break
    assert not before.is_error, before.content
    message = after.content[0].text
    # The SDK puts "Error executing tool remember: " before the tool's own text.
    assert after.is_error and ": UNAUTHENTICATED: " in message and "expired" in message
    assert "restart `engram mcp` with a fresh token" in message
    assert counts(admin_engine, t.id)["memory.working_memory"] == 1


def test_a_database_error_at_commit_is_a_coded_tool_error(api_server: ApiServer,  # noqa: F811
                                                          tenant_factory: Tenants, app_engine: Engine,
                                                          admin_engine: Engine) -> None:
    from mcp import Client
    from sqlalchemy import text as sql

    from orchestrator.api.mcp import build_server
    from orchestrator.auth.tokens import TokenVerifier
    from orchestrator.client import Engram

    class AtCommit(Engram):
        """Names an activity that does not exist: the chain's deferred trigger refuses at COMMIT."""

        @contextmanager
        def session(self) -> Iterator[Session]:
            with super().session() as s:
                s.execute(sql("select set_config('engram.activity_id', :a, true)"),
                          {"a": "00000000-0000-4000-8000-000000000001"})
                yield s

    t = tenant_factory("team")
    token = api_server.token(t.org_id, "agent", ("write:team",))
    verifier = TokenVerifier.from_settings(api_server.settings)
    server = build_server(lambda: AtCommit(app_engine, token, api_server.settings, verifier=verifier))

    async def call() -> Any:
        async with Client(server) as client:
            return await client.call_tool("remember", {"session_id": "s", "text": "t", "scopes": ["team"]})

    result = anyio.run(call)
    assert result.is_error
    assert ": BAD_USER_INPUT: engram.activity_id" in result.content[0].text, result.content
    assert counts(admin_engine, t.id)["memory.working_memory"] == 0


def test_a_bad_token_stops_the_server_before_it_answers(api_server: ApiServer) -> None:  # noqa: F811
    proc = subprocess.run([ENGRAM, "mcp"], env=server_env(api_server, "not-a-token"),
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a well-formed JWT" in proc.stderr and proc.stdout == ""


def test_streamable_http_needs_a_bearer_token_per_request(api_server: ApiServer,  # noqa: F811
                                                          tenant_factory: Tenants,
                                                          admin_engine: Engine,
                                                          tmp_path: Path) -> None:
    t, other = tenant_factory("team"), tenant_factory("team")
    writer = api_server.token(t.org_id, "agent", ("write:team",))
    api_server.gql(writer, """mutation { upsertDocument(input: {collection: "notes", path: "h.md",
        title: "Over HTTP", body: "Served by streamable HTTP.", scopes: ["team"]}) { created } }""")
    port = free_port()
    env = server_env(api_server, "")
    env.pop("ENGRAM_TOKEN")
    errlog = tmp_path / "mcp-http-stderr.txt"
    with errlog.open("w") as err:
        proc = subprocess.Popen([ENGRAM, "mcp", "--http", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_until_warm(errlog, proc)
        deadline = time.monotonic() + 60
        while True:
            try:
                refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "engram mcp --http did not start"
                time.sleep(0.2)
        assert refused.status_code == 401
        forged = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=5,
                            headers={"authorization": f"Bearer {writer[:-4]}AAAA"})
        assert forged.status_code == 401

        async def call(token: str, tool: str, arguments: dict[str, Any]) -> Any:
            # Long: the first recall loads the embedding model in the server.
            async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"},
                                          timeout=180) as http, \
                    streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write) as client:
                await client.initialize()
                return await client.call_tool(tool, arguments)

        def fetch(token: str) -> Any:
            return payload(anyio.run(call, token, "get_document", {"collection": "notes", "path": "h.md"}))

        assert fetch(writer)["title"] == "Over HTTP"
        # Another tenant's token over the same server sees nothing of it.
        stranger = api_server.token(other.org_id, "m", ("write:team",))
        assert fetch(stranger) is None
        remembered = payload(anyio.run(call, writer, "remember", {
            "session_id": "h1", "text": "Prefers streamable HTTP.", "scopes": ["team"]}))
        found = payload(anyio.run(call, writer, "recall", {"question": "What about streamable HTTP?",
                                                            "mode": "timeline"}))
        assert remembered in {e["item_id"] for e in found["evidence"]}
        assert "Served by streamable HTTP." in found["rendered"]
        theirs = payload(anyio.run(call, stranger, "recall", {"question": "What about streamable HTTP?"}))
        assert "streamable" not in str(theirs).lower()
        refused = anyio.run(call, writer, "recall", {"question": "x", "mode": "sideways"})
        assert refused.is_error
        assert ": BAD_USER_INPUT: invalid recall: unknown mode" in refused.content[0].text
        assert counts(admin_engine, t.id)["memory.working_memory"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)
