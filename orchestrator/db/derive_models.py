"""Mapped tables of the derive jobs (migrations ``0009_derive``, ``0030_job_runs``).

Lifecycle policies per collection, the last use of each document, the
extractor's record of what it read, and the job runs worth a look (failed, or
skipped an item); see the revisions for why each exists.
"""

from __future__ import annotations

import uuid
from datetime import datetime

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
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, UUID
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
    # What was read: the chunk's content hash, with its document's title and front matter
    # aliases where it has aliases (orchestrator.derive.extract._read).
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


class JobRun(Base):
    """A derive job run that failed or skipped an item (migration ``0030_job_runs``)."""

    __tablename__ = "job_runs"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_job_runs"),
        ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_job_runs_tenant_id_tenants",
                             ondelete="CASCADE"),
        CheckConstraint(r"job ~ '^[a-z][a-z0-9_.]{0,62}$'", name="ck_job_runs_job_format"),
        CheckConstraint("length(line) <= 2000", name="ck_job_runs_line_length"),
        CheckConstraint("skipped >= 0", name="ck_job_runs_skipped_nonnegative"),
        CheckConstraint("jsonb_typeof(problems) = 'array' and jsonb_array_length(problems) <= 100",
                        name="ck_job_runs_problems_list"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_job_runs_scopes_nonempty"),
        Index("ix_job_runs_tenant_id_job_finished_at", "tenant_id", "job", "finished_at"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))
    job: Mapped[str] = mapped_column(Text)
    run_by: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    ok: Mapped[bool] = mapped_column(Boolean)
    line: Mapped[str] = mapped_column(Text)
    skipped: Mapped[int] = mapped_column(Integer, server_default=sql_text("0"))
    problems: Mapped[list[dict[str, str]]] = mapped_column(JSONB, server_default=sql_text("'[]'"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))
