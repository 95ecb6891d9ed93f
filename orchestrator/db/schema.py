"""Every mapped table of Engram, for Alembic's comparison and for tools.

Each domain keeps its mapped tables in its own module under ``orchestrator/db``
(``models`` holds auth, installation and sources); importing this module loads
them all onto the one ``metadata``.
"""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection

import orchestrator.db.derive_models
import orchestrator.db.knowledge_models
import orchestrator.db.provenance_models
import orchestrator.db.rank_models
import orchestrator.db.worker_models
import orchestrator.recall.tables  # noqa: F401
from orchestrator.db import models
from orchestrator.db.models import TIER_INDEXES, is_tenant_index, metadata

# Domain modules register their tables by being imported above (one line each).

ENGRAM_SCHEMAS = frozenset(
    {t.schema for t in metadata.tables.values() if t.schema} | models.ENGRAM_SCHEMAS
)



def include_object(obj: Any, name: str | None, type_: str, reflected: bool,
                   compare_to: Any) -> bool:
    """Alembic filter: Engram's tables only, and not the indexes that depend on the tier or
    that a DBA built for one tenant (``engram db tenant-index``)."""
    if type_ == "table":
        return bool(obj.schema in ENGRAM_SCHEMAS)
    return not (type_ == "index" and (name in TIER_INDEXES or is_tenant_index(name)))


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    return name in ENGRAM_SCHEMAS if type_ == "schema" else True


# The options Alembic compares with, shared by db/env.py (autogenerate) and the drift check.
COMPARE_OPTIONS: dict[str, Any] = {
    "include_schemas": True,
    "include_object": include_object,
    "include_name": include_name,
    "compare_type": True,
}

# Comments are documentation owned by the migrations (`comment on`); the mapped
# classes do not repeat them, so comment differences are not drift.
_COMMENT_OPS = frozenset({"add_table_comment", "remove_table_comment", "modify_comment"})


def schema_drift(connection: Connection) -> list[Any]:
    """Differences between the mapped tables and the migrated schema (empty when in step)."""
    ctx = MigrationContext.configure(connection, opts={**COMPARE_OPTIONS,
                                                       "target_metadata": metadata})
    return [d for d in compare_metadata(ctx, metadata)
            if not (isinstance(d, tuple) and d[0] in _COMMENT_OPS)
            and not (isinstance(d, list) and all(x[0] in _COMMENT_OPS for x in d))]


__all__ = ["COMPARE_OPTIONS", "ENGRAM_SCHEMAS", "TIER_INDEXES", "metadata", "schema_drift"]
