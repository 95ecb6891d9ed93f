"""REST for prompt hooks: ``POST /api/v1/memory/prepare`` and its OpenAPI description.

A prompt hook (a shell script, an editor or agent hook) wants one call, JSON in and
JSON out, and no GraphQL. The route:

1. verifies the bearer token exactly as ``/graphql`` does (401 with
   ``WWW-Authenticate``; 403 for a genuine token that grants nothing here);
2. reads at most ``ENGRAM_API_MAX_BODY_BYTES`` of ``application/json`` (413, 415);
3. checks the body field by field: a JSON object with ``question`` and optional
   ``asker``, ``budgetTokens``, ``mode``, ``sessionId``; an unknown field, a wrong
   type or a value the recall refuses is a 400 naming it, and nothing runs;
4. runs ``memory_prepare`` as the token's identity in the operations pool, and
   answers the same bundle as GraphQL's ``memoryPrepare`` (``api/bundles.py`` builds
   both), with ``embeddingModel`` and ``receiptId``.

Every error is ``{"error": {"code", "message"}}`` with the status of its code.
``GET /api/v1/openapi.json`` describes the route (OpenAPI 3.1, no token needed);
the tests validate the document and every answer against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anyio import CapacityLimiter, to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.api.bundles import bundle_view, jsonable
from orchestrator.errors import STATUS_BY_CODE, BadInput, EngramError, internal_message, is_public
from orchestrator.inputs import parse_json

if TYPE_CHECKING:
    from orchestrator.api.app import ApiConfig

PREPARE_PATH = "/api/v1/memory/prepare"
OPENAPI_PATH = "/api/v1/openapi.json"
# (JSON type the field takes besides null, Python types), for the body check.
FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "question": ("a string", (str,)), "asker": ("a string", (str,)),
    "budgetTokens": ("an integer", (int,)), "mode": ("a string", (str,)),
    "sessionId": ("a string", (str,)),
}
# Beyond GraphQL's statuses (app.STATUS_BY_CODE): a server that cannot embed the question.
MODEL_STATUS = {"MODEL_MISMATCH": 503, "MODEL_UNAVAILABLE": 503}


def rest_error(status: int, code: str, message: str) -> JSONResponse:
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="engram", error="invalid_token"'
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def prepare_arguments(data: Any) -> dict[str, Any]:
    """The recall's arguments from a request body; ``BadInput`` naming every problem."""
    if not isinstance(data, dict):
        raise BadInput("the request body must be a JSON object")
    problems = []
    unknown = sorted(k for k in data if k not in FIELDS)
    if unknown:
        problems.append(f"unknown field(s) {', '.join(repr(k[:50]) for k in unknown[:10])}; "
                        f"the fields are {', '.join(FIELDS)}")
    if data.get("question") is None:
        problems.append("question is required")
    for name, (kind, types) in FIELDS.items():
        value = data.get(name)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            problems.append(f"{name} must be {kind}" + (" or null" if name != "question" else "")
                            + f", not {type(value).__name__}")
    if problems:
        raise BadInput("invalid request: " + "; ".join(problems))
    return {"question": data["question"], "asker": data.get("asker"),
            "budget_tokens": data.get("budgetTokens"), "mode": data.get("mode"),
            "session": data.get("sessionId")}


