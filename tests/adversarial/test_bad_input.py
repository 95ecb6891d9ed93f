"""Bad-input matrix: every argument of every GraphQL field (and every field of every input object),
every MCP tool parameter and the command line, each given each bad value its type can meet (NUL,
lone surrogates, huge, negative, out of range, NaN/Infinity, deep nesting, wrong types). The
answer is a clear code, never INTERNAL or an HTTP 500, and a refused write changes nothing.

The matrix is built from the schema and the MCP server's tool list, so a new field, argument or
tool is in it without an edit here.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
from sqlalchemy import Engine
from typer.testing import CliRunner

from graphql import (
    GraphQLField,
    GraphQLInputObjectType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLType,
    get_named_type,
)
from orchestrator.api.mcp import build_server
from orchestrator.api.schema import build_schema
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.client import Engram
from tests.adversarial.figures import record
from tests.adversarial.snapshot import changed, snapshot
from tests.conftest import TenantFixture
from tests.support.api import ApiServer

COMBINATIONS = 2  # random multi-argument cases per field, from the run's seed
CLEAR = {"BAD_USER_INPUT", "NOT_FOUND", "FORBIDDEN", "CONFLICT", "UNAUTHENTICATED"}
DEEP = json.loads("[" * 100 + "]" * 100)
NAN, INF = "__NaN__", "__Infinity__"  # written into the body as bare NaN / Infinity
# One value of each kind a type can meet; a huge value is tried once per field (HUGE).
BAD: dict[str, list[Any]] = {
    "String": ["a\x00b", "x\ud800y", 12],
    "ID": ["a\x00b", "\ud800", "not-a-uuid", 12],
    "Int": [2**31, -1, "12", NAN, 10**30],
    "Float": [NAN, INF, "x", 10**400],
    "Boolean": ["true"],
    "DateTime": ["yesterday", "99999-01-01T00:00:00Z", "2024-01-01T00:00:00", "\x00"],
    "JSON": [DEEP, {"a": "\x00"}, {"\ud800": 1}, NAN],
}
HUGE = "x" * 300_000  # over the test server's body limit: a 413 before anything runs
GOOD: dict[str, Any] = {"String": "text", "ID": str(uuid.UUID(int=1)), "Int": 5, "Float": 0.5,
                        "Boolean": True, "DateTime": "2024-01-01T00:00:00Z", "JSON": {"id": "x"}}
# Values that must be valid for a call to reach its resolver at all.
VALID: dict[str, Any] = {"scopes": ["board"], "question": "What happened?", "table": "sources.documents",
                         "strategy": "keep_both", "startedAt": "2024-01-01T00:00:00Z",
                         "endedAt": "2024-01-01T01:00:00Z", "predicate": "note", "confidence": 0.5}


def _json(value: Any) -> bytes:
    """``value`` as a request body: NAN and INF as bare NaN and Infinity, lone surrogates
    as they are."""
    text = json.dumps(value).replace(f'"{NAN}"', "NaN").replace(f'"{INF}"', "Infinity")
    return text.encode("utf-8", "surrogatepass")


def _body(query: str, variables: dict[str, Any]) -> bytes:
    return _json({"query": query, "variables": variables})


def good(name: str, type_: GraphQLType) -> Any:
    named = get_named_type(type_)
    if isinstance(named, GraphQLInputObjectType):
        return {k: good(k, f.type) for k, f in named.fields.items() if isinstance(f.type, GraphQLNonNull)}
    value = VALID.get(name, GOOD.get(named.name, "text"))
    inner = type_.of_type if isinstance(type_, GraphQLNonNull) else type_
    if isinstance(inner, GraphQLList) and not isinstance(value, list):
        return [value]
    return value


def cases(field_name: str, field: GraphQLField, rng: random.Random
          ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what, arguments) with one argument, or one field of one input object, made bad; then a
    few random combinations of several bad arguments at once."""
    base = {a: good(a, d.type) for a, d in field.args.items()}
    scalar = [a for a, d in field.args.items() if isinstance(get_named_type(d.type), GraphQLScalarType)]
    text = [a for a in scalar if get_named_type(field.args[a].type).name == "String"]
    if text:
        yield f"{field_name}.{text[0]} (huge)", base | {text[0]: HUGE}
    for _ in range(COMBINATIONS if len(scalar) > 1 else 0):
        chosen = rng.sample(scalar, rng.randint(2, len(scalar)))
        yield f"{field_name}({', '.join(chosen)})", base | {
            a: rng.choice(BAD[get_named_type(field.args[a].type).name]) for a in chosen}
    for arg, definition in field.args.items():
        named = get_named_type(definition.type)
        if isinstance(named, GraphQLInputObjectType):
            for key, f in named.fields.items():
                for bad in BAD.get(get_named_type(f.type).name, []):
                    yield f"{field_name}.{arg}.{key}", base | {arg: {**base[arg], key: bad}}
            continue
        if isinstance(named, GraphQLScalarType):
            values = list(BAD.get(named.name, []))
            if isinstance(definition.type, GraphQLNonNull):
                values.append(None)
            for bad in values:
                yield f"{field_name}.{arg}", base | {arg: bad}
            listed = definition.type
            if isinstance(listed, GraphQLNonNull):
                listed = listed.of_type
            if isinstance(listed, GraphQLList):
                yield f"{field_name}.{arg}[]", base | {arg: [None]}
                yield f"{field_name}.{arg}[5000]", base | {arg: [good(arg, named)] * 5000}


