"""Token verification against an issuer's JWKS served over real HTTP (RS256, ES256, EdDSA),
key rotation (refresh on unknown kid), the refresh rate limit, the scope mapping, and the
``engram auth`` commands."""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from orchestrator.auth.devkey import jwks_path, key_path
from orchestrator.auth.jwks import KeySet
from orchestrator.auth.tokens import TokenVerifier, identity_from_claims
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.db.server import free_port
from orchestrator.errors import Forbidden, Unauthenticated

AUDIENCE = "https://engram.test/api"


class Issuer:
    """A tiny OIDC-like issuer: its JWKS at /oidc/jwks, keys it can add (rotation)."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[Any, str]] = {}
        self.public: list[dict[str, Any]] = []
        self.requests = 0
        self.url = ""

    def add(self, kid: str, alg: str) -> None:
        private: Any
        if alg == "RS256":
            private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
        elif alg == "ES256":
            private = ec.generate_private_key(ec.SECP256R1())
            jwk = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        else:
            private = ed25519.Ed25519PrivateKey.generate()
            jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
        jwk.update(kid=kid, alg=alg, use="sig")
        self.keys[kid] = (private, alg)
        self.public.append(jwk)

    @property
    def issuer(self) -> str:
        return f"{self.url}/oidc"

    def sign(self, kid: str, **claims: Any) -> str:
        private, alg = self.keys[kid]
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "user-1", "organization_id": "org-1",
                "scope": "openid read:team write:notes", "iat": now, "exp": now + 300}
        body.update(claims)
        return jwt.encode(body, private, algorithm=alg, headers={"kid": kid})


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    iss = Issuer()

    async def jwks(_: Request) -> JSONResponse:
        iss.requests += 1
        return JSONResponse({"keys": iss.public})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/oidc/jwks", jwks)]),
                                           host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    iss.url = f"http://127.0.0.1:{port}"
    try:
        yield iss
    finally:
        server.should_exit = True
        thread.join(timeout=5)


def verifier_for(issuer: Issuer, tmp_path: Path, **over: Any) -> TokenVerifier:
    values: dict[str, Any] = {"home": tmp_path, "auth_issuer": issuer.issuer, "auth_audience": AUDIENCE,
                              "auth_trust_dev_key": False}
    values.update(over)
    return TokenVerifier.from_settings(Settings(**values))


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_each_allowed_algorithm_verifies_against_the_issuer_jwks(alg: str, issuer: Issuer,
                                                                 tmp_path: Path) -> None:
    issuer.add("k1", alg)
    ident = verifier_for(issuer, tmp_path).verify(issuer.sign("k1"))
    assert (ident.org_id, ident.user_id) == ("org-1", "user-1")
    assert ident.read_scopes == {"team"} and ident.write_scopes == {"notes"}
    assert ident.readable == {"team", "notes"}


def test_keys_are_cached_and_an_unknown_kid_refreshes_once(issuer: Issuer, tmp_path: Path) -> None:
    issuer.add("old", "ES256")
    verifier = verifier_for(issuer, tmp_path, auth_jwks_min_refresh_s=0.0)
    for _ in range(3):
        verifier.verify(issuer.sign("old"))
    assert issuer.requests == 1
    issuer.add("new", "RS256")  # rotation: published before use
    verifier.verify(issuer.sign("new"))
    assert issuer.requests == 2
    with pytest.raises(Unauthenticated, match="'forged' is not in the issuer's key set"):
        verifier.verify(_with_kid(issuer, "forged"))
    assert issuer.requests == 3


def _with_kid(issuer: Issuer, kid: str) -> str:
    private, alg = issuer.keys["new"]
    now = int(time.time())
    return jwt.encode({"iss": issuer.issuer, "aud": AUDIENCE, "sub": "u", "exp": now + 60,
                       "organization_id": "org-1"}, private, algorithm=alg, headers={"kid": kid})


def test_unknown_kids_cannot_force_a_fetch_per_request(issuer: Issuer, tmp_path: Path) -> None:
    issuer.add("new", "ES256")
    verifier = verifier_for(issuer, tmp_path, auth_jwks_min_refresh_s=60.0)
    verifier.verify(issuer.sign("new"))
    for i in range(5):
        with pytest.raises(Unauthenticated):
            verifier.verify(_with_kid(issuer, f"forged-{i}"))
    assert issuer.requests == 1


def test_key_set_expires_after_its_ttl() -> None:
    now = [0.0]
    fetched: list[int] = []

    def fetch() -> dict[str, Any]:
        fetched.append(1)
        return {"keys": [{"kid": "a", "kty": "oct"}]}

    keys = KeySet(fetch, ttl_s=100, min_refresh_s=10, clock=lambda: now[0])
    keys.jwk("a")
    now[0] = 50
    keys.jwk("a")
    now[0] = 151
    keys.jwk("a")
    assert len(fetched) == 2


def test_an_unreachable_jwks_is_a_clear_401(tmp_path: Path) -> None:
    port = free_port()
    verifier = TokenVerifier.from_settings(Settings(
        home=tmp_path, auth_issuer="https://issuer.test/oidc", auth_audience=AUDIENCE,
        auth_jwks_url=f"http://127.0.0.1:{port}/jwks", auth_trust_dev_key=False))
    private = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode({"iss": "https://issuer.test/oidc", "aud": AUDIENCE, "sub": "u",
                        "exp": int(time.time()) + 60}, private, algorithm="ES256",
                       headers={"kid": "k"})
    with pytest.raises(Unauthenticated, match="key set at .* could not be read"):
        verifier.verify(token)


def test_scope_mapping() -> None:
    ident = identity_from_claims({"organization_id": "o", "sub": "u",
                                  "scope": "openid profile read:a write:b read: write: engram:auditor x:y"})
    assert ident.read_scopes == {"a"} and ident.write_scopes == {"b"} and ident.roles == {"auditor"}
    assert identity_from_claims({"organization_id": "o", "sub": "u", "scope": ["read:a"]}).readable == {"a"}
    with pytest.raises(Forbidden, match="organization_id"):
        identity_from_claims({"sub": "u", "scope": "read:a"})
    with pytest.raises(Unauthenticated, match="scope claim"):
        identity_from_claims({"organization_id": "o", "sub": "u", "scope": 42})


def test_auth_cli_dev_key_token_and_whoami(tmp_path: Path) -> None:
    env = {"ENGRAM_HOME": str(tmp_path), "ENGRAM_AUTH_TRUST_DEV_KEY": "true"}
    runner = CliRunner()
    result = runner.invoke(app, ["auth", "dev-key"], env=env)
    assert result.exit_code == 0, result.output
    settings = Settings(home=tmp_path)
    assert stat.S_IMODE(key_path(settings).stat().st_mode) == 0o600
    assert json.loads(jwks_path(settings).read_text())["keys"][0]["alg"] == "ES256"
    result = runner.invoke(app, ["auth", "dev-key"], env=env)
    assert result.exit_code == 2 and "already exists" in result.output
    result = runner.invoke(app, ["auth", "token", "--tenant", "org-9", "--user", "ann",
                                 "--scopes", "read:team,write:notes", "--ttl", "60"], env=env)
    assert result.exit_code == 0
    token = result.output.strip()
    result = runner.invoke(app, ["auth", "whoami", "--token", token], env=env)
    assert result.exit_code == 0
    assert "organization org-9, user ann" in result.output and "write: notes" in result.output
    result = runner.invoke(app, ["auth", "whoami", "--token", token],
                           env={**env, "ENGRAM_AUTH_TRUST_DEV_KEY": "false"})
    assert result.exit_code == 1 and "not trusted" in result.output
