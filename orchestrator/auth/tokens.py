"""Bearer token verification: a JWT in, a verified ``Identity`` out.

Order of checks, each failure an ``Unauthenticated`` (HTTP 401) that says which
check failed:

1. the header's ``alg`` is on the allow-list (RS256, ES256, EdDSA). ``none`` and
   every HMAC algorithm are refused before any key is looked at, so a public key
   can never be used as an HMAC secret; a header that carries a key or a place to
   fetch one (``jku``, ``x5u``, ``jwk``, ``x5c``) is refused too;
2. the unverified ``iss`` picks the key set: the configured issuer's JWKS, or the
   local development key's when the server trusts it; any other issuer is refused;
3. the ``kid`` names a key of that set (an unknown kid refreshes the set once);
4. signature, ``iss``, ``aud``, ``exp`` and ``nbf`` (with ``auth_leeway_s``
   leeway) are checked by PyJWT with exactly one algorithm allowed;

then the claims become an identity, where a token that is genuine but grants
nothing Engram understands is ``Forbidden`` (HTTP 403):

* ``organization_id`` (Logto's organization claim) selects the tenant
  (``auth.tenants.org_id``); a token without it is refused;
* ``sub`` is the user;
* ``scope`` (space separated, as OAuth sends it) gives the scope lattice:
  ``read:<scope>`` grants read, ``write:<scope>`` grants write (and so read) on
  the Engram scope named ``<scope>``; other entries (``openid``, ``profile``,
  ...) are ignored. ``engram:auditor`` adds the ``auditor`` role, ``engram:dba`` the ``dba`` role
  (the tenant-wide operations views: derive job runs). Scope names
  that the tenant does not have are refused when the identity is bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jwt
from jwt.exceptions import (
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAudienceError,
    InvalidIssuerError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
)

from orchestrator.auth.identity import Identity
from orchestrator.auth.jwks import KeySet, file_fetcher, url_fetcher
from orchestrator.config import Settings
from orchestrator.config.production import jwks_url
from orchestrator.errors import Forbidden, Unauthenticated

ALLOWED_ALGORITHMS = ("RS256", "ES256", "EdDSA")
ORGANIZATION_CLAIM = "organization_id"
READ_PREFIX = "read:"
WRITE_PREFIX = "write:"
ROLE_SCOPES = {"engram:auditor": "auditor", "engram:dba": "dba"}
MAX_TOKEN_CHARS = 16_384
# Header members that carry a key or say where to fetch one. Engram never follows them (keys
# come from the configured issuer alone), and a token carrying one is refused outright: an
# issuer has no reason to send them, and an attacker every reason.
KEY_HEADERS = frozenset({"jku", "x5u", "jwk", "x5c"})


def identity_from_claims(claims: Mapping[str, Any]) -> Identity:
    """The identity a verified token's claims grant (the documented scope mapping)."""
    org = claims.get(ORGANIZATION_CLAIM)
    if not isinstance(org, str) or not org:
        raise Forbidden(
            f"the token has no {ORGANIZATION_CLAIM} claim: ask the issuer for an organization "
            "token, which names the tenant")
    user = claims.get("sub")
    if not isinstance(user, str) or not user:
        raise Unauthenticated("the token has no subject (sub)")
    raw = claims.get("scope", "")
    if isinstance(raw, str):
        entries = raw.split()
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        entries = list(raw)
    else:
        raise Unauthenticated("the token's scope claim is neither a string nor a list of strings")
    granted: dict[str, set[str]] = {"read": set(), "write": set(), "role": set()}
    for entry in entries:
        grant = scope_grant(entry)
        if grant is not None:
            granted[grant[0]].add(grant[1])
    return Identity(org, user, frozenset(granted["read"]), frozenset(granted["write"]),
                    frozenset(granted["role"]))


def scope_grant(entry: str) -> tuple[str, str] | None:
    """What one ``scope`` entry grants: ``("read", name)``, ``("write", name)`` or
    ``("role", role)``; None for an entry Engram ignores (``openid``, ``read:``)."""
    for kind, prefix in (("read", READ_PREFIX), ("write", WRITE_PREFIX)):
        if entry.startswith(prefix) and len(entry) > len(prefix):
            return kind, entry[len(prefix):]
    return ("role", ROLE_SCOPES[entry]) if entry in ROLE_SCOPES else None


