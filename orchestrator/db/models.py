"""SQLAlchemy mapped tables mirroring the migrated schema.

The migrations in ``db/versions`` own the schema; these classes describe it for
typed statements. ``tests/test_schema_drift.py`` runs Alembic's autogenerate
comparison after ``upgrade head`` and fails on any difference.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Computed,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Text,
    UniqueConstraint,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, ENUM, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ENGRAM_SCHEMAS = frozenset({"auth", "engram", "sources"})

# Indexes whose existence depends on the index tier chosen at migration time
# (see db/versions/0003_index_tier.py); the drift check leaves them out.
TIER_INDEXES = frozenset({
    "ix_chunks_embedding_vchordrq", "ix_chunks_bm25",
    "ix_chunks_embedding_hnsw", "ix_chunks_tenant_id_lexical",
})
# A tenant's own vector indexes (`engram db tenant-index`, orchestrator/db/indexes.py):
# ix_<table>_embedding_t_ and the tenant id's 32 hex digits (recall looks for the chunks'
# one by its prefix). Built by a DBA per tenant, and copied for a model change (the
# shadow column's name is in theirs, cut to 63 bytes); the drift check leaves them out too.
# Every tenant's own index (not its copy during a model change), as a regular expression
# Python and PostgreSQL read alike; the last 32 characters are the tenant id's hex.
OWN_INDEX_PATTERN = r"^ix_\w+_embedding_t_[0-9a-f]{32}$"
_TENANT_INDEX = re.compile(r"^ix_\w+_embedding_(?:next_)?t_[0-9a-f]{28,32}$")


def tenant_index_prefix(table: str = "chunks") -> str:
    """What every tenant's own vector index on ``table`` is named before the tenant's id."""
    return f"ix_{table}_embedding_t_"


def tenant_index_name(tenant_id: uuid.UUID, table: str = "chunks") -> str:
    """The name of ``tenant_id``'s own vector index on ``table``."""
    return tenant_index_prefix(table) + tenant_id.hex


def is_tenant_index(name: str | None) -> bool:
    """Whether ``name`` is a tenant's own vector index (or its copy during a model change)."""
    return bool(name and _TENANT_INDEX.match(name))

EMBEDDING_DIMENSION = 384

metadata = MetaData()

EmbedState = ENUM("pending", "ready", "failed", name="embed_state", schema="sources",
                  create_type=False)


class Base(DeclarativeBase):
    metadata = metadata


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


class Tenant(Base):
    __tablename__ = "tenants"
    __table_args__ = (
        PrimaryKeyConstraint("id", name="pk_tenants"),
        UniqueConstraint("org_id", name="uq_tenants_org_id"),
        CheckConstraint("length(org_id) between 1 and 200", name="ck_tenants_org_id_length"),
        CheckConstraint("length(name) between 1 and 200", name="ck_tenants_name_length"),
        {"schema": "auth"},
    )

    id: Mapped[uuid.UUID] = _uuid_pk()
    org_id: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Scope(Base):
    __tablename__ = "scopes"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_scopes"),
        UniqueConstraint("tenant_id", "name", name="uq_scopes_tenant_id_name"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_scopes_tenant_id_tenants",
                             ondelete="CASCADE"),
        CheckConstraint(r"name ~ '^[a-z0-9][a-z0-9._:-]{0,62}$'", name="ck_scopes_name_format"),
        CheckConstraint("length(description) <= 2000", name="ck_scopes_description_length"),
        {"schema": "auth"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, server_default=sql_text("''"))
    created_at: Mapped[datetime] = _now()


