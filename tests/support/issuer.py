"""A tiny OIDC-like issuer for token tests: its JWKS served over real HTTP at /oidc/jwks,
keys it can add (rotation), and an outage it can start and end (the server really stops)."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import jwt
import uvicorn
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchestrator.db.server import free_port

AUDIENCE = "https://engram.test/api"


class Issuer:
    def __init__(self) -> None:
        self.keys: dict[str, tuple[Any, str]] = {}
        self.public: list[dict[str, Any]] = []
        self.requests = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Cleared: JWKS requests wait until it is set again (a hanging issuer).
        self.answering = threading.Event()
        self.answering.set()
        self.waiting = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

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

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    def sign(self, kid: str, **claims: Any) -> str:
        private, alg = self.keys[kid]
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "user-1", "organization_id": "org-1",
                "scope": "openid read:team write:notes", "iat": now, "exp": now + 300}
        body.update(claims)
        return jwt.encode(body, private, algorithm=alg, headers={"kid": kid})

    def start(self, routes: list[Route] | None = None) -> None:
        """Serve the JWKS (and ``routes``, e.g. an authorization endpoint) until ``stop``."""
        async def jwks(_: Request) -> JSONResponse:
            self.requests += 1
            if not self.answering.is_set():
                self.waiting.set()
                await anyio.to_thread.run_sync(self.answering.wait)
            return JSONResponse({"keys": self.public})

        self._server = uvicorn.Server(uvicorn.Config(
            Starlette(routes=[Route("/oidc/jwks", jwks), *(routes or [])]), host="127.0.0.1",
            port=self.port,
            log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        while not self._server.started:
            assert self._thread.is_alive(), "the issuer's server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        """The outage: nothing listens on the issuer's port any more."""
        if self._server is not None and self._thread is not None:
            self.answering.set()
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None
