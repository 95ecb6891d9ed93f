"""A throwaway embedded database: a fresh cluster in a temporary home, migrated.

For benchmarks and experiments that must not touch the user's own Engram. The
temporary directory is opened for traversal because, under root, the server
runs as an unprivileged user that must reach its data directory. A SIGTERM (a
benchmark stopped with ``kill``) stops the server and deletes the directory as a
normal exit does: before, it left a PostgreSQL server running per killed run.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.config import Settings
from orchestrator.db.engine import Database
from orchestrator.db.migrate import migrate
from orchestrator.db.server import free_port


@contextmanager
def scratch_database(db_name: str = "engram_bench", **settings: Any) -> Iterator[Database]:
    """Start, migrate and yield a fresh embedded database; stop and delete it afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="engram-scratch-"))
    tmp.chmod(0o755)
    db = Database(Settings(home=tmp / "home", db_port=free_port(), db_name=db_name, **settings))
    # Signal handlers can only be set from the main thread; elsewhere a kill stops the process
    # as before (the caller's own handling applies).
    previous = (signal.signal(signal.SIGTERM, _exit_on_term)
                if threading.current_thread() is threading.main_thread() else None)
    try:
        db.start_embedded()
        migrate(db)
        yield db
    finally:
        if db.server.pid() is not None:
            db.server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: Any) -> None:
    """SIGTERM as an exit, so the ``finally`` above runs (status 143, as a killed process)."""
    raise SystemExit(128 + signum)
