"""What ``ENGRAM_ENV=production`` demands of a server before it answers a request.

A production API that cannot verify tokens answers every request with 401 and
says nothing at startup; one that trusts the development key accepts tokens that
anyone holding a laptop's key file can mint. ``check_production`` turns both into
a refusal to start, with the setting to fix named. Problems that do not make the
server wrong but are worth an operator's eye (an issuer over plain HTTP, the
explorer switched back on) come back as warnings.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from orchestrator.config.settings import Settings
from orchestrator.errors import Misconfigured

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def jwks_url(settings: Settings) -> str | None:
    """The issuer's JWKS: ``auth_jwks_url``, or ``<issuer>/jwks`` (Logto's layout)."""
    if settings.auth_jwks_url:
        return settings.auth_jwks_url
    if settings.auth_issuer:
        return settings.auth_issuer.rstrip("/") + "/jwks"
    return None


def check_production(settings: Settings) -> list[str]:
    """Raise ``Misconfigured`` when a production server would be wrong; return warnings.

    Development settings pass unchecked (an empty list).
    """
    if settings.env != "production":
        return []
    problems: list[str] = []
    if not settings.auth_issuer:
        problems.append(
            "ENGRAM_AUTH_ISSUER is not set: no token could be verified and every request would "
            "get 401. Set it to your OIDC issuer (Logto: https://<tenant>.logto.app/oidc), with "
            "ENGRAM_AUTH_AUDIENCE (the API resource indicator) and, if the keys are not at "
            "<issuer>/jwks, ENGRAM_AUTH_JWKS_URL")
    if settings.auth_trust_dev_key:
        problems.append(
            "ENGRAM_AUTH_TRUST_DEV_KEY is true: a production server never trusts the local "
            "development key (anyone with the key file could mint tokens); unset it")
    for name, url in (("ENGRAM_AUTH_ISSUER", settings.auth_issuer),
                      ("ENGRAM_AUTH_JWKS_URL", settings.auth_jwks_url)):
        if url and urlsplit(url).scheme not in ("https", "http"):
            problems.append(f"{name} must be an http(s) URL, not {url!r}")
    if problems:
        raise Misconfigured("ENGRAM_ENV=production and the server cannot start: "
                            + "; ".join(problems))
    warnings: list[str] = []
    keys = jwks_url(settings)
    if keys:
        parts = urlsplit(keys)
        if parts.scheme == "http" and parts.hostname not in LOOPBACK:
            warnings.append(f"the JWKS {keys} is fetched over plain HTTP; anyone on the path "
                            "could swap the signing keys (use https outside a private network)")
    if settings.api_graphiql:
        warnings.append("ENGRAM_API_GRAPHIQL=true: the GraphiQL explorer is on in production")
    if settings.api_introspection:
        warnings.append("ENGRAM_API_INTROSPECTION=true: schema introspection is on in production")
    return warnings
