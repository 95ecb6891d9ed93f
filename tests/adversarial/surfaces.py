"""Every read surface, as one function each, registered by name.

A surface takes a ``Probe`` (one identity, its token, the world, ways to call the API, MCP and
the command line) and makes its calls through it; the probe keeps every exchange (what was
sent, what came back, as text). The isolation fuzz runs every registered surface for every
random identity and looks in each answer for words and ids of rows that identity cannot read
(what the caller sent itself, echoed back, is cut out first: ``without_echo``).

Adding a surface is one registration, e.g. for a GraphQL ``recallTrace`` field::

    register("graphql recallTrace", lambda p: [p.gql(
        "query($q: String!) { recallTrace(question: $q) { text } }", {"q": p.question})])

(a REST route: ``p.http("POST", "/api/v1/memory/prepare", json={...})``; an MCP tool:
``p.mcp("tool_name", {...})``; a console page: ``p.http("GET", "/console/...")``). A surface that
shows auditors the keys of every row of their tenant by design passes ``metadata=True``: then
only secret words and other tenants' ids count as leaks there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from mcp.server.mcpserver import MCPServer
from typer.testing import CliRunner

from orchestrator.auth import Identity
from tests.adversarial.world import World
from tests.support.api import ApiServer


@dataclass
class Probe:
    world: World
    identity: Identity
    token: str
    server: ApiServer
    mcp_server: MCPServer[Any]
    cli_env: dict[str, str]
    question: str
    internal: list[str] = field(default_factory=list)  # INTERNAL errors or HTTP 500s met
    # (what was sent, what came back) of every call, in order: the caller's own input echoed
    # back (a question naming someone, an id asked for) is not a leak.
    exchanges: list[tuple[Any, str]] = field(default_factory=list)

    def _seen(self, sent: Any, shown: str) -> str:
        self.exchanges.append((sent, shown))
        return shown

    def http(self, method: str, path: str, **kw: Any) -> str:
        response = httpx.request(method, f"{self.server.url}{path}",
                                 headers={"authorization": f"Bearer {self.token}"}, timeout=180, **kw)
        if response.status_code >= 500 or '"INTERNAL"' in response.text:
            self.internal.append(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return self._seen([method, path, kw], response.text)

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> str:
        return self.http("POST", "/graphql", json={"query": query, "variables": variables or {}})

    def gql_data(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        return json.loads(self.gql(query, variables)).get("data")

    def mcp(self, tool: str, arguments: dict[str, Any]) -> str:
        try:
            result = anyio.run(self.mcp_server.call_tool, tool, arguments)
        except Exception as exc:  # a coded refusal is an answer too; a crash is not
            if "INTERNAL" in str(exc) or type(exc).__name__ == "UnexpectedToolError":
                self.internal.append(f"mcp {tool}: {exc!r}")
            return self._seen([tool, arguments], str(exc))
        dump = getattr(result, "model_dump_json", None)
        return self._seen([tool, arguments],
                          dump(by_alias=True) if dump else json.dumps(result, default=str))

    def cli(self, *args: str) -> str:
        from orchestrator.cli.main import app

        result = CliRunner().invoke(app, [*args, "--token", self.token], env=self.cli_env)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            self.internal.append(f"cli {args[0]}: {result.exception!r}")
        return self._seen(args, result.output)


LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
UUIDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
        yield from LITERAL.findall(value)  # literals written into a GraphQL query
        yield from UUIDS.findall(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)


def without_echo(sent: Any, shown: str) -> str:
    """``shown`` with every value the caller sent cut out (a question echoed in a rendering, an id
    in a NOT_FOUND message): what is left is what the server chose to show."""
    for leaf in sorted(set(_leaves(sent)), key=len, reverse=True):
        if len(leaf) >= 4:
            shown = shown.replace(leaf, " ").replace(json.dumps(leaf)[1:-1], " ")
    return shown


Surface = Callable[[Probe], Iterable[str]]


@dataclass(frozen=True)
class Registered:
    name: str
    run: Surface
    metadata: bool = False


SURFACES: dict[str, Registered] = {}


def register(name: str, run: Surface, *, metadata: bool = False) -> Surface:
    SURFACES[name] = Registered(name, run, metadata)
    return run


def surface(name: str, *, metadata: bool = False) -> Callable[[Surface], Surface]:
    def add(run: Surface) -> Surface:
        return register(name, run, metadata=metadata)
    return add


def _aliased(field_: str, calls: list[str], selection: str) -> str:
    return "{ " + " ".join(f"a{n}: {field_}({args}) {selection}" for n, args in enumerate(calls)) + " }"


def _q(value: str) -> str:
    return json.dumps(value)


EVIDENCE = """text provenance kind scopes { name description } source { collection path title }
  fact { subject predicate object epistemicKind perspectiveKey authorRole factKey asOf } author
  documentId chunkId itemTable itemId occurredAt"""
DOCUMENT = "id collection path title body kind state area contentHash author metadata chunkCount " \
           "scopes { name description canRead canWrite }"
ENTITY = "id type name aliases summary mergedInto createdBy scopes { name canRead }"
FACT = """id text subjectId predicate objectId objectValue epistemicKind author authorRole factKey
  asOf disputed beatenBy"""


def pages(probe: Probe, field_: str, selection: str, extra: str = "") -> Iterator[str]:
    """Every page of a connection (the cursors and pageInfo are read surfaces too)."""
    after: str | None = None
    for _ in range(50):
        raw = probe.gql(
            f"query($a: String) {{ c: {field_}(first: 20, after: $a{extra}) {{ edges {{ cursor node "
            f"{{ {selection} }} }} pageInfo {{ hasNextPage hasPreviousPage startCursor endCursor }} }} }}",
            {"a": after})
        yield raw
        data = json.loads(raw).get("data") or {}
        info = (data.get("c") or {}).get("pageInfo") or {}
        if not info.get("hasNextPage"):
            return
        after = info["endCursor"]


@surface("graphql me and scopes")
def _me(p: Probe) -> Iterable[str]:
    yield p.gql("{ me { orgId userId readScopes writeScopes roles } "
                "scopes { name description canRead canWrite } }")


@surface("graphql documents (every page, hidden included)")
def _documents(p: Probe) -> Iterable[str]:
    yield from pages(p, "documents", DOCUMENT, ", includeHidden: true")
    yield from pages(p, "documents", "id path")


@surface("graphql document by path (every path of the tenant)")
def _document(p: Probe) -> Iterable[str]:
    paths = p.world.tenant(p.identity.org_id).paths
    yield p.gql(_aliased("document", [f"collection: {_q(c)}, path: {_q(x)}" for c, x in paths],
                         f"{{ {DOCUMENT} }}"))


def _ids(p: Probe, table: str) -> list[str]:
    return sorted(r.id for r in p.world.rows.values() if r.table == table)


@surface("graphql documentById (every document id, other tenants' too)")
def _document_by_id(p: Probe) -> Iterable[str]:
    yield p.gql(_aliased("documentById", [f"id: {_q(i)}" for i in _ids(p, "sources.documents")],
                         f"{{ {DOCUMENT} }}"))


@surface("graphql entities (every page) and entity search")
def _entities(p: Probe) -> Iterable[str]:
    yield from pages(p, "entities", ENTITY)
    for _, name in p.world.tenant(p.identity.org_id).entities[:3]:
        yield from pages(p, "entities", "id name aliases", f", query: {_q(name.split()[0])}")


@surface("graphql entity by type and name (every name of the tenant)")
def _entity(p: Probe) -> Iterable[str]:
    names = p.world.tenant(p.identity.org_id).entities
    yield p.gql(_aliased("entity", [f"type: {_q(t)}, name: {_q(n)}" for t, n in names], ""))


@surface("graphql entityById and facts (every entity id)")
def _entity_by_id(p: Probe) -> Iterable[str]:
    ids = _ids(p, "knowledge.entities")
    for start in range(0, len(ids), 25):
        chunk = ids[start:start + 25]
        yield p.gql(_aliased("entityById", [f"id: {_q(i)}" for i in chunk], f"{{ {ENTITY} }}"))
        yield p.gql(_aliased("facts", [f"entityId: {_q(i)}, includeBeaten: true, first: 5"
                                       for i in chunk], f"{{ {FACT} }}"))


@surface("graphql conflicts, quarantine, workingMemory")
def _lists(p: Probe) -> Iterable[str]:
    yield p.gql("{ conflicts(first: 100) { id kind claimA claimB subjectId predicate status winnerId } "
                "quarantine(status: null, first: 100) { id reasons payload status releasedClaimId } "
                "workingMemory(first: 100) }")


@surface("graphql recall")
def _recall(p: Probe) -> Iterable[str]:
    yield p.gql("query($q: String!) { recall(question: $q, budgetTokens: 4000) { rendered usedTokens "
                "receiptId "
                f"evidence {{ {EVIDENCE} }} }} }}", {"q": p.question})


@surface("graphql recall, a small budget (the last item cut to a part)")
def _recall_part(p: Probe) -> Iterable[str]:
    # The part the cut's last item is cut to (recall.excerpt), its offsets and the trace's
    # budget line, which counts the item's characters.
    for raw in (p.gql("query($q: String!) { recall(question: $q, budgetTokens: 90) { rendered "
                      f"usedTokens evidence {{ {EVIDENCE} charStart charEnd clipped }} }} }}",
                      {"q": p.question}),
                p.gql("query($q: String!) { recallTrace(question: $q, budgetTokens: 90) { text } }",
                      {"q": p.question})):
        if json.loads(raw).get("errors"):  # a probe the API refuses would prove nothing
            p.internal.append(f"graphql small-budget recall refused: {raw[:300]}")
        yield raw


@surface("graphql memoryPrepare")
def _prepare(p: Probe) -> Iterable[str]:
    yield p.gql("query($q: String!) { memoryPrepare(question: $q, budgetTokens: 4000) { rendered "
                "receiptId "
                f"keyedFacts {{ {EVIDENCE} }} evidence {{ {EVIDENCE} }} lessons {{ {EVIDENCE} }} "
                f"episodes {{ {EVIDENCE} }} documents {{ id title collection path }} }} }}",
                {"q": p.question})


@surface("cli engram trace")
def _trace(p: Probe) -> Iterable[str]:
    yield p.cli("trace", p.question)


@surface("mcp whoami, recall, memory_prepare, search_documents, get_document")
def _mcp(p: Probe) -> Iterable[str]:
    yield p.mcp("whoami", {})
    yield p.mcp("recall", {"question": p.question})
    yield p.mcp("memory_prepare", {"question": p.question})
    after: str | None = None
    for _ in range(20):
        raw = p.mcp("search_documents", {"first": 20, "after": after} if after else {"first": 20})
        yield raw
        try:
            content = json.loads(raw).get("structuredContent") or {}
            after = content.get("result", content).get("next")
        except (ValueError, AttributeError):
            after = None
        if not after:
            break
    for collection, path in p.world.tenant(p.identity.org_id).paths:
        yield p.mcp("get_document", {"collection": collection, "path": path})


@surface("graphql provenance and verifyChain (auditors: keys and hashes)", metadata=True)
def _audit(p: Probe) -> Iterable[str]:
    yield p.gql("{ verifyChain(rows: false) { ok checked headSeq problem rowProblems } }")
    for table in ("sources.documents", "knowledge.fact_claim", "memory.profiles"):
        for rid in _ids(p, table)[:3]:
            yield p.gql("query($t: String!, $r: JSON!) { provenance(table: $t, rowId: $r, maxDepth: 5) "
                        "{ proven nodes { table rowId eventSeqs } edges { relation derivedTable "
                        "derivedRowId sourceTable sourceRowId depth eventSeq } } }",
                        {"t": table, "r": {"id": rid}})


# -- surfaces added with the console, the ranking and production rounds ----------------------

CONSOLE_COOKIE = "engram_console"


def console(p: Probe, path: str, **params: Any) -> str:
    """A console page as the probe's identity (the console reads its token from a cookie)."""
    return p.http("GET", path, params=params or None, cookies={CONSOLE_COOKIE: p.token})


