"""Mapped tables of the ``worker`` schema (migration ``0007_embedding_models``).

The embedding model registry, the per-tenant cache of vectors by content hash
and the retry backoff of failed rows; see the revision for why each exists.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Text,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import BYTEA, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base


class EmbeddingModel(Base):
    __tablename__ = "embedding_models"
    __table_args__ = (
        PrimaryKeyConstraint("name", name="pk_embedding_models"),
        CheckConstraint("length(name) between 1 and 200", name="ck_embedding_models_name_length"),
        CheckConstraint("dimension between 1 and 16000",
                        name="ck_embedding_models_dimension_range"),
        CheckConstraint("length(query_prefix) <= 200",
                        name="ck_embedding_models_query_prefix_length"),
        CheckConstraint("length(passage_prefix) <= 200",
                        name="ck_embedding_models_passage_prefix_length"),
        Index("uq_embedding_models_one_active", "active", unique=True,
              postgresql_where=sql_text("active")),
        {"schema": "worker"},
    )

    name: Mapped[str] = mapped_column(Text)
    dimension: Mapped[int] = mapped_column(Integer)
    active: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=sql_text("now()"))
    activated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # 0080_model_generations: raised on every activation; the model's text prefixes.
    generation: Mapped[int] = mapped_column(BigInteger, server_default=sql_text("0"))
    query_prefix: Mapped[str] = mapped_column(Text, server_default=sql_text("''"))
    passage_prefix: Mapped[str] = mapped_column(Text, server_default=sql_text("''"))


class EmbeddingCache(Base):
    __tablename__ = "embedding_cache"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "model", "content_hash", name="pk_embedding_cache"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                             name="fk_embedding_cache_tenant_id_tenants", ondelete="CASCADE"),
        ForeignKeyConstraint(["model"], ["worker.embedding_models.name"],
                             name="fk_embedding_cache_model_embedding_models",
                             ondelete="CASCADE"),
        {"schema": "worker"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    model: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[bytes] = mapped_column(BYTEA)
    embedding: Mapped[Any] = mapped_column(Vector())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=sql_text("now()"))


class EmbedRetry(Base):
    __tablename__ = "embed_retries"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "relation", "row_key", name="pk_embed_retries"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                             name="fk_embed_retries_tenant_id_tenants", ondelete="CASCADE"),
        {"schema": "worker"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    relation: Mapped[str] = mapped_column(Text)
    row_key: Mapped[str] = mapped_column(Text)
    retry_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