class Installation(Base):
    __tablename__ = "installation"
    __table_args__ = (PrimaryKeyConstraint("key", name="pk_installation"), {"schema": "engram"})

    key: Mapped[str] = mapped_column(Text)
    value: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = _now()


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_documents"),
        # Unique per scope set (0020): a writer only ever collides with a document it can read.
        UniqueConstraint("tenant_id", "collection", "path", "scopes",
                         name="uq_documents_tenant_id_collection_path_scopes"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                             name="fk_documents_tenant_id_tenants", ondelete="CASCADE"),
        CheckConstraint("length(collection) between 1 and 200", name="ck_documents_collection_length"),
        CheckConstraint("length(path) between 1 and 1000", name="ck_documents_path_length"),
        CheckConstraint("length(title) between 1 and 500", name="ck_documents_title_length"),
        CheckConstraint("length(kind) between 1 and 50", name="ck_documents_kind_length"),
        CheckConstraint(
            "state is null or state in ('Active', 'Waiting', 'Done', 'Someday', 'Cancelled', "
            "'Archived')", name="ck_documents_state_known"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_documents_scopes_nonempty"),
        CheckConstraint("jsonb_typeof(metadata) = 'object'", name="ck_documents_metadata_object"),
        Index("ix_documents_tenant_id_kind_state", "tenant_id", "kind", "state"),
        Index("ix_documents_tenant_id_content_hash", "tenant_id", "content_hash"),
        # The title lane's probe (db/versions/0008_recall.py).
        Index("ix_documents_tenant_id_title_key", "tenant_id", "title_key"),
        Index("ix_documents_tenant_id_area", "tenant_id", "area",
              postgresql_where=sql_text("area is not null")),
        # The timeline lane's probe (db/versions/0010_memory_lanes.py).
        Index("ix_documents_tenant_id_collection_occurred_at", "tenant_id", "collection",
              "occurred_at", postgresql_where=sql_text("occurred_at is not null")),
        {"schema": "sources"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = _uuid_pk()
    collection: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    title: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text, server_default=sql_text("'note'"))
    state: Mapped[str | None] = mapped_column(Text)
    area: Mapped[str | None] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[bytes] = mapped_column(BYTEA)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    author: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB,
                                                      server_default=sql_text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    pinned: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    snoozed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # No embed_state (dropped by 0081_embedding_progress): a document's embedding progress
    # is its chunks' (orchestrator/api/documents.py, embedding_progress).
    occurred_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # recall.title_key(title), stored (db/versions/0014_recall_probes.py): the title lane's key.
    title_key: Mapped[str | None] = mapped_column(Text, Computed("recall.title_key(title)",
                                                                 persisted=True))


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_chunks"),
        UniqueConstraint("tenant_id", "document_id", "ordinal",
                         name="uq_chunks_tenant_id_document_id_ordinal"),
        ForeignKeyConstraint(["tenant_id", "document_id"],
                             ["sources.documents.tenant_id", "sources.documents.id"],
                             name="fk_chunks_tenant_id_document_id_documents", ondelete="CASCADE"),
        CheckConstraint("ordinal >= 0", name="ck_chunks_ordinal_nonnegative"),
        CheckConstraint("char_start >= 0 and char_end >= char_start",
                        name="ck_chunks_offsets_ordered"),
        CheckConstraint("length(text) >= 1", name="ck_chunks_text_nonempty"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_chunks_scopes_nonempty"),
        CheckConstraint("embed_attempts >= 0", name="ck_chunks_embed_attempts_nonnegative"),
        CheckConstraint("(embed_state = 'ready') = (embedding is not null)",
                        name="ck_chunks_embedding_matches_state"),
        CheckConstraint("section is null or (jsonb_typeof(section) = 'array' and "
                        "jsonb_array_length(section) between 1 and 6 and "
                        "length(section::text) <= 8000)", name="ck_chunks_section_shape"),
        Index("ix_chunks_tenant_id_content_hash", "tenant_id", "content_hash"),
        Index("ix_chunks_embed_queue", "tenant_id", "ordinal", "created_at",
              postgresql_where=sql_text("embed_state = 'pending'")),
        {"schema": "sources"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = _uuid_pk()
    document_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    char_start: Mapped[int] = mapped_column(Integer)
    char_end: Mapped[int] = mapped_column(Integer)
    content_hash: Mapped[bytes] = mapped_column(BYTEA)
    lexical: Mapped[Any] = mapped_column(TSVECTOR)
    token_count: Mapped[int] = mapped_column(Integer)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    embedding: Mapped[Any | None] = mapped_column(Vector(EMBEDDING_DIMENSION))
    embed_state: Mapped[str] = mapped_column(EmbedState, server_default=sql_text("'pending'"))
    embed_attempts: Mapped[int] = mapped_column(SmallInteger, server_default=sql_text("0"))
    embed_error: Mapped[str | None] = mapped_column(Text)
    embed_model: Mapped[str | None] = mapped_column(Text)
    embedded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The headings the chunk starts under (0089_chunk_sections): [{"level", "text"}], or null.
    section: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    created_at: Mapped[datetime] = _now()