@surface("graphql recallTrace (the full plan, a study shape, the trace as text)")
def _recall_trace(p: Probe) -> Iterable[str]:
    from orchestrator.console.queries import TRACE

    for shape in ("full", "bm25-only"):
        yield p.gql(f"query($q: String!, $s: String) {{ recallTrace(question: $q, shape: $s) "
                    f"{{ {TRACE} text }} }}", {"q": p.question, "s": shape})


@surface("graphql claim (every claim id), keyedFacts, derivedItems")
def _claims(p: Probe) -> Iterable[str]:
    ids = _ids(p, "knowledge.fact_claim")
    for start in range(0, len(ids), 25):
        yield p.gql(_aliased("claim", [f"id: {_q(i)}" for i in ids[start:start + 25]],
                             f"{{ {FACT} }}"))
    yield p.gql(f"{{ keyedFacts(first: 100) {{ {FACT} }} }}")
    yield p.gql("{ derivedItems(first: 100) { table id kind text scopes { name } createdAt } }")


@surface("graphql readableLineage (every document and entity id, both directions)")
def _readable_lineage(p: Probe) -> Iterable[str]:
    for table in ("sources.documents", "knowledge.entities", "knowledge.fact_claim"):
        ids = _ids(p, table)[:20]
        for direction in ("back", "forward"):
            yield p.gql(_aliased("readableLineage", [
                f"table: {_q(table)}, id: {_q(i)}, direction: {_q(direction)}" for i in ids],
                "{ nodes { table id label } "
                "edges { relation derivedTable derivedId sourceTable sourceId depth } }"))


