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


def configure_logging(settings: Settings) -> None:
    logger = logging.getLogger("engram")
    if any(getattr(h, "_engram", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._engram = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(settings.log_level.upper())
    logger.propagate = False
