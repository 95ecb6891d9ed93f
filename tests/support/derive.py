"""Fixtures shared by the derive tests."""

from __future__ import annotations

import pytest

from orchestrator.auth.devkey import create_dev_key
from orchestrator.config import Settings


@pytest.fixture(scope="module")
def cli_env(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    key = tmp_path_factory.mktemp("derive-auth") / "dev-signing-key.pem"
    env = {"ENGRAM_HOME": str(settings.home), "ENGRAM_DB_PORT": str(settings.db_port),
           "ENGRAM_DB_NAME": settings.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(key),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true"}
    for name in ("database_url", "app_password"):
        value = getattr(settings, name)
        if value:
            env[f"ENGRAM_{name.upper()}"] = value
    create_dev_key(Settings(home=settings.home, auth_dev_key_path=key))
    return env
