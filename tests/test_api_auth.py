"""Bearer token refusals over real HTTP: each bad token is a 401/403 with a clear message,
and nothing is written."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sqlalchemy import Engine, text

from orchestrator.auth.devkey import _private_key, jwks_path
from orchestrator.auth.tokens import TokenVerifier
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_home, api_server, b64, forge, serve  # noqa: F401
from tests.support.issuer import Issuer

UPSERT = """mutation($p: String!) { upsertDocument(input: {collection: "notes", path: $p,
  title: "T", body: "Some body text.", scopes: ["team"]}) { created } }"""


def claims(server: ApiServer, org: str, **over: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": server.settings.auth_dev_issuer, "aud": server.settings.auth_audience,
            "sub": "mallory", "organization_id": org, "scope": "read:team write:team",
            "iat": now, "nbf": now, "exp": now + 600}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def dev_sign(server: ApiServer, payload: dict[str, Any], **headers: Any) -> str:
    key, kid = _private_key(server.settings)
    return jwt.encode(payload, key, algorithm="ES256", headers={"kid": kid, **headers})


def doc_count(admin_engine: Engine, t: TenantFixture) -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text("select count(*) from sources.documents where tenant_id = :t"),
                                {"t": t.id}).scalar_one())


def _forged_signature(server: ApiServer, org: str) -> str:
    token = dev_sign(server, claims(server, org))
    head = token.rpartition(".")[0]
    # Same header and claims, signature of other claims: the signature does not verify.
    other = dev_sign(server, claims(server, org, sub="someone-else"))
    return head + "." + other.rpartition(".")[2]


def _wrong_key(server: ApiServer, org: str) -> str:
    stranger = ec.generate_private_key(ec.SECP256R1())
    _, kid = _private_key(server.settings)
    return jwt.encode(claims(server, org), stranger, algorithm="ES256", headers={"kid": kid})


def _alg_none(server: ApiServer, org: str) -> str:
    return forge({"alg": "none", "typ": "JWT"}, claims(server, org))


def _hs256_public_key(server: ApiServer, org: str) -> str:
    key, kid = _private_key(server.settings)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    header = {"alg": "HS256", "typ": "JWT", "kid": kid}
    unsigned = forge(header, claims(server, org)).rpartition(".")[0]
    sig = hmac.new(public_pem, unsigned.encode(), hashlib.sha256).digest()
    return unsigned + "." + b64(sig)


def _unknown_kid(server: ApiServer, org: str) -> str:
    key, _ = _private_key(server.settings)
    return jwt.encode(claims(server, org), key, algorithm="ES256", headers={"kid": "not-a-known-kid"})


def _rsa_key_for_es256_kid(server: ApiServer, org: str) -> str:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _, kid = _private_key(server.settings)
    return jwt.encode(claims(server, org), rsa_key, algorithm="RS256", headers={"kid": kid})


BAD_TOKENS: dict[str, tuple[Callable[[ApiServer, str], str], int, str]] = {
    "forged signature": (_forged_signature, 401, "signature does not verify"),
    "wrong key": (_wrong_key, 401, "signature does not verify"),
    "alg none": (_alg_none, 401, "algorithm 'none' is not allowed"),
    "HS256 with the public key": (_hs256_public_key, 401, "algorithm 'HS256' is not allowed"),
    "unknown kid": (_unknown_kid, 401, "not in the issuer's key set"),
    "RS256 under an ES256 key": (_rsa_key_for_es256_kid, 401, "key"),
    "expired": (lambda s, o: dev_sign(s, claims(s, o, iat=int(time.time()) - 7200,
                                                 nbf=int(time.time()) - 7200,
                                                 exp=int(time.time()) - 3600)), 401, "expired"),
    "not yet valid": (lambda s, o: dev_sign(s, claims(s, o, nbf=int(time.time()) + 3600)),
                      401, "not valid yet"),
    "wrong audience": (lambda s, o: dev_sign(s, claims(s, o, aud="https://other.example/api")),
                       401, "not meant for this API"),
    "wrong issuer": (lambda s, o: dev_sign(s, claims(s, o, iss="https://evil.example/oidc")),
                     401, "issuer 'https://evil.example/oidc' is not trusted"),
    "no expiry": (lambda s, o: dev_sign(s, claims(s, o, exp=None)), 401, "'exp'"),
    "missing organization": (lambda s, o: dev_sign(s, claims(s, o, organization_id=None)),
                             403, "no organization_id claim"),
    "unknown organization": (lambda s, o: dev_sign(s, claims(s, "org-that-does-not-exist")),
                             401, "unknown tenant"),
    "unknown scope": (lambda s, o: dev_sign(s, claims(s, o, scope="read:team write:nosuchscope")),
                      403, "unknown scope(s)"),
    "not a JWT": (lambda s, o: "definitely-not-a-jwt", 401, "not a well-formed JWT"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_bad_token_is_refused_and_writes_nothing(case: str, api_server: ApiServer,  # noqa: F811
                                                 tenant_factory: Callable[..., TenantFixture],
                                                 admin_engine: Engine) -> None:
    t = tenant_factory("team")
    make, status, message = BAD_TOKENS[case]
    response = api_server.post(make(api_server, t.org_id), UPSERT, {"p": "x.md"})
    body = response.json()
    assert response.status_code == status, body
    error = body["errors"][0]
    assert message in error["message"]
    assert error["extensions"]["code"] == ("UNAUTHENTICATED" if status == 401 else "FORBIDDEN")
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert body["data"] is None
    assert doc_count(admin_engine, t) == 0


def test_the_same_mutation_with_a_good_token_writes(api_server: ApiServer,  # noqa: F811
                                                    tenant_factory: Callable[..., TenantFixture],
                                                    admin_engine: Engine) -> None:
    # The control for the refusals above: the request itself is fine.
    t = tenant_factory("team")
    token = dev_sign(api_server, claims(api_server, t.org_id))
    assert api_server.gql(token, UPSERT, {"p": "x.md"}) == {"upsertDocument": {"created": True}}
    assert doc_count(admin_engine, t) == 1


def test_no_token_and_bad_scheme(api_server: ApiServer) -> None:  # noqa: F811
    response = api_server.post(None, "{ me { userId } }")
    assert response.status_code == 401
    assert "no bearer token" in response.json()["errors"][0]["message"]
    response = api_server.post(None, "{ me { userId } }", headers={"authorization": "Basic abc"})
    assert response.status_code == 401
    assert "Bearer <token>" in response.json()["errors"][0]["message"]


def test_dev_key_is_not_trusted_unless_configured(api_server: ApiServer) -> None:  # noqa: F811
    from orchestrator.auth.tokens import TokenVerifier

    values = api_server.settings.model_dump()
    values.update(auth_trust_dev_key=False)
    verifier = TokenVerifier.from_settings(type(api_server.settings)(**values))
    from orchestrator.errors import Unauthenticated

    with pytest.raises(Unauthenticated, match="issuer 'engram-dev' is not trusted"):
        verifier.verify(api_server.token("any-org"))
    # Unset, the dev key is trusted exactly when the database is the embedded one.
    values.update(auth_trust_dev_key=None, database_url="postgresql://db.example/engram")
    verifier = TokenVerifier.from_settings(type(api_server.settings)(**values))
    with pytest.raises(Unauthenticated, match="not trusted"):
        verifier.verify(api_server.token("any-org"))
    assert jwks_path(api_server.settings).exists()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    iss = Issuer()
    iss.start()
    try:
        yield iss
    finally:
        iss.stop()


ME = "{ me { userId orgId } }"


def issuer_server(api_server: ApiServer, app_engine: Engine, issuer: Issuer,  # noqa: F811
                  **over: Any) -> tuple[TokenVerifier, Any]:
    values = api_server.settings.model_dump()
    values.update(auth_issuer=issuer.issuer, auth_jwks_url=issuer.jwks_url, **over)
    s = type(api_server.settings)(**values)
    verifier = TokenVerifier.from_settings(s)
    return verifier, serve(s, app_engine, verifier)


def test_a_hanging_jwks_fetch_does_not_block_the_event_loop(
        api_server: ApiServer, app_engine: Engine, issuer: Issuer,  # noqa: F811
        tenant_factory: Callable[..., TenantFixture]) -> None:
    t = tenant_factory("team")
    issuer.add("k1", "ES256")
    token = issuer.sign("k1", organization_id=t.org_id, scope="read:team",
                        aud=api_server.settings.auth_audience)
    issuer.answering.clear()
    _, serving = issuer_server(api_server, app_engine, issuer)
    with serving as server:
        answer: dict[str, httpx.Response] = {}
        pending = threading.Thread(target=lambda: answer.setdefault("me", server.post(token, ME)))
        pending.start()
        try:
            assert issuer.waiting.wait(20), "the token check never asked the issuer"
            # The server still answers while a token check waits on the issuer's JWKS.
            assert httpx.get(f"{server.url}/healthz", timeout=10).json() == {"status": "ok"}
            assert pending.is_alive()
        finally:
            issuer.answering.set()
            pending.join(timeout=30)
    assert answer["me"].json() == {"data": {"me": {"userId": "user-1", "orgId": t.org_id}}}


def test_an_issuer_outage_over_http_serves_cached_keys_then_refuses(
        api_server: ApiServer, app_engine: Engine, issuer: Issuer,  # noqa: F811
        tenant_factory: Callable[..., TenantFixture], caplog: pytest.LogCaptureFixture) -> None:
    t = tenant_factory("team")
    issuer.add("k1", "ES256")
    token = issuer.sign("k1", organization_id=t.org_id, scope="read:team",
                        aud=api_server.settings.auth_audience)
    ttl, grace = 0.5, 4.0
    verifier, serving = issuer_server(api_server, app_engine, issuer, auth_jwks_ttl_s=ttl,
                                      auth_jwks_grace_s=grace, auth_jwks_min_refresh_s=60.0)
    keys = verifier.issuers[issuer.issuer]
    caplog.set_level(logging.WARNING, logger="engram.auth.jwks")
    with serving as server:
        assert server.gql(token, ME)["me"]["orgId"] == t.org_id
        loaded = time.monotonic()
        issuer.stop()
        time.sleep(ttl + 0.2)
        served = 0
        # Requests inside the grace period (as many as a loaded machine fits, at least one).
        while served < 10 and (served == 0 or time.monotonic() < loaded + ttl + grace - 1.0):
            assert server.gql(token, ME)["me"]["orgId"] == t.org_id
            served += 1
        assert keys.fetches == 2, "one failed refresh during the outage, then back-off"
        assert any("serving the 1 cached key" in r.getMessage() for r in caplog.records)
        time.sleep(max(0.0, loaded + ttl + grace + 0.3 - time.monotonic()))
        response = server.post(token, ME)
        assert response.status_code == 401 and "could not be read" in response.json()["errors"][0]["message"]
        assert keys.fetches == 2, "past the grace period, still no fetch per request"


def _timed(server: ApiServer, org: str, *, exp: int, nbf: int) -> str:
    now = int(time.time())
    return dev_sign(server, claims(server, org, iat=min(now, nbf), nbf=nbf, exp=exp))


def test_exp_and_nbf_leeway(api_server: ApiServer,  # noqa: F811
                            tenant_factory: Callable[..., TenantFixture], admin_engine: Engine) -> None:
    leeway = int(api_server.settings.auth_leeway_s)
    assert leeway >= 20, "the cases below sit 10 s inside and outside the leeway"
    t = tenant_factory("team")
    now = int(time.time())
    # Within the leeway: expired a little ago, valid a little from now: accepted.
    for i, token in enumerate((_timed(api_server, t.org_id, exp=now - leeway + 10, nbf=now - 60),
                               _timed(api_server, t.org_id, exp=now + 600, nbf=now + leeway - 10))):
        assert api_server.gql(token, UPSERT, {"p": f"in{i}.md"}) == {"upsertDocument": {"created": True}}
    # Beyond it: refused, nothing written.
    for token, message in ((_timed(api_server, t.org_id, exp=now - leeway - 10, nbf=now - 600), "expired"),
                           (_timed(api_server, t.org_id, exp=now + 600, nbf=now + leeway + 10),
                            "not valid yet")):
        response = api_server.post(token, UPSERT, {"p": "out.md"})
        assert response.status_code == 401 and message in response.json()["errors"][0]["message"]
    assert doc_count(admin_engine, t) == 2


def test_a_token_over_the_length_cap_is_refused(api_server: ApiServer,  # noqa: F811
                                                tenant_factory: Callable[..., TenantFixture],
                                                admin_engine: Engine, app_engine: Engine) -> None:
    from orchestrator.auth.tokens import MAX_TOKEN_CHARS
    from orchestrator.client import Engram
    from orchestrator.errors import Unauthenticated

    t = tenant_factory("team")
    # A genuine token padded with a claim until it is just over the cap; the one before it,
    # at most the cap, is the control.
    base = dev_sign(api_server, claims(api_server, t.org_id))
    pad = "x" * ((MAX_TOKEN_CHARS - len(base)) * 3 // 4 - 60)
    under = token = dev_sign(api_server, claims(api_server, t.org_id, pad=pad))
    while len(token) <= MAX_TOKEN_CHARS:
        under, pad = token, pad + "x"
        token = dev_sign(api_server, claims(api_server, t.org_id, pad=pad))
    assert len(under) <= MAX_TOKEN_CHARS < len(token) <= MAX_TOKEN_CHARS + 2
    verifier = TokenVerifier.from_settings(api_server.settings)
    assert verifier.verify(under).org_id == t.org_id
    with pytest.raises(Unauthenticated, match="empty or too long"):
        verifier.verify(token)
    with pytest.raises(Unauthenticated, match="empty or too long"):
        Engram(app_engine, token, api_server.settings, verifier=verifier)
    # Over HTTP the header is refused too, whichever layer says so first (uvicorn's header
    # limit is about this size), and nothing is written.
    response = api_server.post(token, UPSERT, {"p": "long.md"})
    assert response.status_code in (400, 401, 431)
    if response.status_code == 401:
        assert "empty or too long" in response.json()["errors"][0]["message"]
    assert doc_count(admin_engine, t) == 0
