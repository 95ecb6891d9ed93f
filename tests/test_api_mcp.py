"""MCP tools over stdio with the SDK's real client session against ``engram mcp``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import Engine

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


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if isinstance(content, dict) else content
    return json.loads(result.content[0].text)


def test_tools_over_stdio(api_server: ApiServer, tenant_factory: Tenants,  # noqa: F811
                          admin_engine: Engine) -> None:
    t = tenant_factory("team")
    writer = api_server.token(t.org_id, "agent", ("write:team",))
    api_server.gql(writer, """mutation { upsertDocument(input: {collection: "notes", path: "a.md",
        title: "Alpha", body: "Alpha body.", scopes: ["team"]}) { created } }""")
    params = StdioServerParameters(command=ENGRAM, args=["mcp"], env=server_env(api_server, writer))

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
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
            seen["recall"] = payload(await client.call_tool("recall", {"question": "alpha body"}))
            seen["prepare"] = await client.call_tool("memory_prepare", {"question": "alpha body",
                                                                        "budget_tokens": 400})
        return seen

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
    prepared = seen["prepare"].content[0].text
    assert not seen["prepare"].is_error and "## Relevant evidence" in prepared and "Alpha body." in prepared
    c = counts(admin_engine, t.id)
    assert (c["memory.working_memory"], c["memory.decisions"]) == (1, 1)


def test_a_bad_token_stops_the_server_before_it_answers(api_server: ApiServer) -> None:  # noqa: F811
    proc = subprocess.run([ENGRAM, "mcp"], env=server_env(api_server, "not-a-token"),
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a well-formed JWT" in proc.stderr and proc.stdout == ""


def test_streamable_http_needs_a_bearer_token_per_request(api_server: ApiServer,  # noqa: F811
                                                          tenant_factory: Tenants) -> None:
    t, other = tenant_factory("team"), tenant_factory("team")
    writer = api_server.token(t.org_id, "agent", ("write:team",))
    api_server.gql(writer, """mutation { upsertDocument(input: {collection: "notes", path: "h.md",
        title: "Over HTTP", body: "Served by streamable HTTP.", scopes: ["team"]}) { created } }""")
    port = free_port()
    env = server_env(api_server, "")
    env.pop("ENGRAM_TOKEN")
    proc = subprocess.Popen([ENGRAM, "mcp", "--http", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
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

        async def fetch(token: str) -> Any:
            async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http, \
                    streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write) as client:
                await client.initialize()
                return payload(await client.call_tool("get_document",
                                                      {"collection": "notes", "path": "h.md"}))

        assert anyio.run(fetch, writer)["title"] == "Over HTTP"
        # Another tenant's token over the same server sees nothing of it.
        assert anyio.run(fetch, api_server.token(other.org_id, "m", ("read:team",))) is None
    finally:
        proc.terminate()
        proc.wait(timeout=20)
