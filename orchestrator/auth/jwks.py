"""Key sets a token may be checked against, cached and refreshed on unknown ``kid``.

A ``KeySet`` wraps one source of JSON Web Keys: an issuer's JWKS URL (fetched
with httpx) or a local file (the development key's JWKS). Keys are cached for
``ttl_s``; a token naming a ``kid`` the cache does not hold triggers one refresh,
because issuers rotate keys by publishing the new one before signing with it.
Refreshes caused by unknown kids are rate limited (``min_refresh_s``) so that a
stream of forged kids cannot turn every request into a fetch.

When a refresh fails (the issuer is down), the set keeps answering from the
keys it holds for ``grace_s`` past their expiry, and logs it; the next fetch
waits ``min_refresh_s``, doubling after each failure up to ``retry_max_s``, so
an outage costs one fetch per back-off step, never one per request. Past the
grace period the cached keys are refused. Only one thread fetches at a time;
the others answer from the cache meanwhile, or wait when it cannot answer.
Fetches run in the caller's thread: the API calls ``verify`` off its event loop.
"""

from __future__ import annotations

import json
import logging
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
log = logging.getLogger("engram.auth.jwks")


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


def _next_try(wait_s: float) -> str:
    """When the key set is read again: a local file with no back-off is read on every token."""
    if wait_s < 0.05:
        return "read again on the next token"
    return f"next try in {wait_s:.1f} s" if wait_s < 10 else f"next try in {wait_s:.0f} s"


class KeySetMissing(Unauthenticated):
    """A key set file that does not exist yet (the development key before `engram auth dev-key`)."""


def file_fetcher(path: Path) -> Fetch:
    def fetch() -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise KeySetMissing(f"the key set {path} does not exist yet (`engram auth dev-key` "
                                "writes the development key and its key set); tokens signed "
                                "by it are refused until then") from exc
        except (OSError, ValueError) as exc:
            raise Unauthenticated(f"the key set {path} could not be read: {exc}") from exc
        return data

    return fetch


class KeySet:
    def __init__(self, fetch: Fetch, *, ttl_s: float = 600.0, min_refresh_s: float = 10.0,
                 grace_s: float = 3600.0, retry_max_s: float = 300.0, name: str = "the issuer",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._min_refresh_s = min_refresh_s
        self._grace_s = grace_s
        self._retry_max_s = max(retry_max_s, min_refresh_s)
        self._name = name
        self._clock = clock
        self._keys: dict[str, dict[str, Any]] = {}
        self._loaded_at: float | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: Unauthenticated | None = None
        self._fetching = False
        self._cond = threading.Condition()
        self.fetches = 0

    def prefetch(self) -> None:
        """Read the key set now, if it was never read (at start, so the first token checked
        does not wait for the fetch); a failure is logged and backs off like any other."""
        with self._cond:
            if self._loaded_at is not None or self._fetching or self._clock() < self._retry_at:
                return
            self._fetching = True
        try:
            self._refresh()
        finally:
            with self._cond:
                self._fetching = False
                self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """For readiness: ``ok`` (keys fresh, or none needed yet), ``retrying`` (the last
        fetch failed; cached keys answer until their grace ends) or ``failing`` (it failed
        and no cached key can answer). The error itself goes to the log, not here."""
        with self._cond:
            now = self._clock()
            if self._last_error is None:
                state = "ok"
            elif self._loaded_at is not None and now - self._loaded_at <= self._ttl_s + self._grace_s:
                state = "retrying"
            else:
                state = "failing"
            return {"state": state, "keys": len(self._keys), "failures": self._failures,
                    "next_try_in_s": round(max(0.0, self._retry_at - now), 1) if self._failures else None}

    def _wanted(self, kid: str, now: float) -> bool:
        """Whether this lookup should fetch now (called holding the lock)."""
        if now < self._retry_at:
            return False
        if self._loaded_at is None or now - self._loaded_at > self._ttl_s:
            return True
        return kid not in self._keys and now - self._loaded_at >= self._min_refresh_s

    def _usable(self, kid: str, now: float) -> bool:
        """Whether the cache may answer for ``kid`` without a fetch (called holding the lock)."""
        return (kid in self._keys and self._loaded_at is not None
                and now - self._loaded_at <= self._ttl_s + self._grace_s)

    def _refresh(self) -> None:
        """One fetch, outside the lock; records the keys or the failure and its back-off."""
        try:
            data = self._fetch()
            keys = data.get("keys") if isinstance(data, dict) else None
            if not isinstance(keys, list):
                raise Unauthenticated(f"{self._name}'s key set has no 'keys' list")
            fresh = {str(k["kid"]): k for k in keys if isinstance(k, dict) and "kid" in k}
        except Unauthenticated as exc:
            with self._cond:
                self.fetches += 1
                self._failures += 1
                wait = min(self._retry_max_s, self._min_refresh_s * 2 ** (self._failures - 1))
                now = self._clock()
                self._retry_at = now + wait
                self._last_error = exc
                if self._loaded_at is not None:
                    left = self._loaded_at + self._ttl_s + self._grace_s - now
                    if left > 0:
                        log.warning("%s; serving the %d cached key(s) for up to %.0f s more; %s",
                                exc.message, len(self._keys), left, _next_try(wait))
                    else:
                        log.error("%s; the cached keys are past their grace period and refused; %s",
                                  exc.message, _next_try(wait))
                elif isinstance(exc, KeySetMissing):
                    log.warning("%s; %s", exc.message, _next_try(wait))
                else:
                    log.error("%s; %s", exc.message, _next_try(wait))
            return
        with self._cond:
            self.fetches += 1
            if self._failures:
                log.info("%s's key set is readable again after %d failed fetch(es)",
                         self._name, self._failures)
            self._keys = fresh
            self._loaded_at = self._clock()
            self._failures = 0
            self._retry_at = 0.0
            self._last_error = None

    def jwk(self, kid: str) -> dict[str, Any]:
        """The JSON Web Key with this kid, refreshing the cache when it is stale or lacks it."""
        with self._cond:
            while True:
                now = self._clock()
                if self._wanted(kid, now) and not self._fetching:
                    self._fetching = True
                    break
                if self._fetching and not self._usable(kid, now):
                    # Another thread is fetching what this lookup needs: wait for its result.
                    self._cond.wait()
                    continue
                return self._answer(kid, now)
        try:
            self._refresh()
        finally:
            with self._cond:
                self._fetching = False
                self._cond.notify_all()
        with self._cond:
            return self._answer(kid, self._clock())

    def _answer(self, kid: str, now: float) -> dict[str, Any]:
        """The cached key for ``kid``, or the refusal that says why not (holding the lock)."""
        if self._usable(kid, now):
            return self._keys[kid]
        if self._last_error is not None and (self._loaded_at is None or kid in self._keys):
            # The keys could not be (re)read and the cache cannot answer: say so.
            raise Unauthenticated(f"{self._last_error.message} "
                                  f"({_next_try(max(0.0, self._retry_at - now))})")
        raise Unauthenticated(f"the token's signing key {kid!r} is not in the issuer's key set")

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
