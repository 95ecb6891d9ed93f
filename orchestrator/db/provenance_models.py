"""Mapped tables of the provenance schema (``db/versions/0006_provenance.py``).

The chain (``Event``) is written only by the chain trigger and read by auditors;
agents, activities, derivations and receipts are written by the application
through the functions and column grants of that revision. The drift test
compares these classes with the migrated schema.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKeyConstraint,
    Index,
    PrimaryKeyConstraint,
    Text,
    UniqueConstraint,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base

SCHEMA = "provenance"


def _tenant() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), server_default=sql_text("auth.tenant_id()"))


def _id() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "seq", name="pk_events"),
        CheckConstraint("seq >= 1", name="ck_events_seq_positive"),
        CheckConstraint("operation in ('INSERT', 'UPDATE', 'DELETE', 'BASELINE')",
                        name="ck_events_operation_known"),
        CheckConstraint("length(row_hash) = 32 and length(prev_hash) = 32 and length(hash) = 32",
                        name="ck_events_hash_lengths"),
        CheckConstraint("jsonb_typeof(row_id) = 'object'", name="ck_events_row_id_object"),
        Index("ix_events_tenant_id_table_name_row_id_seq", "tenant_id", "table_name", "row_id", "seq"),
        Index("ix_events_tenant_id_activity_id", "tenant_id", "activity_id",
              postgresql_where=sql_text("activity_id is not null")),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    seq: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    table_name: Mapped[str] = mapped_column(Text)
    row_id: Mapped[dict[str, Any]] = mapped_column(JSONB)
    operation: Mapped[str] = mapped_column(Text)
    actor_user: Mapped[str | None] = mapped_column(Text)
    actor_role: Mapped[str] = mapped_column(Text)
    activity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    row_hash: Mapped[bytes] = mapped_column(BYTEA)
    prev_hash: Mapped[bytes] = mapped_column(BYTEA)
    hash: Mapped[bytes] = mapped_column(BYTEA)


class Agent(Base):
    __tablename__ = "agents"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_agents"),
        UniqueConstraint("tenant_id", "kind", "name", "version",
                         name="uq_agents_tenant_id_kind_name_version"),
        CheckConstraint("kind in ('person', 'software', 'model', 'organization')",
                        name="ck_agents_kind_known"),
        CheckConstraint("length(name) between 1 and 300", name="ck_agents_name_length"),
        CheckConstraint("length(version) <= 100", name="ck_agents_version_length"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    kind: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(Text, server_default=sql_text("''"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


class Activity(Base):
    __tablename__ = "activities"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_activities"),
        ForeignKeyConstraint(["tenant_id", "agent_id"],
                             ["provenance.agents.tenant_id", "provenance.agents.id"],
                             name="fk_activities_tenant_id_agent_id_agents"),
        CheckConstraint(r"kind ~ '^[a-z][a-z0-9_.:-]{0,62}$'", name="ck_activities_kind_format"),
        CheckConstraint("jsonb_typeof(detail) = 'object'", name="ck_activities_detail_object"),
        CheckConstraint("ended_at is null or ended_at >= started_at",
                        name="ck_activities_ended_after_start"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    kind: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sql_text("'{}'::jsonb"))
    actor_user: Mapped[str | None] = mapped_column(Text)
    actor_role: Mapped[str] = mapped_column(Text)
    agent_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=sql_text("clock_timestamp()"))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Derivation(Base):
    __tablename__ = "derivations"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_derivations"),
        ForeignKeyConstraint(["tenant_id", "source_agent_id"],
                             ["provenance.agents.tenant_id", "provenance.agents.id"],
                             name="fk_derivations_tenant_id_source_agent_id_agents"),
        CheckConstraint(
            "relation in ('wasDerivedFrom', 'wasQuotedFrom', 'wasRevisionOf', 'hadPrimarySource')",
            name="ck_derivations_relation_known"),
        CheckConstraint(
            "(source_table is null) = (source_row_id is null) "
            "and (source_table is null) <> (source_agent_id is null)",
            name="ck_derivations_one_source"),
        Index("ix_derivations_tenant_id_derived", "tenant_id", "derived_table", "derived_row_id"),
        Index("ix_derivations_tenant_id_source", "tenant_id", "source_table", "source_row_id"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    relation: Mapped[str] = mapped_column(Text, server_default=sql_text("'wasDerivedFrom'"))
    derived_table: Mapped[str] = mapped_column(Text)
    derived_row_id: Mapped[dict[str, Any]] = mapped_column(JSONB)
    derived_version: Mapped[bytes] = mapped_column(BYTEA)
    source_table: Mapped[str | None] = mapped_column(Text)
    source_row_id: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    source_version: Mapped[bytes | None] = mapped_column(BYTEA)
    source_agent_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    activity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    recorded_by: Mapped[str | None] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


class Receipt(Base):
    __tablename__ = "receipts"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_receipts"),
        CheckConstraint("length(question_hash) = 32 and length(rendered_hash) = 32",
                        name="ck_receipts_hash_lengths"),
        CheckConstraint("jsonb_typeof(evidence) = 'array'", name="ck_receipts_evidence_array"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    asked_by: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    asked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                               server_default=sql_text("clock_timestamp()"))
    question_hash: Mapped[bytes] = mapped_column(BYTEA)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    rendered_hash: Mapped[bytes] = mapped_column(BYTEA)
    activity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    receipt_hash: Mapped[bytes] = mapped_column(BYTEA)


class ReceiptQueue(Base):
    """Receipts sealed but not yet chained: the event each will get (0040; owner writes,
    auditors and the verifier read)."""

    __tablename__ = "receipt_queue"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_receipt_queue"),
        CheckConstraint("length(row_hash) = 32", name="ck_receipt_queue_row_hash_length"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor_user: Mapped[str | None] = mapped_column(Text)
    actor_role: Mapped[str] = mapped_column(Text)
    activity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    row_hash: Mapped[bytes] = mapped_column(BYTEA)


class Pending(Base):
    """Events staged during a transaction, chained at its commit (owner only)."""

    __tablename__ = "pending"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "txid", "ord", name="pk_pending"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    txid: Mapped[int] = mapped_column(BigInteger)
    ord: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    table_name: Mapped[str] = mapped_column(Text)
    row_id: Mapped[dict[str, Any]] = mapped_column(JSONB)
    operation: Mapped[str] = mapped_column(Text)
    actor_user: Mapped[str | None] = mapped_column(Text)
    actor_role: Mapped[str] = mapped_column(Text)
    activity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    row_hash: Mapped[bytes] = mapped_column(BYTEA)


class PendingCommit(Base):
    __tablename__ = "pending_commits"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "txid", name="pk_pending_commits"),
        {"schema": SCHEMA},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    txid: Mapped[int] = mapped_column(BigInteger)
