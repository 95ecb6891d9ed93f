"""Key sets a token may be checked against, cached and refreshed on unknown ``kid``.

A ``KeySet`` wraps one source of JSON Web Keys: an issuer's JWKS URL (fetched
with httpx) or a local file (the development key's JWKS). Keys are cached for
``ttl_s``; a token naming a ``kid`` the cache does not hold triggers one refresh,
because issuers rotate keys by publishing the new one before signing with it.
Refreshes caused by unknown kids are rate limited (``min_refresh_s``) so that a
stream of forged kids cannot turn every request into a fetch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from orchestrator.errors import Unauthenticated

Fetch = Callable[[], dict[str, Any]]


def url_fetcher(url: str, timeout_s: float = 5.0) -> Fetch:
    def fetch() -> dict[str, Any]:
        try:
            response = httpx.get(url, timeout=timeout_s, follow_redirects=False)
            response.raise_for_status()
            data: dict[str, Any] = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise Unauthenticated(f"the issuer's key set at {url} could not be read: {exc}") from exc
        return data

    return fetch


def file_fetcher(path: Path) -> Fetch:
    def fetch() -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise Unauthenticated(f"the key set {path} could not be read: {exc}") from exc
        return data

    return fetch


class KeySet:
    def __init__(self, fetch: Fetch, *, ttl_s: float = 600.0, min_refresh_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._keys: dict[str, dict[str, Any]] = {}
        self._loaded_at: float | None = None
        self._lock = threading.Lock()
        self.fetches = 0

    def _refresh(self) -> None:
        data = self._fetch()
        self.fetches += 1
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, list):
            raise Unauthenticated("the issuer's key set has no 'keys' list")
        self._keys = {str(k["kid"]): k for k in keys if isinstance(k, dict) and "kid" in k}
        self._loaded_at = self._clock()

    def jwk(self, kid: str) -> dict[str, Any]:
        """The JSON Web Key with this kid, refreshing the cache when it is stale or lacks it."""
        with self._lock:
            now = self._clock()
            stale = self._loaded_at is None or now - self._loaded_at > self._ttl_s
            may_refresh = self._loaded_at is None or now - self._loaded_at >= self._min_refresh_s
            if stale or (kid not in self._keys and may_refresh):
                self._refresh()
            found = self._keys.get(kid)
        if found is None:
            raise Unauthenticated(f"the token's signing key {kid!r} is not in the issuer's key set")
        return found

    def key(self, kid: str, algorithm: str) -> PyJWK:
        jwk = self.jwk(kid)
        declared = jwk.get("alg")
        if declared is not None and declared != algorithm:
            raise Unauthenticated(
                f"the token says algorithm {algorithm} but key {kid!r} is for {declared}")
        try:
            return PyJWK(jwk, algorithm=algorithm)
        except PyJWKError as exc:
            raise Unauthenticated(f"key {kid!r} cannot verify {algorithm} signatures: {exc}") from exc