def routes(config: ApiConfig, operations: CapacityLimiter,
           verifications: CapacityLimiter) -> list[Route]:
    from orchestrator.api.app import identity_of, read_body

    async def prepare(request: Request) -> Response:
        identity = await identity_of(request, config.verifier, verifications, rest_error)
        if isinstance(identity, Response):
            return identity
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return rest_error(415, "BAD_USER_INPUT", "send the request as application/json")
        body = await read_body(request, config.settings.api_max_body_bytes, rest_error)
        if isinstance(body, Response):
            return body
        try:  # the same reading as GraphQL's: nesting bounded, no NaN, storable text
            args = prepare_arguments(parse_json(body))
        except BadInput as exc:
            return rest_error(400, exc.code, exc.message)

        def run() -> dict[str, Any]:
            bundle, trace = config.recaller.prepare(
                identity, args["question"], args["asker"], args["budget_tokens"], args["mode"],
                args["session"], "rest")
            view: dict[str, Any] = jsonable(bundle_view(bundle, trace.embedding_model))
            return view

        try:
            answer = await to_thread.run_sync(run, limiter=operations)
        except EngramError as exc:
            if not is_public(exc):
                return rest_error(500, exc.code, internal_message(exc, PREPARE_PATH))
            status = {**STATUS_BY_CODE, **MODEL_STATUS}.get(exc.code, 500)
            return rest_error(status, exc.code, exc.message)
        except Exception as exc:  # never a traceback or SQL to the client
            return rest_error(500, "INTERNAL", internal_message(exc, PREPARE_PATH))
        return JSONResponse(answer)

    async def openapi(_: Request) -> Response:
        return JSONResponse(openapi_document())

    return [Route(PREPARE_PATH, prepare, methods=["POST"]),
            Route(OPENAPI_PATH, openapi, methods=["GET"])]


# -- the OpenAPI description ---------------------------------------------------------


