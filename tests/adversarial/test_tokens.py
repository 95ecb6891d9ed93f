"""Token matrix: forged, confused, expired, misaddressed, oversized and malformed bearer tokens,
each alone and in random combinations, are all refused (401, 403 or 413 over HTTP, and by the
verifier MCP uses), never 200 and never 500, and nothing is written.

Single defects: alg none (and None, NONE), HS256/HS512 signed with the public key as the
secret, RS256 under the ES256 key id, a wrong key, a forged signature, wrong issuer, audience,
expired, not yet valid, missing exp/sub/organization, an unknown organization or scope,
``jku``/``x5u`` pointing at an attacker, an embedded ``jwk`` or ``x5c`` (the attacker's key),
``kid`` tricks (unknown, empty, a path, SQL, 10k characters, a number), huge tokens and claims,
and malformed shapes (two or four segments, bad base64, bad JSON, a JSON array, empty). The
combinations stack several defects on one token, drawn from the run's seed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm
from sqlalchemy import Engine

from orchestrator.auth.devkey import _private_key
from orchestrator.auth.tokens import TokenVerifier
from orchestrator.errors import EngramError
from tests.adversarial.figures import record
from tests.adversarial.snapshot import snapshot
from tests.conftest import TenantFixture
from tests.support.api import ApiServer

COMBINATIONS = 40
WRITE = """mutation { upsertDocument(input: {collection: "notes", path: "t.md", title: "T", body: "B",
  scopes: ["team"]}) { created } }"""


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def assemble(header: dict[str, Any], claims: Any, signature: bytes = b"") -> str:
    return ".".join([b64(json.dumps(header).encode()), b64(json.dumps(claims).encode()), b64(signature)])


class Forger:
    """Makes tokens for one server's development issuer, honest or not."""

    def __init__(self, server: ApiServer, org: str) -> None:
        self.server, self.org = server, org
        self.key, self.kid = _private_key(server.settings)
        self.stranger = ec.generate_private_key(ec.SECP256R1())

    def claims(self, **over: Any) -> dict[str, Any]:
        now = int(time.time())
        base = {"iss": self.server.settings.auth_dev_issuer, "aud": self.server.settings.auth_audience,
                "sub": "mallory", "organization_id": self.org, "scope": "write:team",
                "iat": now, "nbf": now, "exp": now + 600}
        base.update(over)
        return {k: v for k, v in base.items() if v is not None}

    def sign(self, claims: dict[str, Any], key: Any = None, alg: str = "ES256", **headers: Any) -> str:
        return jwt.encode(claims, key or self.key, algorithm=alg, headers={"kid": self.kid, **headers})

    def hmac_with_public_key(self, claims: dict[str, Any], alg: str = "HS256") -> str:
        pem = self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
        unsigned = assemble({"alg": alg, "typ": "JWT", "kid": self.kid}, claims).rpartition(".")[0]
        digest = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}[alg]
        return unsigned + "." + b64(hmac.new(pem, unsigned.encode(), digest).digest())


Defect = Callable[[Forger, dict[str, Any], dict[str, Any]], None]

# Defects that change the claims or header of an otherwise honest token (combinable).
CLAIM_DEFECTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "wrong issuer": lambda c: c.update(iss="https://evil.example/oidc"),
    "wrong audience": lambda c: c.update(aud="https://other.example/api"),
    "expired": lambda c: c.update(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200),
    "not yet valid": lambda c: c.update(nbf=int(time.time()) + 3600),
    "no expiry": lambda c: c.pop("exp"),
    "no subject": lambda c: c.pop("sub"),
    "no organization": lambda c: c.pop("organization_id"),
    "unknown organization": lambda c: c.update(organization_id="org-that-does-not-exist"),
    "unknown scope": lambda c: c.update(scope="write:nosuchscope"),
    "scope of another type": lambda c: c.update(scope={"write": "team"}),
    "huge claim": lambda c: c.update(pad="x" * 20_000),
}
HEADER_DEFECTS: dict[str, dict[str, Any]] = {
    "jku (on a token the real key signed)": {"jku": "https://evil.example/jwks.json"},
    "x5u (on a token the real key signed)": {"x5u": "https://evil.example/cert.pem"},
    "unknown kid": {"kid": "not-a-known-kid"},
    "empty kid": {"kid": ""},
    "kid as a path": {"kid": "../../../../etc/passwd"},
    "kid as SQL": {"kid": "x' or '1'='1"},
    "kid of 10k characters": {"kid": "k" * 10_000},
    "kid as a number": {"kid": 7},
}


BINDING_ONLY = {"unknown organization", "unknown scope", "signed by dev key"}


def single_defects(f: Forger) -> dict[str, str]:
    """One token per defect; each would be accepted without its one defect."""
    honest = f.claims()
    tokens = {name: f.sign(_with(honest, change)) for name, change in CLAIM_DEFECTS.items()}
    tokens.update({name: _header_token(f, honest, head) for name, head in HEADER_DEFECTS.items()})
    attacker_jwk = ECAlgorithm.to_jwk(f.stranger.public_key(), as_dict=True)
    tokens.update({
        "alg none": assemble({"alg": "none", "typ": "JWT", "kid": f.kid}, honest),
        "alg None": assemble({"alg": "None", "kid": f.kid}, honest),
        "alg NONE with a signature": assemble({"alg": "NONE", "kid": f.kid}, honest, b"sig"),
        "HS256 with the public key": f.hmac_with_public_key(honest),
        "HS512 with the public key": f.hmac_with_public_key(honest, "HS512"),
        "RS256 under the ES256 kid": f.sign(honest, rsa.generate_private_key(65537, 2048), "RS256"),
        "a stranger's key": f.sign(honest, f.stranger),
        "embedded jwk of the stranger": f.sign(honest, f.stranger, jwk=attacker_jwk),
        "embedded x5c": f.sign(honest, f.stranger, x5c=["MIIB" + "A" * 200]),
        "jku to the stranger's key set": f.sign(honest, f.stranger, jku="https://evil.example/jwks"),
        "x5u to the stranger's certificate": f.sign(honest, f.stranger, x5u="https://evil.example/c"),
        "forged signature": f.sign(honest).rpartition(".")[0] + "." + f.sign(
            f.claims(sub="someone-else")).rpartition(".")[2],
        "huge token": "a" * 100_000 + "." + "b" * 100_000 + "." + "c" * 100,
        "two segments": ".".join(f.sign(honest).split(".")[:2]),
        "four segments": f.sign(honest) + ".x",
        "bad base64": "!!!.@@@.###",
        "bad JSON": b64(b"{not json") + "." + b64(b"{}") + ".",
        "a JSON array": b64(b'["alg"]') + "." + b64(b"[]") + ".",
        "empty": "",
        "spaces": "   ",
    })
    return tokens


