"""The HTTP face of the API: a Starlette app that uvicorn serves.

One request is one transaction: the bearer token is verified (in a thread of its
own pool: a JWKS fetch blocks), the identity is bound with ``bound_session``, the
GraphQL operation runs in a thread of the operations pool (``api_threads``;
SQLAlchemy is synchronous, the event loop stays free), and the transaction
commits only when the operation produced no error. A mutation that fails in any
field therefore writes nothing, and its response carries ``data: null``.

Status codes: 401 for a token that does not verify (with ``WWW-Authenticate``),
403 for a genuine token that grants nothing here (no organization, a tenant or
scope the database does not know), 413 for a body or query over the limits,
400 for unreadable JSON and for queries refused by validation (depth, cost),
200 for executed operations, whose errors carry ``extensions.code``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anyio import CapacityLimiter, fail_after, to_thread
from ariadne import graphql_sync
from ariadne.explorer import ExplorerGraphiQL
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from orchestrator.api.audit import AuditorEngine
from orchestrator.api.health import READY_PROBE_S, Warmup, readiness
from orchestrator.api.prepared import PreparedQueries
from orchestrator.api.schema import RequestContext, build_schema, format_error, validation_rules
from orchestrator.auth import Identity
from orchestrator.auth.tokens import TokenVerifier, bearer_token
from orchestrator.config import Settings
from orchestrator.db.session import bound_session
from orchestrator.errors import (
    STATUS_BY_CODE,
    BadInput,
    EngramError,
    Forbidden,
    Unauthenticated,
    Unavailable,
    internal_message,
    is_public,
)
from orchestrator.health import Health
from orchestrator.inputs import parse_json
from orchestrator.recall import Recaller

# Seconds a client should wait before retrying an UNAVAILABLE answer.
RETRY_AFTER_S = 2


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="engram", error="invalid_token"'
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return JSONResponse({"data": None, "errors": [{"message": message, "extensions": {"code": code}}]},
                        status_code=status, headers=headers)


class _ExpectedErrors(logging.Filter):
    """Keeps refusals the client is told about (Engram's own errors, validation) out of the
    error log; unexpected exceptions are still logged, by ``format_error`` with a reference."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


GRAPHQL_LOG = logging.getLogger("engram.api.graphql")
GRAPHQL_LOG.addFilter(_ExpectedErrors())


class _Rollback(Exception):
    """Leaves ``bound_session`` without committing, carrying the response to send."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("rollback")
        self.result = result


class _Refused(Exception):
    def __init__(self, error: EngramError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class ApiConfig:
    settings: Settings
    engine: Engine
    verifier: TokenVerifier
    recaller: Recaller
    auditor_engine: AuditorEngine = field(init=False)
    prepared: PreparedQueries = field(default_factory=PreparedQueries)

    def __post_init__(self) -> None:
        self.auditor_engine = AuditorEngine(self.settings)

    @property
    def introspection(self) -> bool:
        s = self.settings
        return s.api_introspection if s.api_introspection is not None else s.env != "production"

    @property
    def graphiql(self) -> bool:
        s = self.settings
        return s.api_graphiql if s.api_graphiql is not None else s.env != "production"


def execute(config: ApiConfig, identity: Identity, data: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Run one GraphQL request under ``identity`` in one transaction (sync; call from a thread)."""
    variables = data.get("variables") if isinstance(data.get("variables"), dict) else None
    bound = False
    try:
        with bound_session(config.engine, identity) as session:
            bound = True
            success, result = graphql_sync(
                build_schema(), data,
                context_value=RequestContext(identity, session, config.settings, config.recaller,
                                             config.auditor_engine),
                query_parser=config.prepared.parse, query_validator=config.prepared.validate,
                introspection=config.introspection,
                validation_rules=validation_rules(config.settings, variables),
                error_formatter=format_error, debug=False, logger=GRAPHQL_LOG)
            if result.get("errors"):
                raise _Rollback(result)
            return success, result
    except _Rollback as rb:
        if "data" in rb.result and _is_mutation(data):
            rb.result["data"] = None
        return False, rb.result
    except EngramError as exc:
        if not bound:
            # Binding refused the identity (an unknown tenant or scope), or never reached the
            # database.
            raise _Refused(exc if isinstance(exc, Unauthenticated | Unavailable)
                           else Forbidden(exc.message)) from exc
        raise


def _is_mutation(data: dict[str, Any]) -> bool:
    from graphql.error import GraphQLError

    from graphql import OperationDefinitionNode, OperationType, parse

    try:
        doc = parse(data.get("query") or "")
    except GraphQLError:
        return False
    return any(isinstance(d, OperationDefinitionNode) and d.operation is OperationType.MUTATION
               for d in doc.definitions)


async def read_body(request: Request, limit: int,
                    refuse: Callable[[int, str, str], Response] = error_response
                    ) -> bytes | Response:
    """The request body, or ``refuse``'s 413 answer once it is over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return refuse(413, "BAD_USER_INPUT",
                      f"the request body is {declared} bytes; the limit is {limit}")
    body = bytearray()
    # A chunked body has no length up front: count as it arrives.
    async for part in request.stream():
        body.extend(part)
        if len(body) > limit:
            return refuse(413, "BAD_USER_INPUT",
                          f"the request body is over the limit of {limit} bytes")
    return bytes(body)


async def identity_of(request: Request, verifier: TokenVerifier, limiter: CapacityLimiter,
                      refuse: Callable[[int, str, str], Response] = error_response
                      ) -> Identity | Response:
    """The identity of the request's bearer token, or ``refuse``'s answer (401, 403). A JWKS
    fetch blocks: the token is verified in ``limiter``'s threads, never on the event loop."""
    try:
        token = bearer_token(request.headers.get("authorization"))
        identity: Identity = await to_thread.run_sync(verifier.verify, token, limiter=limiter)
    except EngramError as exc:
        return refuse(STATUS_BY_CODE.get(exc.code, 401), exc.code, exc.message)
    return identity


def create_app(settings: Settings, engine: Engine, verifier: TokenVerifier | None = None,
               recaller: Recaller | None = None, *, health: Health | None = None,
               warmup: Warmup | None = None) -> Starlette:
    """The app; ``recaller`` defaults to one over ``engine`` that loads its models on first use
    (``engram serve`` loads them at start: ``warmup``); ``health`` holds the process's
    long-running components, which ``/readyz`` reports."""
    config = ApiConfig(settings, engine, verifier or TokenVerifier.from_settings(settings),
                       recaller or Recaller(engine, settings))
    warmup = warmup or Warmup()
    explorer = ExplorerGraphiQL(title="Engram")
    # Operations and token checks wait in their own thread pools: an issuer whose JWKS
    # hangs holds up token checks, never operations already admitted (nor the event loop).
    operations = CapacityLimiter(settings.api_threads)
    verifications = CapacityLimiter(max(4, settings.api_threads // 4))

    async def graphql_post(request: Request) -> Response:
        identity = await identity_of(request, config.verifier, verifications)
        if isinstance(identity, Response):
            return identity
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return error_response(415, "BAD_USER_INPUT", "send the GraphQL request as application/json")
        body = await read_body(request, settings.api_max_body_bytes)
        if isinstance(body, Response):
            return body
        try:
            # NaN, Infinity, unstorable text and deep nesting are refused here, by path.
            data = parse_json(body)
        except BadInput as exc:
            return error_response(400, exc.code, exc.message)
        if not isinstance(data, dict) or not isinstance(data.get("query"), str):
            return error_response(400, "BAD_USER_INPUT",
                                  "the request must be a JSON object with a 'query' string")
        if len(data["query"]) > settings.api_max_query_chars:
            return error_response(413, "BAD_USER_INPUT",
                                  f"the query is {len(data['query'])} characters; "
                                  f"the limit is {settings.api_max_query_chars}")
        try:
            success, result = await to_thread.run_sync(execute, config, identity, data,
                                                        limiter=operations)
        except _Refused as refused:
            return error_response(STATUS_BY_CODE[refused.error.code], refused.error.code,
                                  refused.error.message)
        except EngramError as exc:
            # Raised at commit (the chain's deferred trigger, a serialization failure): the
            # request wrote nothing.
            if not is_public(exc):
                return error_response(500, exc.code, internal_message(exc))
            return error_response(STATUS_BY_CODE.get(exc.code, 500), exc.code, exc.message)
        if _unavailable(result):
            return JSONResponse(result, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        status = 200 if success or result.get("data") is not None or _executed(result) else 400
        return JSONResponse(result, status_code=status)

    async def graphql_get(request: Request) -> Response:
        if not config.graphiql:
            return PlainTextResponse("the GraphiQL explorer is off on this server; POST queries",
                                     status_code=404)
        return HTMLResponse(explorer.html(request))

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    probes = CapacityLimiter(2)

    async def readyz(_: Request) -> Response:
        try:
            with fail_after(READY_PROBE_S + 1):
                report = await to_thread.run_sync(readiness, engine, warmup, config.recaller, health,
                                                  config.verifier, limiter=probes,
                                                  abandon_on_cancel=True)
        except TimeoutError:
            report = {"ready": False, "database": {"ok": False, "detail": "the readiness probe "
                                                   f"took over {READY_PROBE_S + 1:g} s"}}
        return JSONResponse(report, status_code=200 if report["ready"] else 503)

    async def run_operation(identity: Identity, data: dict[str, Any]) -> dict[str, Any]:
        """One GraphQL operation for the console: the same executor as POST /graphql."""
        try:
            return (await to_thread.run_sync(execute, config, identity, data,
                                             limiter=operations))[1]
        except _Refused as refused:
            raise refused.error from refused

    from orchestrator.api.rest import routes as rest_routes
    from orchestrator.console import console_routes

    return Starlette(routes=[
        Route("/graphql", graphql_post, methods=["POST"]),
        Route("/graphql", graphql_get, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        *console_routes(settings, config.verifier, run_operation),
        *rest_routes(config, operations, verifications),
    ])


def _unavailable(result: dict[str, Any]) -> bool:
    """Whether the operation failed because the database was out of reach (retry later)."""
    return any(e.get("extensions", {}).get("code") == Unavailable.code for e in result.get("errors", []))


def _executed(result: dict[str, Any]) -> bool:
    """Whether the errors came from executing resolvers (they carry a path), not validation."""
    return any("path" in e for e in result.get("errors", []))
