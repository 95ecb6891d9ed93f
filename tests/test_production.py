"""``engram serve`` with ENGRAM_ENV=production, as a real process against a real issuer.

The issuer is a real HTTP server in this process serving a JWKS (tests/support/issuer.py);
the API is ``engram serve`` started as a child process, configured only through the
environment, exactly as docker/compose.yaml configures it. Checked: tokens signed by the
issuer's key are accepted; tokens of the local development key are refused even though
the key file exists where a development server would trust it; GraphiQL and
introspection are off; and a production server without an issuer, or told to trust the
development key, refuses to start with a message that names the setting.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.config import Settings
from orchestrator.db.server import free_port
from tests.conftest import TenantFixture
from tests.support.cli import ENGRAM, engram_env
from tests.support.issuer import AUDIENCE, Issuer

pytestmark = pytest.mark.slow

ME = "{ me { orgId userId readScopes } }"
INTROSPECTION = "{ __schema { queryType { name } } }"


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    iss = Issuer()
    iss.add("prod-key-1", "RS256")
    iss.start()
    try:
        yield iss
    finally:
        iss.stop()


@pytest.fixture(scope="module")
def dev_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("prod-home")
    return home


def _production_env(settings: Settings, issuer: Issuer, dev_key: Path, **extra: str) -> dict[str, str]:
    return engram_env(settings, ENGRAM_ENV="production", ENGRAM_AUTH_ISSUER=issuer.issuer,
                      ENGRAM_AUTH_AUDIENCE=AUDIENCE, ENGRAM_AUTH_JWKS_URL=issuer.jwks_url,
                      ENGRAM_AUTH_DEV_KEY_PATH=str(dev_key), **extra)


@pytest.fixture(scope="module")
def production_api(settings: Settings, issuer: Issuer, dev_home: Path
                   ) -> Iterator[tuple[str, Settings]]:
    # A development key where a development server would look for it: production must
    # still refuse its tokens.
    dev = Settings(home=dev_home, auth_dev_key_path=dev_home / "auth" / "dev-signing-key.pem")
    create_dev_key(dev)
    port = free_port()
    proc = subprocess.Popen(
        [ENGRAM, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=_production_env(settings, issuer, dev.auth_dev_key_path or Path()),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"engram serve exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engram serve did not answer /healthz"
            time.sleep(0.2)
        yield url, dev
    finally:
        proc.terminate()
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        # What it said at startup is part of the contract (docs/deployment.md).
        assert "production: tokens from " + issuer.issuer in output, output


def _post(url: str, token: str, query: str) -> httpx.Response:
    return httpx.post(f"{url}/graphql", json={"query": query},
                      headers={"authorization": f"Bearer {token}"}, timeout=60)


def test_issuer_tokens_are_accepted(production_api: tuple[str, Settings], issuer: Issuer,
                                    tenant_factory: object) -> None:
    url, _ = production_api
    tenant: TenantFixture = tenant_factory("team")  # type: ignore[operator]
    token = issuer.sign("prod-key-1", organization_id=tenant.org_id, sub="ops-1",
                        scope="openid read:team")
    response = _post(url, token, ME)
    assert response.status_code == 200, response.text
    assert response.json()["data"]["me"] == {"orgId": tenant.org_id, "userId": "ops-1",
                                             "readScopes": ["team"]}


def test_development_tokens_are_refused(production_api: tuple[str, Settings],
                                        tenant_factory: object) -> None:
    url, dev = production_api
    tenant: TenantFixture = tenant_factory("team")  # type: ignore[operator]
    token = mint_token(dev, tenant=tenant.org_id, user="alice", scopes=["read:team"])
    response = _post(url, token, ME)
    assert response.status_code == 401
    assert "engram-dev" in response.json()["errors"][0]["message"]
    assert "not trusted" in response.json()["errors"][0]["message"]


def test_tokens_for_another_audience_are_refused(production_api: tuple[str, Settings],
                                                 issuer: Issuer, tenant_factory: object) -> None:
    url, _ = production_api
    tenant: TenantFixture = tenant_factory("team")  # type: ignore[operator]
    token = issuer.sign("prod-key-1", organization_id=tenant.org_id, aud="https://other.example/api")
    assert _post(url, token, ME).status_code == 401


def test_introspection_and_graphiql_are_off(production_api: tuple[str, Settings], issuer: Issuer,
                                           tenant_factory: object) -> None:
    url, _ = production_api
    tenant: TenantFixture = tenant_factory("team")  # type: ignore[operator]
    token = issuer.sign("prod-key-1", organization_id=tenant.org_id, scope="read:team")
    body = _post(url, token, INTROSPECTION).json()
    assert body.get("data") is None and "introspection" in body["errors"][0]["message"].lower()
    explorer = httpx.get(f"{url}/graphql", headers={"accept": "text/html"}, timeout=10)
    assert explorer.status_code == 404 and "GraphiQL" in explorer.text


def _refused(settings: Settings, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    port = free_port()
    result = subprocess.run([ENGRAM, "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    # Nothing was listening at any point it could have been asked.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
    return result


def test_production_without_an_issuer_refuses_to_start(settings: Settings) -> None:
    result = _refused(settings, engram_env(settings, ENGRAM_ENV="production"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ENGRAM_AUTH_ISSUER is not set" in result.stderr
    assert "401" in result.stderr and "logto" in result.stderr.lower()


def test_production_never_trusts_the_development_key(settings: Settings, issuer: Issuer,
                                                    dev_home: Path) -> None:
    env = _production_env(settings, issuer, dev_home / "auth" / "dev-signing-key.pem",
                          ENGRAM_AUTH_TRUST_DEV_KEY="true")
    result = _refused(settings, env)
    assert result.returncode == 2 and "ENGRAM_AUTH_TRUST_DEV_KEY" in result.stderr, result.stderr


def test_a_bad_environment_name_is_one_clear_line(settings: Settings) -> None:
    result = _refused(settings, engram_env(settings, ENGRAM_ENV="prod"))
    assert result.returncode == 2
    assert "ENGRAM_ENV" in result.stderr and "production" in result.stderr
    assert "Traceback" not in result.stderr
