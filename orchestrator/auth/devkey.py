"""The local development signing key and the tokens it mints.

``engram auth dev-key`` writes an ES256 (P-256) private key under
``ENGRAM_HOME/auth`` with mode 0600 and its public JWKS beside it. The server
trusts tokens signed by it only when ``auth_trust_dev_key`` says so, or, left
unset, when the database is the embedded one and ``ENGRAM_ENV`` is not production
(a laptop, not a deployment).
Tokens minted here go through exactly the same verification as an issuer's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from jwt.utils import base64url_encode

from orchestrator.config import Settings
from orchestrator.errors import BadInput, Conflict, NotFound

DEV_ALGORITHM = "ES256"


def key_path(settings: Settings) -> Path:
    return settings.auth_dev_key_path or settings.home / "auth" / "dev-signing-key.pem"


def jwks_path(settings: Settings) -> Path:
    return key_path(settings).with_name("dev-jwks.json")


def dev_key_trusted(settings: Settings) -> bool:
    """Trusted when set so; unset: only on a development server with the embedded database.
    (``engram serve`` in production refuses to start when it is set true.)"""
    if settings.auth_trust_dev_key is not None:
        return settings.auth_trust_dev_key
    return settings.env != "production" and not settings.database_url


def _thumbprint_kid(public_jwk: dict[str, Any]) -> str:
    # RFC 7638: the SHA-256 of the required members in lexicographic order.
    members = {k: public_jwk[k] for k in ("crv", "kty", "x", "y")}
    digest = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode())
    return base64url_encode(digest.digest()).decode()


def create_dev_key(settings: Settings, *, force: bool = False) -> Path:
    """Write a new development key and its JWKS; refuses to replace one unless ``force``."""
    path = key_path(settings)
    if path.exists() and not force:
        raise Conflict(f"a development key already exists at {path}; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    tmp = path.with_suffix(".tmp")
    # Create with 0600 from the start: a chmod after writing leaves a window.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.replace(tmp, path)
    public_jwk: dict[str, Any] = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    public_jwk.update(kid=_thumbprint_kid(public_jwk), alg=DEV_ALGORITHM, use="sig")
    jwks_path(settings).write_text(json.dumps({"keys": [public_jwk]}, indent=2) + "\n")
    return path


def _private_key(settings: Settings) -> tuple[ec.EllipticCurvePrivateKey, str]:
    path = key_path(settings)
    if not path.exists():
        raise NotFound(f"no development key at {path}; run `engram auth dev-key` first")
    private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise BadInput(f"{path} is not an EC private key")
    public_jwk: dict[str, Any] = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    return private, _thumbprint_kid(public_jwk)


def mint_token(settings: Settings, *, tenant: str, user: str, scopes: list[str],
               ttl_s: int = 3600, extra: dict[str, Any] | None = None) -> str:
    """A token for ``tenant``/``user`` with OAuth-style scopes (``read:team write:team``)."""
    if ttl_s <= 0:
        raise BadInput("the token lifetime must be positive")
    if not tenant or not user:
        raise BadInput("a token needs a tenant (organization id) and a user")
    private, kid = _private_key(settings)
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": settings.auth_dev_issuer, "aud": settings.auth_audience, "sub": user,
        "organization_id": tenant, "scope": " ".join(scopes), "iat": now, "nbf": now,
        "exp": now + ttl_s, "jti": str(uuid.uuid4()),
    }
    claims.update(extra or {})
    return jwt.encode(claims, private, algorithm=DEV_ALGORITHM, headers={"kid": kid})
