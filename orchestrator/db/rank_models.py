"""Mapped tables of learning to rank (migration ``0050_rank_learning``).

``RankEvent``: what one recall or memory_prepare served and pooled, with ranks and
feature vectors; ``RankModel``: a tenant's trained ranking models (chained). The
revision says why each exists; the drift test keeps these in step with it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    REAL,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Text,
    UniqueConstraint,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base

_CHANNELS = "'graphql', 'mcp', 'python', 'cli', 'worker'"


def _tenant_fk(table: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                                name=f"fk_{table}_tenant_id_tenants", ondelete="CASCADE")


class StoredRankModel(Base):
    __tablename__ = "rank_models"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_rank_models"),
        _tenant_fk("rank_models"),
        UniqueConstraint("tenant_id", "version", name="uq_rank_models_tenant_id_version"),
        CheckConstraint("version >= 1", name="ck_rank_models_version_positive"),
        CheckConstraint("length(sha256) = 32", name="ck_rank_models_sha256_length"),
        CheckConstraint("length(artifact) between 1 and 10000000", name="ck_rank_models_artifact_length"),
        CheckConstraint("events >= 0 and training_rows >= 0 and positives >= 0",
                        name="ck_rank_models_sizes_nonnegative"),
        CheckConstraint("jsonb_typeof(card) = 'object'", name="ck_rank_models_card_object"),
        CheckConstraint("active = (activated_at is not null)", name="ck_rank_models_active_since"),
        Index("uq_rank_models_tenant_id_active", "tenant_id", unique=True,
              postgresql_where=sql_text("active")),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))
    version: Mapped[int] = mapped_column(Integer)
    artifact: Mapped[str] = mapped_column(Text)
    sha256: Mapped[bytes] = mapped_column(BYTEA)
    feature_version: Mapped[str] = mapped_column(Text)
    card: Mapped[dict[str, Any]] = mapped_column(JSONB)
    events: Mapped[int] = mapped_column(Integer)
    training_rows: Mapped[int] = mapped_column(Integer)
    positives: Mapped[int] = mapped_column(Integer)
    position_bias: Mapped[str] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    activated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    trained_by: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    trained_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


class RankEvent(Base):
    __tablename__ = "rank_events"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_rank_events"),
        _tenant_fk("rank_events"),
        ForeignKeyConstraint(["tenant_id", "model_id"],
                             ["memory.rank_models.tenant_id", "memory.rank_models.id"],
                             name="fk_rank_events_tenant_id_model_id_rank_models"),
        CheckConstraint("operation in ('recall', 'prepare')", name="ck_rank_events_operation_known"),
        CheckConstraint(f"channel in ({_CHANNELS})", name="ck_rank_events_channel_known"),
        CheckConstraint("length(question_hash) = 32", name="ck_rank_events_question_hash_length"),
        CheckConstraint("length(model) between 1 and 500", name="ck_rank_events_model_length"),
        CheckConstraint(
            "cardinality(item_ids) = cardinality(item_tables) "
            "and cardinality(document_ids) = cardinality(item_tables) "
            "and cardinality(served_ranks) = cardinality(item_tables) and cardinality(item_tables) <= 1000",
            name="ck_rank_events_items_aligned"),
        CheckConstraint("feature_count between 1 and 256 and "
                        "cardinality(features) = feature_count * cardinality(item_tables)",
                        name="ck_rank_events_features_aligned"),
        Index("ix_rank_events_tenant_id_occurred_at", "tenant_id", "occurred_at"),
        Index("ix_rank_events_tenant_id_model_id", "tenant_id", "model_id"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))
    user_id: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    operation: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    model_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    feature_version: Mapped[str] = mapped_column(Text)
    question_hash: Mapped[bytes] = mapped_column(BYTEA)
    receipt_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    item_tables: Mapped[list[str]] = mapped_column(ARRAY(Text))
    item_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    document_ids: Mapped[list[uuid.UUID | None]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    served_ranks: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    feature_count: Mapped[int] = mapped_column(Integer)
    features: Mapped[list[float]] = mapped_column(ARRAY(REAL))
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))