def _nullable(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], **extra}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_MOMENT = _nullable("string", format="date-time")
_SCHEMAS: dict[str, Any] = {
    "PrepareRequest": {
        "type": "object", "additionalProperties": False, "required": ["question"],
        "properties": {
            "question": {"type": "string", "minLength": 1,
                         "description": "The question; at most ENGRAM_RECALL_MAX_QUESTION_CHARS."},
            "asker": _nullable("string", maxLength=200,
                               description="Who asks (enriches the query embedding)."),
            "budgetTokens": _nullable("integer", minimum=1,
                                      description="Token budget (default from settings)."),
            "mode": {"type": ["string", "null"], "enum": ["causal", "timeline", None],
                     "description": "Adds weight to those lanes; never removes one."},
            "sessionId": _nullable("string", minLength=1, maxLength=200,
                                   description="The asker's current working-memory session."),
        },
    },
    "ScopeRef": {"type": "object", "required": ["name", "description"],
                 "properties": {"name": {"type": "string"}, "description": {"type": "string"}}},
    "SourceRef": {"type": "object", "required": ["collection", "path", "title", "section"],
                  "properties": {**{k: {"type": "string"} for k in ("collection", "path", "title")},
                                 "section": {"type": "array", "items": {"type": "string"}}}},
    "FactRef": {
        "type": "object",
        "required": ["subject", "predicate", "object", "epistemicKind", "perspectiveKey",
                     "authorRole", "factKey", "asOf"],
        "properties": {"subject": {"type": "string"}, "predicate": {"type": "string"},
                       "object": _nullable("string"), "epistemicKind": {"type": "string"},
                       "perspectiveKey": {"type": "string"}, "authorRole": {"type": "string"},
                       "factKey": _nullable("string"), "asOf": _MOMENT},
    },
    "Evidence": {
        "type": "object",
        "required": ["text", "provenance", "kind", "scopes", "source", "fact", "author",
                     "createdAt", "updatedAt", "occurredAt", "endedAt", "documentId", "chunkId",
                     "charStart", "charEnd", "itemTable", "itemId", "clipped"],
        "properties": {
            "text": {"type": "string"},
            "provenance": {"enum": ["source excerpt", "derived memory", "recent session memory"]},
            "kind": {"type": "string"},
            "scopes": {"type": "array", "items": _ref("ScopeRef")},
            "source": {"oneOf": [_ref("SourceRef"), {"type": "null"}]},
            "fact": {"oneOf": [_ref("FactRef"), {"type": "null"}]},
            "author": _nullable("string"), "createdAt": _MOMENT, "updatedAt": _MOMENT,
            "occurredAt": _MOMENT, "endedAt": _MOMENT,
            "documentId": _nullable("string", format="uuid"),
            "chunkId": _nullable("string", format="uuid"),
            "charStart": _nullable("integer"), "charEnd": _nullable("integer"),
            "itemTable": _nullable("string"), "itemId": _nullable("string", format="uuid"),
            "clipped": {"type": "boolean"},
        },
    },
    "DocumentRef": {
        "type": "object", "required": ["id", "title", "collection", "path", "occurredAt",
                                       "updatedAt"],
        "properties": {"id": {"type": "string", "format": "uuid"}, "title": {"type": "string"},
                       "collection": {"type": "string"}, "path": {"type": "string"},
                       "occurredAt": _MOMENT, "updatedAt": _MOMENT},
    },
    "MemoryBundle": {
        "type": "object",
        "required": ["question", "asker", "budgetTokens", "usedTokens", "rendered",
                     "neededTokens", "embeddingModel", "receiptId", "keyedFacts", "evidence",
                     "lessons", "episodes", "documents"],
        "properties": {
            "question": {"type": "string"}, "asker": _nullable("string"),
            "budgetTokens": {"type": "integer"}, "usedTokens": {"type": "integer"},
            "rendered": {"type": "string",
                         "description": "The bundle as one string to put before the question."},
            "neededTokens": {**_nullable("integer"),
                             "description": "Set only when evidence matched and none of it fit "
                                            "budgetTokens: the smallest budget that serves the "
                                            "first item. Null when something was served, or "
                                            "when nothing the token may read matched."},
            "embeddingModel": {"type": "string",
                               "description": "The model and activation (name@generation) the "
                                              "question was embedded with."},
            "receiptId": {**_nullable("string", format="uuid"),
                          "description": "The receipt sealed for the bundle's rows and rendered "
                                         "string (an auditor's `engram audit receipt ID "
                                         "--rendered FILE` proves them). Null when nothing was "
                                         "served."},
            **{k: {"type": "array", "items": _ref("Evidence")}
               for k in ("keyedFacts", "evidence", "lessons", "episodes")},
            "documents": {"type": "array", "items": _ref("DocumentRef")},
        },
    },
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string", "description": "BAD_USER_INPUT, "
                                    "UNAUTHENTICATED, FORBIDDEN, MODEL_MISMATCH, INTERNAL, ..."},
                           "message": {"type": "string"}}}},
    },
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref("Error")}}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of Engram's REST routes."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Engram REST", "version": "1",
                 "description": "Prompt hooks: the memoryPrepare bundle over plain JSON. "
                                "Identity comes only from the bearer token (a verified JWT)."},
        "paths": {PREPARE_PATH: {"post": {
            "operationId": "memoryPrepare",
            "summary": "One prompt-ready bundle for a question under one token budget",
            "description": "The same bundle as GraphQL memoryPrepare: current keyed facts about "
                           "the entities in play, relevant evidence, lessons, recent episodes and "
                           "top documents, from everything the token's identity may read.",
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": _ref("PrepareRequest")}}},
            "responses": {
                "200": {"description": "The bundle",
                        "content": {"application/json": {"schema": _ref("MemoryBundle")}}},
                "400": _error("Invalid JSON, an unknown field, a wrong type, or a value the "
                              "recall refuses"),
                "401": _error("No bearer token, or one that does not verify"),
                "403": _error("A genuine token that grants nothing in this installation"),
                "413": _error("The body is over ENGRAM_API_MAX_BODY_BYTES"),
                "415": _error("The body is not application/json"),
                "500": _error("An unexpected error (only a reference is returned)"),
                "503": _error("This server cannot embed with the active embedding model, or the "
                              "database is unavailable (retry after Retry-After seconds)"),
                "504": _error("The recall ran past ENGRAM_RECALL_STATEMENT_TIMEOUT_MS in the "
                              "database and was stopped (TIMEOUT)"),
            },
        }}},
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "bearerFormat": "JWT"}},
        },
    }
