"""Where the long-running commands (``engram serve``, ``up``, ``worker run``) log to.

Engram's own loggers (``engram.*``) go to stderr with a timestamp, at
``ENGRAM_LOG_LEVEL`` (default ``info``): readiness, reconnects and failed jobs
show there. Libraries keep their own configuration (uvicorn logs its requests).
"""

from __future__ import annotations

import logging
import sys

from orchestrator.config import Settings

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record is logged, not as it was when logging
    was configured: a command run inside another program (a test's ``CliRunner``, an
    embedding application) may have had a stderr that is closed by now, and logging to it
    printed "--- Logging error ---" tracebacks into whatever stderr came next."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # StreamHandler.__init__ sets it; the property always reads sys.stderr


def configure_logging(settings: Settings) -> None:
    logger = logging.getLogger("engram")
    if any(getattr(h, "_engram", False) for h in logger.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._engram = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(settings.log_level.upper())
    logger.propagate = False
