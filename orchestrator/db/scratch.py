"""A throwaway embedded database: a fresh cluster in a temporary home, migrated.

For benchmarks and experiments that must not touch the user's own Engram. The
temporary directory is opened for traversal because, under root, the server
runs as an unprivileged user that must reach its data directory.
"""

from __future__ import annotations

import shutil
import tempfile
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
    try:
        db.start_embedded()
        migrate(db)
        yield db
    finally:
        if db.server.pid() is not None:
            db.server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
