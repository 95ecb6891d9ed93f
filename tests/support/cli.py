"""Running ``engram`` as a real process against the session's test database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.config import Settings

ENGRAM = str(Path(sys.executable).with_name("engram"))


def engram_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment a child ``engram`` needs to reach ``settings``' database: the
    process's own environment without any ENGRAM_* of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(settings.home), ENGRAM_DB_PORT=str(settings.db_port),
               ENGRAM_DB_NAME=settings.db_name)
    for name in ("database_url", "app_password", "worker_password", "auditor_password"):
        value = getattr(settings, name)
        if value:
            env[f"ENGRAM_{name.upper()}"] = str(value)
    env.update(extra)
    return env
