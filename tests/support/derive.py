"""Fixtures shared by the derive tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from orchestrator.auth.devkey import create_dev_key
from orchestrator.config import Settings
from orchestrator.db.server import free_port

T = TypeVar("T")
Progress = Callable[[int, int], None]


@pytest.fixture(scope="module")
def cli_env(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    key = tmp_path_factory.mktemp("derive-auth") / "dev-signing-key.pem"
    # ENGRAM_API_URL: a port nothing listens on, so `engram recall` never asks a server some
    # other program runs on the default port (tests that want one serve their own).
    env = {"ENGRAM_HOME": str(settings.home), "ENGRAM_DB_PORT": str(settings.db_port),
           "ENGRAM_DB_NAME": settings.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(key),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true",
           "ENGRAM_API_URL": f"http://127.0.0.1:{free_port()}"}
    for name in ("database_url", "app_password"):
        value = getattr(settings, name)
        if value:
            env[f"ENGRAM_{name.upper()}"] = value
    create_dev_key(Settings(home=settings.home, auth_dev_key_path=key))
    return env


def race(run: Callable[[Progress], T], runs: int = 2, meet_s: float = 1.5) -> list[T]:
    """``runs`` calls of ``run`` at once, each in its own thread (its own connection).

    ``run`` gets a progress callback for the job; its first call waits (at most
    ``meet_s``) until every run has reached the same point. Without a lock all
    runs get there having read the same stored state, and each then writes what
    it planned, which is the duplicate the job lock prevents; with the lock the
    second run waits in the lock, the first one's wait times out, it commits, and
    the second run reads the first one's rows. Exceptions are re-raised.
    """
    meet = threading.Barrier(runs, timeout=meet_s)
    results: list[T | BaseException | None] = [None] * runs

    def progress(done: int, total: int) -> None:
        if not getattr(local, "met", False):
            local.met = True
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait()

    local = threading.local()

    def one(i: int) -> None:
        try:
            results[i] = run(progress)
        except BaseException as exc:  # handed to the test thread below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    out: list[T] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        out.append(r)  # type: ignore[arg-type]
    return out
