"""Mapped tables of the derive jobs (migration ``0009_derive``).

Lifecycle policies per collection, the last use of each document and the
extractor's record of what it read; see the revision for why each exists.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Integer,
    PrimaryKeyConstraint,
    Text,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base


class LifecyclePolicy(Base):
    __tablename__ = "lifecycle_policies"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "collection", name="pk_lifecycle_policies"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                             name="fk_lifecycle_policies_tenant_id_tenants", ondelete="CASCADE"),
        CheckConstraint("archive_after_days between 1 and 36500",
                        name="ck_lifecycle_policies_archive_after_days_range"),
        CheckConstraint("length(collection) between 1 and 200",
                        name="ck_lifecycle_policies_collection_length"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    collection: Mapped[str] = mapped_column(Text)
    archive_after_days: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=sql_text("now()"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=sql_text("now()"))


class DocumentUse(Base):
    __tablename__ = "document_use"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "document_id", name="pk_document_use"),
        ForeignKeyConstraint(["tenant_id", "document_id"],
                             ["sources.documents.tenant_id", "sources.documents.id"],
                             name="fk_document_use_tenant_id_document_id_documents",
                             ondelete="CASCADE"),
        CheckConstraint("uses >= 0", name="ck_document_use_uses_nonnegative"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    document_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    uses: Mapped[int] = mapped_column(BigInteger, server_default=sql_text("0"))
    last_used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Extraction(Base):
    __tablename__ = "extractions"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "chunk_id", name="pk_extractions"),
        ForeignKeyConstraint(["tenant_id", "chunk_id"], ["sources.chunks.tenant_id", "sources.chunks.id"],
                             name="fk_extractions_tenant_id_chunk_id_chunks", ondelete="CASCADE"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_extractions_scopes_nonempty"),
        CheckConstraint("length(model) between 1 and 200", name="ck_extractions_model_length"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    chunk_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    content_hash: Mapped[bytes] = mapped_column(BYTEA)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    model: Mapped[str] = mapped_column(Text)
    entity_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)),
                                                        server_default=sql_text("'{}'"))
    claim_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)),
                                                       server_default=sql_text("'{}'"))
    quarantine_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)),
                                                            server_default=sql_text("'{}'"))
    extracted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                   server_default=sql_text("now()"))