def operation(kind: str, name: str, field: GraphQLField) -> str:
    decl = ", ".join(f"${a}: {d.type}" for a, d in field.args.items())
    args = ", ".join(f"{a}: ${a}" for a in field.args)
    selection = " { __typename }" if isinstance(get_named_type(field.type), GraphQLObjectType) else ""
    return f"{kind}{f'({decl})' if decl else ''} {{ {name}{f'({args})' if args else ''}{selection} }}"


def test_every_argument_gets_a_clear_code_and_a_refused_write_changes_nothing(
        seed: int, api_server: ApiServer, tenant_factory: Callable[..., TenantFixture],
        admin_engine: Engine, app_engine: Engine) -> None:
    t = tenant_factory("board", org_prefix="advb")
    token = api_server.token(t.org_id, "w", ("write:board", "engram:auditor"))
    schema = build_schema()
    rng = random.Random(seed ^ 0xB)
    failures: list[str] = []
    requests = refused = 0
    for kind, root in (("query", schema.query_type), ("mutation", schema.mutation_type)):
        assert root is not None
        for name, field in root.fields.items():
            query = operation(kind, name, field)
            # One snapshot around all of a field's cases: when every one was refused, none may
            # have changed anything.
            before = snapshot(admin_engine, t.id)
            landed = 0
            for what, variables in cases(name, field, rng):
                requests += 1
                response = httpx.post(f"{api_server.url}/graphql", content=_body(query, variables),
                                      headers={"authorization": f"Bearer {token}",
                                               "content-type": "application/json"}, timeout=120)
                body = response.json()
                codes = {e.get("extensions", {}).get("code") for e in body.get("errors") or []}
                refused += bool(codes)
                landed += not codes
                if response.status_code >= 500 or not codes <= CLEAR:
                    failures.append(f"{what} = {json.dumps(variables, default=str)[:120]}: "
                                    f"{response.status_code} {json.dumps(body)[:240]}")
            after = snapshot(admin_engine, t.id)
            if not landed and after != before:
                failures.append(f"{name}: every call was refused, yet {changed(before, after)} changed")
    mcp_requests, mcp_failures = _mcp_matrix(api_server, app_engine, t, token, admin_engine)
    rest_requests, rest_failures = _rest_matrix(api_server, t, token, admin_engine)
    cli_requests, cli_failures = _cli_matrix()
    record("bad input", graphql_requests=requests, graphql_refused=refused, mcp_calls=mcp_requests,
           rest_requests=rest_requests, cli_runs=cli_requests,
           internal_or_500=len(failures) + len(mcp_failures) + len(rest_failures)
           + len(cli_failures))
    problems = failures + mcp_failures + rest_failures + cli_failures
    assert not problems, f"{len(problems)} (seed {seed}):\n" + "\n".join(problems[:40])


# --- REST: every field of the prepare body, and bodies no field can fix ----------------

REST_BAD: dict[type, list[Any]] = {str: ["a\x00b", "x\ud800y", 12, DEEP, NAN],
                                   int: ["12", 2**31, -1, 10**30, NAN, INF, 0.5, True]}
REST_BODIES = [b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000, b"{bad",
               b'{"question": "\xff"}', b"[]", b"null", b'"question"', b""]


