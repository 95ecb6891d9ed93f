"""Token verification against an issuer's JWKS served over real HTTP (RS256, ES256, EdDSA),
key rotation (refresh on unknown kid), the refresh rate limit, the scope mapping, and the
``engram auth`` commands."""

from __future__ import annotations

import json
import logging
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from orchestrator.auth.devkey import jwks_path, key_path
from orchestrator.auth.jwks import KeySet, file_fetcher, url_fetcher
from orchestrator.auth.tokens import TokenVerifier, identity_from_claims
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.db.server import free_port
from orchestrator.errors import Forbidden, Unauthenticated
from tests.support.issuer import AUDIENCE, Issuer


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    iss = Issuer()
    iss.start()
    try:
        yield iss
    finally:
        iss.stop()


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
    # A scope entry that would grant nothing is refused, not minted into a token that reads
    # nothing ("team" for "read:team" was minted, and whoami said "read: -").
    result = runner.invoke(app, ["auth", "token", "--tenant", "org-9", "--scopes",
                                 "team,write:notes,read:"], env=env)
    assert result.exit_code == 2 and result.output.startswith(
        "error: scope entries 'team', 'read:' would grant nothing: a scope is granted as "
        "read:NAME or write:NAME (e.g. read:team)"), result.output
    result = runner.invoke(app, ["auth", "token", "--tenant", "org-9", "--scopes",
                                 "read:team engram:auditor"], env=env)
    assert result.exit_code == 0 and result.output.count(".") == 2
    # The recall commands' option names mint the same token (`engram recall --org X --as U`).
    result = runner.invoke(app, ["auth", "token", "--org", "org-9", "--as", "ann",
                                 "--scopes", "read:team"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["auth", "whoami", "--token", result.output.strip()], env=env)
    assert "organization org-9, user ann" in result.output


def _outage_verifier(issuer: Issuer, now: list[float]) -> tuple[TokenVerifier, KeySet]:
    """The issuer's key set over real HTTP with a clock the test moves: ttl 600 s, grace 3600 s,
    back-off 10 s doubling to 80 s."""
    keys = KeySet(url_fetcher(issuer.jwks_url, timeout_s=2.0), ttl_s=600, min_refresh_s=10,
                  grace_s=3600, retry_max_s=80, name=f"issuer {issuer.issuer}", clock=lambda: now[0])
    return TokenVerifier(AUDIENCE, 30.0, {issuer.issuer: keys}), keys


def test_an_issuer_outage_keeps_cached_keys_for_the_grace_period_and_backs_off(
        issuer: Issuer, caplog: pytest.LogCaptureFixture) -> None:
    issuer.add("k1", "ES256")
    now = [0.0]
    verifier, keys = _outage_verifier(issuer, now)
    token = issuer.sign("k1")
    assert verifier.verify(token).user_id == "user-1" and keys.fetches == 1
    issuer.stop()
    caplog.set_level(logging.INFO, logger="engram.auth.jwks")
    now[0] = 601.0  # the cache is stale; the refresh fails
    for _ in range(20):
        assert verifier.verify(token).user_id == "user-1"
    assert keys.fetches == 2, "one failed fetch, then back-off: not one per request"
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "could not be read" in warning.getMessage() and "cached key" in warning.getMessage()
    # One request a second for 399 s: retries 10, 20 and 40 s apart, then every 80 s (at 611,
    # 631, 671, 751, 831, 911 and 991), seven fetches where a naive cache would make 399.
    for step in range(1, 400):
        now[0] = 601.0 + step
        verifier.verify(token)
    assert keys.fetches == 2 + 7, keys.fetches
    # Past the grace period the cached keys are refused, still without a fetch per request.
    now[0] = 600 + 3600 + 1
    fetches = keys.fetches
    for _ in range(5):
        with pytest.raises(Unauthenticated, match=r"could not be read.*next try in"):
            verifier.verify(token)
    assert keys.fetches == fetches + 1
    assert any(r.levelno == logging.ERROR and "grace period" in r.getMessage() for r in caplog.records)
    # The issuer is back: the next try after the back-off reads the keys again.
    issuer.start()
    now[0] += 81
    assert verifier.verify(token).user_id == "user-1"
    assert any("readable again" in r.getMessage() for r in caplog.records)
    fetches = keys.fetches
    verifier.verify(token)
    assert keys.fetches == fetches, "fresh again: served from the cache"


def test_an_unknown_kid_during_an_outage_is_refused_without_refetching(issuer: Issuer) -> None:
    issuer.add("k1", "ES256")
    now = [0.0]
    verifier, keys = _outage_verifier(issuer, now)
    verifier.verify(issuer.sign("k1"))
    issuer.stop()
    now[0] = 601.0
    verifier.verify(issuer.sign("k1"))
    issuer.add("k2", "ES256")  # rotated while the issuer is unreachable
    for _ in range(5):
        with pytest.raises(Unauthenticated, match="'k2' is not in the issuer's key set"):
            verifier.verify(issuer.sign("k2"))
    assert keys.fetches == 2


def test_concurrent_lookups_during_a_slow_refresh_answer_from_the_cache(issuer: Issuer) -> None:
    issuer.add("k1", "ES256")
    now = [0.0]
    verifier, keys = _outage_verifier(issuer, now)
    token = issuer.sign("k1")
    verifier.verify(token)
    issuer.answering.clear()  # the issuer hangs
    now[0] = 601.0
    slow = threading.Thread(target=verifier.verify, args=(token,))
    slow.start()
    assert issuer.waiting.wait(10), "the refresh did not reach the issuer"
    # While one thread waits on the issuer, the others are not queued behind it.
    assert [verifier.verify(token).user_id for _ in range(5)] == ["user-1"] * 5
    issuer.answering.set()
    slow.join(timeout=10)
    assert not slow.is_alive() and keys.fetches == 2


def test_a_development_key_set_not_made_yet_is_a_warning_with_the_command_to_make_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A fresh `engram up` before `engram auth dev-key`: a warning naming the command, not an
    error; tokens are refused with the same words until the file exists, then read."""
    path = tmp_path / "dev-jwks.json"
    keys = KeySet(file_fetcher(path), min_refresh_s=0.0)
    caplog.set_level(logging.INFO, logger="engram.auth.jwks")
    keys.prefetch()
    [record] = [r for r in caplog.records if r.name == "engram.auth.jwks"]
    assert record.levelno == logging.WARNING and "engram auth dev-key" in record.getMessage()
    assert record.getMessage().endswith("read again on the next token")  # not "next try in 0.0 s"
    with pytest.raises(Unauthenticated, match=r"does not exist yet.*\(read again on the next token\)"):
        keys.jwk("k1")
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256"}]}))
    assert keys.jwk("k1")["kid"] == "k1"