def well_formed(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of ``token`` read without its signature: the shape checks every
    verification starts with, and what the CLI checks before it sends a token in a header
    (an error message stored in ENGRAM_TOKEN is no header value); ``Unauthenticated``
    saying what is wrong."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated("the bearer token is empty or too long")
    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except (InvalidTokenError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Unauthenticated(f"the bearer token is not a well-formed JWT: {exc}") from exc


@dataclass
class TokenVerifier:
    """Verifies bearer tokens against the trusted issuers' key sets."""

    audience: str
    leeway_s: float
    issuers: dict[str, KeySet] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenVerifier:
        from orchestrator.auth.devkey import dev_key_trusted, jwks_path

        verifier = cls(settings.auth_audience, settings.auth_leeway_s)
        if settings.auth_issuer:
            verifier.issuers[settings.auth_issuer] = KeySet(
                url_fetcher(jwks_url(settings) or ""), ttl_s=settings.auth_jwks_ttl_s,
                min_refresh_s=settings.auth_jwks_min_refresh_s, grace_s=settings.auth_jwks_grace_s,
                retry_max_s=settings.auth_jwks_retry_max_s, name=f"issuer {settings.auth_issuer}")
        if dev_key_trusted(settings):
            # Re-read the file on an unknown kid, so a new dev key needs no restart.
            verifier.issuers[settings.auth_dev_issuer] = KeySet(
                file_fetcher(jwks_path(settings)), ttl_s=settings.auth_jwks_ttl_s, min_refresh_s=0.0)
        return verifier

    def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``; ``Unauthenticated`` naming the failed check."""
        header, unverified = well_formed(token)
        alg = header.get("alg")
        if alg not in ALLOWED_ALGORITHMS:
            raise Unauthenticated(
                f"token algorithm {alg!r} is not allowed; Engram accepts {', '.join(ALLOWED_ALGORITHMS)}")
        own_key = sorted(KEY_HEADERS & set(header))
        if own_key:
            raise Unauthenticated(
                f"the token names its own key ({', '.join(own_key)}); Engram takes keys only from "
                "the configured issuer's key set")
        issuer = unverified.get("iss")
        keys = self.issuers.get(issuer) if isinstance(issuer, str) else None
        if keys is None:
            raise Unauthenticated(f"token issuer {issuer!r} is not trusted by this server")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthenticated("the token header names no signing key (kid)")
        key = keys.key(kid, alg)
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], audience=self.audience, issuer=issuer,
                leeway=self.leeway_s, options={"require": ["exp", "iss", "aud", "sub"]})
        except InvalidSignatureError as exc:
            raise Unauthenticated("the token's signature does not verify") from exc
        except ExpiredSignatureError as exc:
            raise Unauthenticated(f"{EXPIRED}{_expired_when(unverified.get('exp'))}") from exc
        except ImmatureSignatureError as exc:
            raise Unauthenticated("the token is not valid yet (nbf/iat in the future)") from exc
        except InvalidAudienceError as exc:
            raise Unauthenticated(
                f"the token is not meant for this API (audience must be {self.audience!r})") from exc
        except InvalidIssuerError as exc:
            raise Unauthenticated("the token's issuer does not match") from exc
        except MissingRequiredClaimError as exc:
            raise Unauthenticated(f"the token lacks the {exc.claim!r} claim") from exc
        except InvalidTokenError as exc:
            raise Unauthenticated(f"the token is invalid: {exc}") from exc
        return claims

    def verify(self, token: str) -> Identity:
        return identity_from_claims(self.claims(token))


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer ...`` header value."""
    if not authorization:
        raise Unauthenticated("no bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()


# How a refusal of an expired token begins (the CLI adds where a new one comes from).
EXPIRED = "the token has expired"


def _expired_when(exp: Any) -> str:
    """" (at 2026-12-05 20:03:11 UTC, 34 min ago)" for a token's ``exp``; the holder's own
    claim, read only to say when (the token was refused on its signature-checked ``exp``)."""
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return ""
    try:
        when = datetime.fromtimestamp(exp, UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    ago = max(0, int(time.time() - exp))
    span = (f"{ago} s" if ago < 120 else f"{ago // 60} min" if ago < 7200
            else f"{ago // 3600} h" if ago < 172800 else f"{ago // 86400} days")
    return f" (at {when:%Y-%m-%d %H:%M:%S} UTC, {span} ago)"