def _rest_matrix(server: ApiServer, t: TenantFixture, token: str, admin_engine: Engine
                 ) -> tuple[int, list[str]]:
    """``POST /api/v1/memory/prepare`` (built from ``rest.FIELDS``, so a new field is in it):
    each field given each bad value of its type, then bodies that are not a recall at all.
    Each is a 4xx with a clear code (never a 500), and nothing is written."""
    from orchestrator.api.rest import FIELDS, PREPARE_PATH

    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    bodies = [(f"{name} = {bad!r:.40}", _json({"question": "What happened?", name: bad}))
              for name, (_, types) in FIELDS.items() for bad in REST_BAD[types[0]]]
    bodies += [(f"body {raw[:30]!r}", raw) for raw in REST_BODIES]
    before = snapshot(admin_engine, t.id)
    failures = []
    for what, raw in bodies:
        response = httpx.post(f"{server.url}{PREPARE_PATH}", content=raw, headers=headers,
                              timeout=120)
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if not 400 <= response.status_code < 500 or code not in CLEAR:
            failures.append(f"rest {what}: {response.status_code} {response.text[:200]}")
    after = snapshot(admin_engine, t.id)
    if after != before:
        failures.append(f"rest: every call was refused, yet {changed(before, after)} changed")
    return len(bodies), failures


# --- MCP: every parameter of every tool ------------------------------------------------

MCP_GOOD = {"string": "text", "integer": 5, "number": 0.5, "boolean": True, "array": [], "object": {}}
MCP_VALID = {"question": "What happened?", "scopes": ["board"], "session_id": "s",
             "subject_id": str(uuid.UUID(int=1)), "predicate": "note", "confidence": 0.5,
             "collection": "notes", "path": "p.md", "category": "c", "scenario": "s",
             "reasoning": "r", "text": "t"}
MCP_BAD = ["a\x00b", "x\ud800", float("nan"), 2**40, DEEP]


def _schema_type(spec: dict[str, Any]) -> str:
    if "type" in spec:
        return str(spec["type"])
    for option in spec.get("anyOf", []):
        if option.get("type") != "null":
            return str(option.get("type", "string"))
    return "string"


def _mcp_matrix(server: ApiServer, app_engine: Engine, t: TenantFixture, token: str,
                admin_engine: Engine) -> tuple[int, list[str]]:
    verifier = TokenVerifier.from_settings(server.settings)
    mcp = build_server(lambda: Engram(app_engine, token, server.settings, verifier=verifier, channel="mcp"))
    tools = anyio.run(mcp.list_tools)
    calls, failures = 0, []
    for tool in tools:
        props: dict[str, Any] = tool.input_schema.get("properties", {})
        required = tool.input_schema.get("required", [])
        base = {k: MCP_VALID.get(k, MCP_GOOD.get(_schema_type(props[k]), "text")) for k in required}
        before, landed = snapshot(admin_engine, t.id), 0
        for param in props:
            for bad in MCP_BAD:
                calls += 1
                try:
                    anyio.run(mcp.call_tool, tool.name, base | {param: bad})
                    landed += 1
                except Exception as exc:
                    # After the SDK's prefix, Engram's code: a value of the wrong type too
                    # (refused by the tool's input schema before the tool runs).
                    code = str(exc).removeprefix(f"Error executing tool {tool.name}: ")
                    if (type(exc).__name__ == "UnexpectedToolError"
                            or code.split(":", 1)[0] not in CLEAR):
                        failures.append(f"mcp {tool.name}.{param} = {bad!r:.60}: {exc!r:.300}")
        after = snapshot(admin_engine, t.id)
        if not landed and after != before:
            failures.append(f"mcp {tool.name}: every call was refused, yet {changed(before, after)} "
                            "changed")
    return calls, failures


# --- the command line: a value no command could use is refused before any runs -----------

CLI = [["recall", "{}"], ["prepare", "{}"], ["trace", "{}"], ["remember", "{}", "--scopes", "a"],
       ["ingest", "{}"], ["admin", "create-tenant", "{}"], ["admin", "create-scope", "o", "{}"],
       ["audit", "lineage", "--tenant", "o", "sources.documents", "{}"], ["audit", "receipt", "{}"],
       ["derive", "all", "--org", "{}"], ["auth", "token", "--org", "{}"]]


def _cli_matrix() -> tuple[int, list[str]]:
    from orchestrator.cli.main import app

    runs, failures = 0, []
    for template in CLI:
        for bad in ("a\x00b", "caf\udce9", "\ud800"):
            args = [a.replace("{}", bad) for a in template]
            result = CliRunner().invoke(app, args)
            runs += 1
            if result.exit_code != 2 or "error:" not in result.output:
                failures.append(f"cli {' '.join(template)} with {bad!r}: exit {result.exit_code} "
                                f"{result.output[:200]!r} {result.exception!r}")
    return runs, failures

