"""``POST /api/v1/memory/prepare`` over real HTTP, checked against the OpenAPI document the
server itself serves: the document is valid OpenAPI 3.1, and every request and answer
here, allowed or refused, matches it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server, forge  # noqa: F401

Tenants = Callable[..., TenantFixture]
PREPARE = "/api/v1/memory/prepare"


@pytest.fixture(scope="module")
def spec(api_server: ApiServer) -> dict[str, Any]:  # noqa: F811
    response = httpx.get(f"{api_server.url}/api/v1/openapi.json", timeout=10)
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    validate_openapi(document)
    return document


def validator(spec: dict[str, Any], schema: str) -> Draft202012Validator:
    # OpenAPI 3.1 schema objects are JSON Schema 2020-12; the document is their base.
    registry: Registry[Any] = Registry().with_resource(
        "urn:engram-openapi", Resource.from_contents(spec, default_specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:engram-openapi#/components/schemas/{schema}"},
                                registry=registry)


def post(server: ApiServer, token: str | None, body: Any, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    headers.update(kw.pop("headers", {}))
    return httpx.post(f"{server.url}{PREPARE}", json=body, headers=headers, timeout=180, **kw)


def documented(spec: dict[str, Any], response: httpx.Response) -> dict[str, Any]:
    """The answer's body, after checking its status is documented and its body matches."""
    responses = spec["paths"][PREPARE]["post"]["responses"]
    assert str(response.status_code) in responses, response.status_code
    schema = responses[str(response.status_code)]["content"]["application/json"]["schema"]
    body: dict[str, Any] = response.json()
    validator(spec, schema["$ref"].rsplit("/", 1)[1]).validate(body)
    return body


def test_the_openapi_document_is_valid_and_public(spec: dict[str, Any]) -> None:
    operation = spec["paths"][PREPARE]["post"]
    assert operation["security"] == [{"bearer": []}]
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_prepare_answers_the_memory_prepare_bundle(api_server: ApiServer,  # noqa: F811
                                                   tenant_factory: Tenants,
                                                   spec: dict[str, Any]) -> None:
    t, other = tenant_factory("team"), tenant_factory("team")
    token = api_server.token(t.org_id, "alice", ("write:team",))
    api_server.gql(token, """mutation { upsertDocument(input: {collection: "notes", path: "b.md",
        title: "Boiler", body: "The boiler was serviced in March by Hydro Ltd.",
        scopes: ["team"]}) { created } }""")
    request = {"question": "When was the boiler serviced?", "budgetTokens": 400}
    validator(spec, "PrepareRequest").validate(request)
    bundle = documented(spec, post(api_server, token, request))
    assert "serviced in March" in bundle["rendered"]
    assert bundle["evidence"][0]["text"] == "The boiler was serviced in March by Hydro Ltd."
    # The same bundle GraphQL's memoryPrepare answers (one function builds both).
    fields = ("question asker budgetTokens usedTokens rendered neededTokens embeddingModel "
              "evidence { text kind itemTable itemId scopes { name } } documents { id title }")
    graphql = api_server.gql(token, f"query($q: String!) {{ memoryPrepare(question: $q, "
                                    f"budgetTokens: 400) {{ {fields} }} }}",
                             {"q": request["question"]})["memoryPrepare"]
    for key, value in graphql.items():
        if key == "evidence":
            value = [{k: e[k] for k in ("text", "kind", "itemTable", "itemId")} |
                     {"scopes": [{"name": s["name"]} for s in e["scopes"]]} for e in value]
            assert value == [{k: e[k] for k in ("text", "kind", "itemTable", "itemId")} |
                             {"scopes": [{"name": s["name"]} for s in e["scopes"]]}
                             for e in bundle["evidence"]]
        elif key == "documents":
            assert value == [{"id": d["id"], "title": d["title"]} for d in bundle["documents"]]
        else:
            assert bundle[key] == value, key
    # Another tenant's token is answered, with none of this tenant's memory.
    theirs = documented(spec, post(api_server, api_server.token(other.org_id, "sam", ("read:team",)),
                                   request))
    assert "boiler" not in theirs["rendered"].lower() and theirs["evidence"] == []


def test_prepare_refusals_are_documented_and_run_nothing(api_server: ApiServer,  # noqa: F811
                                                         tenant_factory: Tenants,
                                                         spec: dict[str, Any]) -> None:
    t = tenant_factory("team")
    token = api_server.token(t.org_id, "alice", ("read:team",))
    request_schema = validator(spec, "PrepareRequest")

    def refused(response: httpx.Response, status: int, says: str) -> None:
        body = documented(spec, response)
        assert response.status_code == status and says in body["error"]["message"], body
        assert body["error"]["code"] in {400: "BAD_USER_INPUT", 401: "UNAUTHENTICATED",
                                         413: "BAD_USER_INPUT", 415: "BAD_USER_INPUT"}[status]

    ask = {"question": "anything"}
    no_token = post(api_server, None, ask)
    refused(no_token, 401, "")
    assert no_token.headers["www-authenticate"].startswith("Bearer")
    refused(post(api_server, token[:-4] + "AAAA", ask), 401, "")
    refused(post(api_server, forge({"alg": "none"}, {"sub": "x"}), ask), 401, "")
    refused(post(api_server, api_server.token("org-nowhere", "x", ("read:team",)), ask), 401,
            "unknown tenant")
    refused(httpx.post(f"{api_server.url}{PREPARE}", content=b'{"question": "x"}', timeout=10,
                       headers={"authorization": f"Bearer {token}", "content-type": "text/plain"}),
            415, "application/json")
    refused(httpx.post(f"{api_server.url}{PREPARE}", content=b"{not json", timeout=10,
                       headers={"authorization": f"Bearer {token}",
                                "content-type": "application/json"}), 400, "not valid JSON")
    # JSON is read as GraphQL reads it: a body nested 5,000 deep answered 500 (RecursionError),
    # NaN was taken for a float, a NUL was left for the recall to refuse.
    for raw, says in ((b"[" * 5000 + b"]" * 5000, "nested more than"),
                      (b'{"question": "x", "budgetTokens": NaN}', "NaN, which is not a JSON number"),
                      (rb'{"question": "a\u0000b"}', "NUL")):
        refused(httpx.post(f"{api_server.url}{PREPARE}", content=raw, timeout=10,
                           headers={"authorization": f"Bearer {token}",
                                    "content-type": "application/json"}), 400, says)
    refused(post(api_server, token, {"question": "x" * (api_server.settings.api_max_body_bytes + 1)}),
            413, "limit")
    # Bodies the document refuses are the bodies the server refuses, field by field.
    for body, says in (
            ([], "must be a JSON object"),
            ({}, "question is required"),
            ({"question": "x", "tenant": "other-org"}, "unknown field(s) 'tenant'"),
            ({"question": 42}, "question must be a string, not int"),
            ({"question": "x", "budgetTokens": "400"}, "budgetTokens must be an integer or null"),
            ({"question": "x", "budgetTokens": True}, "budgetTokens must be an integer or null"),
            ({"question": "x", "budgetTokens": 0}, "budget_tokens must be positive"),
            ({"question": "x", "mode": "sideways"}, "unknown mode 'sideways'"),
            ({"question": "x", "sessionId": ""}, "session must be non-empty text"),
            ({"question": ""}, "the question is empty")):
        assert not request_schema.is_valid(body), body
        refused(post(api_server, token, body), 400, says)