@surface("graphql operations: embedQueue, models, recallLatency, documentValue, deriveRuns")
def _operations(p: Probe) -> Iterable[str]:
    yield p.gql("{ embedQueue { tables { table pending failed ready lastHour lastError } "
                "series { at depth embedded } } }")
    yield p.gql("{ models { embeddingModel registry { name dimension active } reranker loaded } }")
    yield p.gql("{ recallLatency { count p50 p95 buckets { le count } } }")
    yield p.gql("{ documentValue(days: 30, first: 50) { id title collection path uses marks days } }")
    yield p.gql("{ deriveRuns(first: 50) { job ok source summary error } }")


@surface("rest POST /api/v1/memory/prepare")
def _rest_prepare(p: Probe) -> Iterable[str]:
    answer = p.http("POST", "/api/v1/memory/prepare",
                    json={"question": p.question, "budgetTokens": 4000})
    # A refusal sees nothing to leak: the probe sent "budget_tokens" and got one, unnoticed.
    assert '"rendered"' in answer, answer[:300]
    yield answer


@surface("console pages (recall workbench, memory browser, operations, charts)")
def _console(p: Probe) -> Iterable[str]:
    yield console(p, "/console/recall", question=p.question, shape="bm25-only")
    yield console(p, "/console/memory/documents")
    for doc in _ids(p, "sources.documents"):
        yield console(p, f"/console/memory/documents/{doc}")
    yield console(p, "/console/memory/entities")
    for ent in _ids(p, "knowledge.entities"):
        yield console(p, f"/console/memory/entities/{ent}")
    for doc in _ids(p, "sources.documents")[:10]:
        yield console(p, "/console/memory/lineage", table="sources.documents", id=doc,
                      direction="forward")
    for page in ("keyed", "conflicts", "quarantine", "derived"):
        yield console(p, f"/console/memory/{page}")
    yield console(p, "/console/operations")
    yield console(p, "/console/charts")


@surface("console audit pages (auditors: keys and hashes)", metadata=True)
def _console_audit(p: Probe) -> Iterable[str]:
    yield console(p, "/console/audit")
    for doc in _ids(p, "sources.documents")[:5]:
        yield console(p, "/console/audit/lineage", table="sources.documents", id=doc)


@surface("mcp trace, entities, facts, conflicts, quarantine, session notes")
def _mcp_more(p: Probe) -> Iterable[str]:
    yield p.mcp("trace", {"question": p.question})
    yield p.mcp("search_entities", {"first": 100})
    for entity_type, name in p.world.tenant(p.identity.org_id).entities:
        yield p.mcp("entity", {"entity_type": entity_type, "name": name})
    for ent in _ids(p, "knowledge.entities")[:30]:
        yield p.mcp("facts", {"entity_id": ent, "include_beaten": True})
    yield p.mcp("conflicts", {})
    yield p.mcp("quarantine", {"status": None})
    yield p.mcp("session_notes", {})


@surface("cli engram recall and prepare")
def _cli_recall(p: Probe) -> Iterable[str]:
    yield p.cli("recall", p.question, "--local")
    yield p.cli("prepare", p.question, "--local")
