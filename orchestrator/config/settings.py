"""Engram's settings, read from ``ENGRAM_*`` environment variables.

There is exactly one settings object per process (``get_settings``); tests and
the CLI build their own with ``Settings(...)`` when they need other values.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    """Where Engram keeps its data when ``ENGRAM_HOME`` is not set.

    For an ordinary user this is the platform's user data directory. For root it
    is ``/var/lib/engram``: the embedded server then runs as an unprivileged
    system user, which must be able to reach its data directory, and root's home
    is normally closed to other users.
    """
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/engram")
    return Path(platformdirs.user_data_dir("engram", appauthor=False))


class Settings(BaseSettings):
    """All configuration; every field maps to ``ENGRAM_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    # An external server: the URL of a role that may run migrations (it creates
    # roles, so a superuser or a role with CREATEROLE and the database's owner).
    database_url: str | None = None
    # Password of engram_app on an external server; generated for the embedded one.
    app_password: str | None = None
    auditor_password: str | None = None

    db_host: str = "127.0.0.1"
    db_port: int = 54329
    db_name: str = "engram"
    # Name of the unprivileged system user the embedded server runs as under root.
    db_system_user: str = "engram-postgres"
    db_start_timeout_s: float = 60.0

    chunk_size_chars: int = 1200
    chunk_overlap_chars: int = 150
    max_document_chars: int = 2_000_000
    max_title_chars: int = 500

    embedding_dimension: int = 384

    @property
    def data_dir(self) -> Path:
        return self.home / "pgdata"

    @property
    def runtime_dir(self) -> Path:
        return self.home / "run"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
