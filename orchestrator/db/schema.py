"""Every mapped table of Engram, for Alembic's comparison and for tools.

Each domain keeps its mapped tables in its own module under ``orchestrator/db``
(``models`` holds auth, installation and sources); importing this module loads
them all onto the one ``metadata``.
"""

from __future__ import annotations

import orchestrator.db.derive_models
import orchestrator.db.knowledge_models
import orchestrator.db.provenance_models
import orchestrator.db.worker_models
import orchestrator.recall.tables  # noqa: F401
from orchestrator.db import models
from orchestrator.db.models import TIER_INDEXES, metadata

# Domain modules register their tables by being imported here (one line each).

ENGRAM_SCHEMAS = frozenset(
    {t.schema for t in metadata.tables.values() if t.schema} | models.ENGRAM_SCHEMAS
)

__all__ = ["ENGRAM_SCHEMAS", "TIER_INDEXES", "metadata"]