def _with(claims: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    copy = dict(claims)
    change(copy)
    return copy


def _header_token(f: Forger, claims: dict[str, Any], head: dict[str, Any]) -> str:
    if isinstance(head.get("kid", ""), str):
        return f.sign(claims, **head)
    return assemble({"alg": "ES256", **head}, claims, b"x" * 64)


# Defects that rewrite the same claim: a second one would undo the first, and the token's name
# would then list a defect it no longer has (seed 705401879 drew "no organization" then "unknown
# organization", which put an organization back). A combination takes one per claim.
SAME_CLAIM = {"no organization": "organization_id", "unknown organization": "organization_id",
              "unknown scope": "scope", "scope of another type": "scope",
              "expired": "exp", "no expiry": "exp"}


def one_per_field(names: list[str], field: Callable[[str], str]) -> list[str]:
    """The names in order, without any that rewrites a field an earlier one already set."""
    seen: set[str] = set()
    kept = []
    for name in names:
        if field(name) not in seen:
            seen.add(field(name))
            kept.append(name)
    return kept


def combined(f: Forger, rng: random.Random) -> tuple[str, str]:
    """Several defects on one token, drawn at random; each is still on the token it names."""
    claim_names = one_per_field(rng.sample(sorted(CLAIM_DEFECTS), rng.randint(1, 3)),
                                lambda name: SAME_CLAIM.get(name, name))
    claims = f.claims()
    for name in claim_names:
        CLAIM_DEFECTS[name](claims)
    head_names = one_per_field(rng.sample(sorted(HEADER_DEFECTS), rng.randint(0, 2)),
                               lambda name: next(iter(HEADER_DEFECTS[name])))
    head: dict[str, Any] = {}
    for name in head_names:
        head.update(HEADER_DEFECTS[name])
    signer = rng.choice(["dev key", "stranger", "none"])
    if signer == "none":
        token = assemble({"alg": "none", **head}, claims)
    elif isinstance(head.get("kid", ""), str):
        token = f.sign(claims, f.stranger if signer == "stranger" else None, **head)
    else:
        token = assemble({"alg": "ES256", **head}, claims, b"x" * 64)
    return " + ".join(claim_names + head_names + [f"signed by {signer}"]), token


def test_every_bad_token_is_refused_and_writes_nothing(
        seed: int, api_server: ApiServer, tenant_factory: Callable[..., TenantFixture],
        admin_engine: Engine) -> None:
    t = tenant_factory("team", org_prefix="advt")
    forger = Forger(api_server, t.org_id)
    rng = random.Random(seed ^ 0x7)
    cases = list(single_defects(forger).items()) + [combined(forger, rng) for _ in range(COMBINATIONS)]
    verifier = TokenVerifier.from_settings(api_server.settings)
    before = snapshot(admin_engine, t.id)
    accepted: list[str] = []
    statuses: dict[int, int] = {}
    for name, token in cases:
        try:
            response = httpx.post(f"{api_server.url}/graphql", json={"query": WRITE},
                                  headers={"authorization": f"Bearer {token}"}, timeout=60)
            status = response.status_code
        except httpx.LocalProtocolError:
            status = 0  # not even sendable as an HTTP header: no server ever sees it
        except (httpx.RemoteProtocolError, httpx.ReadError):
            # The HTTP server dropped the request before any Engram code ran (headers over its
            # limit): refused, counted as 431. (uvicorn may instead answer a plain 400.)
            status = 431
        statuses[status] = statuses.get(status, 0) + 1
        if status not in (0, 400, 401, 403, 413, 431):
            accepted.append(f"{name}: HTTP {status} {response.text[:200]}")
        try:  # what the MCP transports use: the same verifier, with no database in between
            verifier.verify(token)
            # A genuine token naming what the database does not know is refused when bound.
            if not set(name.split(" + ")) <= BINDING_ONLY:
                accepted.append(f"{name}: the verifier accepted it")
        except EngramError:
            pass
    unchanged = snapshot(admin_engine, t.id) == before
    assert not accepted, f"seed {seed}:\n" + "\n".join(accepted)
    # The control: the honest token of the same forger writes, and the snapshot shows it.
    honest = forger.sign(forger.claims())
    assert api_server.gql(honest, WRITE) == {"upsertDocument": {"created": True}}
    changed_rows = snapshot(admin_engine, t.id) != before
    record("token matrix", tokens=len(cases), single_defects=len(cases) - COMBINATIONS,
           combinations=COMBINATIONS, refused=len(cases) - len(accepted),
           **{f"http_{k}": v for k, v in sorted(statuses.items())})
    assert not accepted, f"seed {seed}:\n" + "\n".join(accepted)
    assert unchanged and changed_rows
