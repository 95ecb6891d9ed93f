"""Console sign-in through an OIDC issuer: the authorization-code redirect with PKCE, over real
HTTP against a small issuer (its authorize and token endpoints written here), and what the
console refuses: a callback it did not start, a code the issuer will not exchange, a token for
another audience, and pasted tokens in production when an issuer is configured."""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import pytest
from sqlalchemy import Engine
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from orchestrator.config import Settings
from tests.conftest import TenantFixture
from tests.support.api import ApiServer, api_settings, serve
from tests.support.issuer import AUDIENCE, Issuer

CLIENT = "engram-console"


class Provider:
    """The authorization server's half: codes bound to a PKCE challenge, exchanged once."""

    def __init__(self, issuer: Issuer, org: str) -> None:
        self.issuer, self.org = issuer, org
        self.codes: dict[str, dict[str, str]] = {}
        self.audience = AUDIENCE
        self.authorize_params: dict[str, str] = {}

    def routes(self) -> list[Route]:
        async def discovery(_: Request) -> Response:
            base = self.issuer.issuer
            return JSONResponse({"issuer": base, "authorization_endpoint": f"{base}/auth",
                                 "token_endpoint": f"{base}/token", "jwks_uri": f"{base}/jwks"})

        async def authorize(request: Request) -> Response:
            p = dict(request.query_params)
            self.authorize_params = p
            if p.get("client_id") != CLIENT or p.get("code_challenge_method") != "S256":
                return JSONResponse({"error": "invalid_request"}, status_code=400)
            code = secrets.token_urlsafe(16)
            self.codes[code] = p
            query = urlencode({"code": code, "state": p["state"]})
            return RedirectResponse(f"{p['redirect_uri']}?{query}", status_code=302)

        async def token(request: Request) -> Response:
            form = await request.form()
            asked = self.codes.pop(str(form.get("code")), None)
            digest = hashlib.sha256(str(form.get("code_verifier")).encode()).digest()
            challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if asked is None or asked["code_challenge"] != challenge or \
                    asked["redirect_uri"] != form.get("redirect_uri"):
                return JSONResponse({"error": "invalid_grant",
                                     "error_description": "unknown code or wrong verifier"},
                                    status_code=400)
            return JSONResponse({"token_type": "Bearer", "access_token": self.issuer.sign(
                "k1", sub="olivia", organization_id=self.org, scope="openid read:team",
                aud=self.audience)})

        return [Route("/oidc/.well-known/openid-configuration", discovery),
                Route("/oidc/auth", authorize), Route("/oidc/token", token, methods=["POST"])]


@pytest.fixture(scope="module")
def oidc(tenant_factory: Callable[..., TenantFixture], settings: Settings, app_engine: Engine,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Provider]]:
    t = tenant_factory("team")
    issuer = Issuer()
    issuer.add("k1", "ES256")
    provider = Provider(issuer, t.org_id)
    issuer.start(provider.routes())
    s = api_settings(settings, tmp_path_factory.mktemp("oidc-home"), auth_issuer=issuer.issuer,
                     auth_audience=AUDIENCE, console_oidc_client_id=CLIENT,
                     env="production", auth_trust_dev_key=False)
    try:
        with serve(s, app_engine) as server:
            yield server, provider
    finally:
        issuer.stop()


def test_sign_in_through_the_issuer(oidc: tuple[ApiServer, Provider]) -> None:
    server, provider = oidc
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        page = browser.get("/console/signin")
        assert "/console/signin/oidc" in page.text and 'name="token"' not in page.text
        done = browser.get("/console/signin/oidc", follow_redirects=True)
        assert done.status_code == 200 and done.url.path == "/console/recall", done.text[:400]
        assert "olivia @" in done.text
        assert provider.authorize_params["resource"] == AUDIENCE
        assert provider.authorize_params["redirect_uri"] == f"{server.url}/console/callback"
        # The cookie now carries the issuer's token: pages open without signing in again.
        assert browser.get("/console/operations").status_code == 200


def test_the_console_refuses_what_it_did_not_start(oidc: tuple[ApiServer, Provider]) -> None:
    server, provider = oidc
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        forged = browser.get("/console/callback?code=abc&state=nobody-started-this")
        assert forged.status_code == 400 and "not started here" in forged.text
        start = browser.get("/console/signin/oidc")
        authorize = httpx.get(start.headers["location"], timeout=30)
        back = urlparse(authorize.headers["location"])
        code = parse_qs(back.query)["code"][0]
        state = parse_qs(back.query)["state"][0]
        provider.codes.pop(code)  # the issuer will not exchange it (used, expired)
        refused = browser.get(f"/console/callback?code={code}&state={state}")
        assert refused.status_code == 400 and "unknown code or wrong verifier" in refused.text
        denied = browser.get("/console/callback?error=access_denied&error_description=no+thanks")
        assert denied.status_code == 400 and "no thanks" in denied.text
        assert browser.get("/console/operations").status_code == 303  # still signed out


def test_a_token_for_another_audience_is_refused(oidc: tuple[ApiServer, Provider]) -> None:
    server, provider = oidc
    provider.audience = "https://someone-else.example/api"
    try:
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            done = browser.get("/console/signin/oidc", follow_redirects=True)
            assert done.status_code == 400 and "refused" in done.text
    finally:
        provider.audience = AUDIENCE


def test_pasting_a_token_is_off_in_production_with_an_issuer(oidc: tuple[ApiServer, Provider]
                                                             ) -> None:
    server, provider = oidc
    token: Any = provider.issuer.sign("k1", sub="olivia", organization_id=provider.org,
                                      scope="read:team")
    response = httpx.post(f"{server.url}/console/signin", data={"token": token},
                          headers={"origin": server.url}, timeout=30)
    assert response.status_code == 400 and "pasting a token is off" in response.text
    # And a form posted from another site is refused whatever it carries.
    response = httpx.post(f"{server.url}/console/signin", data={"token": token},
                          headers={"origin": "https://evil.example"}, timeout=30)
    assert response.status_code == 403
