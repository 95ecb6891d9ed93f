"""Mapped tables of the ``knowledge`` and ``memory`` schemas.

The revisions ``0004_knowledge`` and ``0005_derived_memory`` own these tables,
their triggers, policies and SQL functions; the classes here describe them for
typed statements (the recall lanes, the ingest API). The drift test compares
them with the migrated schema, so every constraint and index is named exactly
as in the revision. Views (``knowledge.current_claims`` and friends) are
mapped as plain ``Table`` objects outside ``metadata``, so Alembic's comparison
never mistakes them for tables.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    Date,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, DOUBLE_PRECISION, ENUM, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import EMBEDDING_DIMENSION, Base, EmbedState

EpistemicKind = ENUM("world_fact", "experience", "observation", "opinion", "preference",
                     name="epistemic_kind", schema="knowledge", create_type=False)
ConflictKind = ENUM("value", "time", "relation", name="conflict_kind", schema="knowledge",
                    create_type=False)
ConflictStatus = ENUM("open", "resolved", "disputed", name="conflict_status", schema="knowledge",
                      create_type=False)
ResolutionStrategy = ENUM("newest_wins", "highest_authority_wins", "keep_both", "manual",
                          name="resolution_strategy", schema="knowledge", create_type=False)
CausalLink = ENUM("caused", "influenced", "precedent_for", name="causal_link", schema="memory",
                  create_type=False)

DATATYPES = ("string", "number", "integer", "boolean", "date", "datetime", "uri", "entity")
_DATATYPE_LIST = ", ".join(f"'{d}'" for d in DATATYPES)
RECALLABLE_CONFIDENCE = 0.65

UUIDS = ARRAY(UUID(as_uuid=True))


def _tenant() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), server_default=sql_text("auth.tenant_id()"))


def _id() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


def _tenant_fk(table: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"],
                                name=f"fk_{table}_tenant_id_tenants", ondelete="CASCADE")


def _entity_fk(table: str, column: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["tenant_id", column],
                                ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                                name=f"fk_{table}_tenant_id_{column}_entities")


def _embedding_checks(table: str) -> tuple[CheckConstraint, CheckConstraint]:
    return (
        CheckConstraint("embed_attempts >= 0", name=f"ck_{table}_embed_attempts_nonnegative"),
        CheckConstraint("(embed_state = 'ready') = (embedding is not null)",
                        name=f"ck_{table}_embedding_matches_state"),
    )


def _ann_indexes(table: str) -> tuple[Index, Index]:
    """The HNSW cosine index a recall lane searches, and the embedding queue's index."""
    return (
        Index(f"ix_{table}_embedding_hnsw", "embedding", postgresql_using="hnsw",
              postgresql_with={"m": 16, "ef_construction": 64},
              postgresql_ops={"embedding": "vector_cosine_ops"}),
        Index(f"ix_{table}_embed_queue", "tenant_id", "created_at",
              postgresql_where=sql_text("embed_state = 'pending'")),
    )


EXTRACTIVE_METHOD = "extractive:centroid-mmr"


def _summary_method(table: str) -> CheckConstraint:
    return CheckConstraint("length(summary_method) between 1 and 200",
                           name=f"ck_{table}_summary_method_length")


class _Summarised:
    """Which method and model made a summary (0010_memory_lanes)."""

    summary_method: Mapped[str] = mapped_column(
        Text, server_default=sql_text(f"'{EXTRACTIVE_METHOD}'"))
    summary_model: Mapped[str | None] = mapped_column(Text)


class _Embedded:
    """The embedding queue's columns (rows are the queue; see 0002_sources)."""

    embedding: Mapped[Any | None] = mapped_column(Vector(EMBEDDING_DIMENSION))
    embed_state: Mapped[str] = mapped_column(EmbedState, server_default=sql_text("'pending'"))
    embed_attempts: Mapped[int] = mapped_column(SmallInteger, server_default=sql_text("0"))
    embed_error: Mapped[str | None] = mapped_column(Text)
    embed_model: Mapped[str | None] = mapped_column(Text)
    embedded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# --- knowledge -----------------------------------------------------------------------


class Entity(Base):
    """No embedding columns: 0081_embedding_progress dropped them (nothing embedded them)."""

    __tablename__ = "entities"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_entities"),
        _tenant_fk("entities"),
        ForeignKeyConstraint(["tenant_id", "merged_into"],
                             ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                             name="fk_entities_tenant_id_merged_into_entities"),
        CheckConstraint(r"entity_type ~ '^[A-Za-z][A-Za-z0-9_]{0,62}$'",
                        name="ck_entities_entity_type_format"),
        CheckConstraint("length(canonical_name) between 1 and 500",
                        name="ck_entities_canonical_name_length"),
        CheckConstraint("cardinality(aliases) <= 200", name="ck_entities_aliases_count"),
        CheckConstraint("summary is null or length(summary) <= 20000",
                        name="ck_entities_summary_length"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_entities_scopes_nonempty"),
        CheckConstraint("jsonb_typeof(given_aliases) = 'object'",
                        name="ck_entities_given_aliases_object"),
        Index("ix_entities_given_aliases", "given_aliases", postgresql_using="gin"),
        Index("ix_entities_tenant_id_entity_type_name_key", "tenant_id", "entity_type", "name_key"),
        Index("ix_entities_alias_keys", "alias_keys", postgresql_using="gin"),
        Index("ix_entities_tenant_id_name_key", "tenant_id", "name_key"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    entity_type: Mapped[str] = mapped_column(Text)
    canonical_name: Mapped[str] = mapped_column(Text)
    name_key: Mapped[str] = mapped_column(Text)
    aliases: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    alias_keys: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    # Document id -> the aliases its front matter gave (migration 0087).
    given_aliases: Mapped[dict[str, list[str]]] = mapped_column(
        JSONB, server_default=sql_text("'{}'::jsonb"))
    summary: Mapped[str | None] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    merged_into: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_by: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class FactContent(_Embedded, Base):
    __tablename__ = "fact_content"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_fact_content"),
        UniqueConstraint("tenant_id", "content_hash", name="uq_fact_content_tenant_id_content_hash"),
        _tenant_fk("fact_content"),
        CheckConstraint("length(text) between 1 and 20000", name="ck_fact_content_text_length"),
        *_embedding_checks("fact_content"),
        *_ann_indexes("fact_content"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    text: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[bytes] = mapped_column(BYTEA)
    created_at: Mapped[datetime] = _now()


class FactClaim(Base):
    __tablename__ = "fact_claim"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_fact_claim"),
        _tenant_fk("fact_claim"),
        ForeignKeyConstraint(["tenant_id", "content_id"],
                             ["knowledge.fact_content.tenant_id", "knowledge.fact_content.id"],
                             name="fk_fact_claim_tenant_id_content_id_fact_content"),
        _entity_fk("fact_claim", "subject_id"),
        _entity_fk("fact_claim", "object_id"),
        CheckConstraint(r"predicate ~ '^[a-z][a-z0-9_:.-]{0,99}$'",
                        name="ck_fact_claim_predicate_format"),
        CheckConstraint("(object_id is null) <> (object_value is null)",
                        name="ck_fact_claim_one_object"),
        CheckConstraint("(object_datatype = 'entity') = (object_id is not null)",
                        name="ck_fact_claim_entity_datatype"),
        CheckConstraint(f"object_datatype in ({_DATATYPE_LIST})",
                        name="ck_fact_claim_object_datatype_known"),
        CheckConstraint("object_value is null or length(object_value) <= 2000",
                        name="ck_fact_claim_object_value_length"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_fact_claim_scopes_nonempty"),
        CheckConstraint("length(author_role) between 1 and 50",
                        name="ck_fact_claim_author_role_length"),
        CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_fact_claim_confidence_range"),
        CheckConstraint("authority between 0 and 100", name="ck_fact_claim_authority_range"),
        CheckConstraint("valid_to is null or valid_from is null or valid_to > valid_from",
                        name="ck_fact_claim_valid_time_ordered"),
        CheckConstraint("(fact_key is null) = (as_of is null)", name="ck_fact_claim_keyed_as_of"),
        CheckConstraint("fact_key is null or length(fact_key) between 1 and 200",
                        name="ck_fact_claim_fact_key_length"),
        CheckConstraint("access_count >= 0", name="ck_fact_claim_access_count_nonnegative"),
        # The graph walk's lateral adjacency probe uses both.
        Index("ix_fact_claim_tenant_id_subject_id", "tenant_id", "subject_id"),
        Index("ix_fact_claim_tenant_id_object_id", "tenant_id", "object_id"),
        Index("ix_fact_claim_tenant_id_content_id", "tenant_id", "content_id"),
        # Unique per scope set (0020): a writer only ever collides with a claim it can read.
        Index("uq_fact_claim_tenant_id_fact_key_as_of_scopes", "tenant_id", "fact_key", "as_of",
              "scopes", unique=True, postgresql_where=sql_text("fact_key is not null")),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    content_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    subject_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    predicate: Mapped[str] = mapped_column(Text)
    object_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    object_value: Mapped[str | None] = mapped_column(Text)
    object_datatype: Mapped[str] = mapped_column(Text, server_default=sql_text("'string'"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    author: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    author_role: Mapped[str] = mapped_column(Text, server_default=sql_text("'user'"))
    epistemic_kind: Mapped[str] = mapped_column(EpistemicKind,
                                                server_default=sql_text("'world_fact'"))
    perspective_key: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(DOUBLE_PRECISION, server_default=sql_text("1.0"))
    authority: Mapped[int] = mapped_column(SmallInteger, server_default=sql_text("0"))
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_to: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = _now()
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fact_key: Mapped[str | None] = mapped_column(Text)
    as_of: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    disputed: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    access_count: Mapped[int] = mapped_column(Integer, server_default=sql_text("0"))
    last_accessed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Shape(Base):
    __tablename__ = "shapes"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_shapes"),
        UniqueConstraint("tenant_id", "predicate", name="uq_shapes_tenant_id_predicate"),
        _tenant_fk("shapes"),
        CheckConstraint(r"predicate ~ '^[a-z][a-z0-9_:.-]{0,99}$'", name="ck_shapes_predicate_format"),
        CheckConstraint(f"datatype is null or datatype in ({_DATATYPE_LIST})",
                        name="ck_shapes_datatype_known"),
        CheckConstraint("object_type is null or datatype is null or datatype = 'entity'",
                        name="ck_shapes_object_type_is_entity"),
        CheckConstraint("min_count is null or min_count >= 0", name="ck_shapes_min_count_nonnegative"),
        CheckConstraint("max_count is null or max_count >= 1", name="ck_shapes_max_count_positive"),
        CheckConstraint("min_count is null or max_count is null or min_count <= max_count",
                        name="ck_shapes_counts_ordered"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    id: Mapped[uuid.UUID] = _id()
    predicate: Mapped[str] = mapped_column(Text)
    subject_type: Mapped[str | None] = mapped_column(Text)
    object_type: Mapped[str | None] = mapped_column(Text)
    datatype: Mapped[str | None] = mapped_column(Text)
    min_count: Mapped[int | None] = mapped_column(Integer)
    max_count: Mapped[int | None] = mapped_column(Integer)
    value_pattern: Mapped[str | None] = mapped_column(Text)
    allowed_values: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    exclusive_with: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    description: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class TenantSettings(Base):
    __tablename__ = "tenant_settings"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_tenant_settings"),
        UniqueConstraint("tenant_id", name="uq_tenant_settings_tenant_id"),
        _tenant_fk("tenant_settings"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    id: Mapped[uuid.UUID] = _id()
    strict_shapes: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    created_at: Mapped[datetime] = _now()


class Quarantine(Base):
    __tablename__ = "quarantine"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_quarantine"),
        _tenant_fk("quarantine"),
        ForeignKeyConstraint(["tenant_id", "released_claim_id"],
                             ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                             name="fk_quarantine_tenant_id_released_claim_id_fact_claim"),
        CheckConstraint("cardinality(reasons) >= 1", name="ck_quarantine_reasons_nonempty"),
        CheckConstraint("jsonb_typeof(payload) = 'object'", name="ck_quarantine_payload_object"),
        CheckConstraint("status in ('held', 'released', 'discarded')",
                        name="ck_quarantine_status_known"),
        CheckConstraint("(status = 'released') = (released_claim_id is not null)",
                        name="ck_quarantine_released_claim"),
        Index("ix_quarantine_tenant_id_author_status", "tenant_id", "author", "status"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    shape_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    reasons: Mapped[list[str]] = mapped_column(ARRAY(Text))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    author: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    status: Mapped[str] = mapped_column(Text, server_default=sql_text("'held'"))
    released_claim_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()


class FactConflict(Base):
    __tablename__ = "conflicts"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_conflicts"),
        UniqueConstraint("tenant_id", "claim_a", "claim_b",
                         name="uq_conflicts_tenant_id_claim_a_claim_b"),
        _tenant_fk("conflicts"),
        ForeignKeyConstraint(["tenant_id", "claim_a"],
                             ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                             name="fk_conflicts_tenant_id_claim_a_fact_claim", ondelete="CASCADE"),
        ForeignKeyConstraint(["tenant_id", "claim_b"],
                             ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                             name="fk_conflicts_tenant_id_claim_b_fact_claim", ondelete="CASCADE"),
        CheckConstraint("claim_a < claim_b", name="ck_conflicts_claims_ordered"),
        CheckConstraint("winner_id is null or winner_id in (claim_a, claim_b)",
                        name="ck_conflicts_winner_is_party"),
        CheckConstraint("(status = 'open') = (resolved_at is null)",
                        name="ck_conflicts_resolved_when_closed"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_conflicts_scopes_nonempty"),
        Index("ix_conflicts_tenant_id_status", "tenant_id", "status"),
        {"schema": "knowledge"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    kind: Mapped[str] = mapped_column(ConflictKind)
    claim_a: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    claim_b: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    subject_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    predicate: Mapped[str] = mapped_column(Text)
    perspective_key: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    status: Mapped[str] = mapped_column(ConflictStatus, server_default=sql_text("'open'"))
    strategy: Mapped[str | None] = mapped_column(ResolutionStrategy)
    winner_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    detected_at: Mapped[datetime] = _now()
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    resolved_by: Mapped[str | None] = mapped_column(Text)


# --- memory --------------------------------------------------------------------------


def _scoped(table: str) -> CheckConstraint:
    return CheckConstraint("cardinality(scopes) >= 1", name=f"ck_{table}_scopes_nonempty")


class WorkingMemoryItem(_Embedded, Base):
    __tablename__ = "working_memory"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_working_memory"),
        _tenant_fk("working_memory"),
        _scoped("working_memory"),
        *_embedding_checks("working_memory"),
        CheckConstraint("length(session_id) between 1 and 200",
                        name="ck_working_memory_session_id_length"),
        CheckConstraint("length(text) between 1 and 20000", name="ck_working_memory_text_length"),
        CheckConstraint("expires_at > created_at", name="ck_working_memory_expires_after_created"),
        CheckConstraint("kind in ('note', 'decision')", name="ck_working_memory_kind_known"),
        CheckConstraint("category is null or (kind = 'decision' and length(category) between 1 and 100)",
                        name="ck_working_memory_category_of_decision"),
        Index("ix_working_memory_tenant_id_user_id_session_id", "tenant_id", "user_id",
              "session_id"),
        *_ann_indexes("working_memory"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    session_id: Mapped[str] = mapped_column(Text)
    user_id: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    text: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=sql_text("now() + interval '1 day'"))
    kind: Mapped[str] = mapped_column(Text, server_default=sql_text("'note'"))
    category: Mapped[str | None] = mapped_column(Text)  # 0011: decision items only


class Profile(_Summarised, _Embedded, Base):
    __tablename__ = "profiles"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_profiles"),
        _tenant_fk("profiles"),
        _entity_fk("profiles", "subject_entity_id"),
        _scoped("profiles"),
        *_embedding_checks("profiles"),
        CheckConstraint("(subject_entity_id is null) <> (subject_user_id is null)",
                        name="ck_profiles_one_subject"),
        CheckConstraint("length(summary) between 1 and 20000", name="ck_profiles_summary_length"),
        _summary_method("profiles"),
        Index("ix_profiles_tenant_id_subject_entity_id", "tenant_id", "subject_entity_id"),
        Index("ix_profiles_tenant_id_subject_user_id", "tenant_id", "subject_user_id"),
        *_ann_indexes("profiles"),
        # 0017: one profile per subject, perspective partition and scope set.
        CheckConstraint("perspective_key = 'world' or perspective_key ~ '^user:.+'",
                        name="ck_profiles_perspective_key_format"),
        CheckConstraint("input_digest is null or length(input_digest) = 32",
                        name="ck_profiles_input_digest_length"),
        Index("uq_profiles_tenant_id_subject_entity_id_perspective_key_scopes",
              "tenant_id", "subject_entity_id", "perspective_key", "scopes", unique=True,
              postgresql_where=sql_text("subject_entity_id is not null")),
        Index("uq_profiles_tenant_id_subject_user_id_scopes", "tenant_id", "subject_user_id", "scopes",
              unique=True, postgresql_where=sql_text("subject_user_id is not null")),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    subject_entity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    subject_user_id: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    perspective_key: Mapped[str] = mapped_column(Text, server_default=sql_text("'world'"))
    input_digest: Mapped[bytes | None] = mapped_column(BYTEA)


class Episode(_Summarised, _Embedded, Base):
    __tablename__ = "episodes"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_episodes"),
        _tenant_fk("episodes"),
        _scoped("episodes"),
        *_embedding_checks("episodes"),
        CheckConstraint("ended_at >= started_at", name="ck_episodes_span_ordered"),
        CheckConstraint("turn_count >= 0", name="ck_episodes_turn_count_nonnegative"),
        CheckConstraint("length(summary) between 1 and 20000", name="ck_episodes_summary_length"),
        _summary_method("episodes"),
        Index("ix_episodes_tenant_id_started_at", "tenant_id", "started_at"),
        CheckConstraint("not private or user_id is not null", name="ck_episodes_private_has_user"),
        Index("ix_episodes_tenant_id_user_id_session_id", "tenant_id", "user_id", "session_id"),
        *_ann_indexes("episodes"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    session_id: Mapped[str] = mapped_column(Text)
    user_id: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    summary: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    turn_count: Mapped[int] = mapped_column(Integer, server_default=sql_text("0"))
    source_item_ids: Mapped[list[uuid.UUID]] = mapped_column(UUIDS, server_default=sql_text("'{}'"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    # 0011: readable only by user_id (built from that user's working memory).
    private: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))


class Observation(_Summarised, _Embedded, Base):
    __tablename__ = "observations"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_observations"),
        _tenant_fk("observations"),
        _entity_fk("observations", "subject_entity_id"),
        _scoped("observations"),
        *_embedding_checks("observations"),
        CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_observations_confidence_range"),
        CheckConstraint("length(text) between 1 and 20000", name="ck_observations_text_length"),
        _summary_method("observations"),
        CheckConstraint("observation_key is null or length(observation_key) between 1 and 200",
                        name="ck_observations_observation_key_length"),
        Index("uq_observations_tenant_id_observation_key", "tenant_id", "observation_key",
              unique=True, postgresql_where=sql_text("observation_key is not null")),
        # What a withdrawn claim was drawn into (memory.withdraw_derived, 0094).
        Index("ix_observations_source_claim_ids", "source_claim_ids", postgresql_using="gin"),
        *_ann_indexes("observations"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    text: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(DOUBLE_PRECISION)
    subject_entity_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    perspective_key: Mapped[str] = mapped_column(Text, server_default=sql_text("'world'"))
    source_claim_ids: Mapped[list[uuid.UUID]] = mapped_column(UUIDS, server_default=sql_text("'{}'"))
    observation_key: Mapped[str | None] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()


DECISION_TEXT = ("category || ': ' || scenario || ' Reasoning: ' || reasoning"
                 " || coalesce(' Outcome: ' || outcome, '')")


class Decision(_Embedded, Base):
    __tablename__ = "decisions"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_decisions"),
        _tenant_fk("decisions"),
        _scoped("decisions"),
        CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_decisions_confidence_range"),
        CheckConstraint("length(category) between 1 and 100", name="ck_decisions_category_length"),
        CheckConstraint("length(scenario) between 1 and 20000", name="ck_decisions_scenario_length"),
        CheckConstraint("length(reasoning) between 1 and 20000",
                        name="ck_decisions_reasoning_length"),
        Index("ix_decisions_tenant_id_decided_at", "tenant_id", "decided_at"),
        *_embedding_checks("decisions"),
        CheckConstraint("(source_table is null) = (source_id is null)",
                        name="ck_decisions_source_pair"),
        *_ann_indexes("decisions"),
        Index("uq_decisions_tenant_id_source_table_source_id", "tenant_id", "source_table",
              "source_id", unique=True, postgresql_where=sql_text("source_id is not null")),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    category: Mapped[str] = mapped_column(Text)
    scenario: Mapped[str] = mapped_column(Text)
    reasoning: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str | None] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(DOUBLE_PRECISION)
    decided_at: Mapped[datetime] = _now()
    decided_by: Mapped[str | None] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    embed_text: Mapped[str] = mapped_column(Text, Computed(DECISION_TEXT, persisted=True))
    source_table: Mapped[str | None] = mapped_column(Text)
    source_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))


class DecisionLink(Base):
    __tablename__ = "decision_links"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_decision_links"),
        UniqueConstraint("tenant_id", "from_decision_id", "to_decision_id", "kind",
                         name="uq_decision_links_from_to_kind"),
        _tenant_fk("decision_links"),
        ForeignKeyConstraint(["tenant_id", "from_decision_id"],
                             ["memory.decisions.tenant_id", "memory.decisions.id"],
                             name="fk_decision_links_tenant_id_from_decision_id_decisions",
                             ondelete="CASCADE"),
        ForeignKeyConstraint(["tenant_id", "to_decision_id"],
                             ["memory.decisions.tenant_id", "memory.decisions.id"],
                             name="fk_decision_links_tenant_id_to_decision_id_decisions",
                             ondelete="CASCADE"),
        _scoped("decision_links"),
        CheckConstraint("from_decision_id <> to_decision_id", name="ck_decision_links_not_self"),
        Index("ix_decision_links_tenant_id_to_decision_id", "tenant_id", "to_decision_id"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    from_decision_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    to_decision_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    kind: Mapped[str] = mapped_column(CausalLink)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()


class Community(_Summarised, _Embedded, Base):
    __tablename__ = "communities"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_communities"),
        _tenant_fk("communities"),
        _scoped("communities"),
        *_embedding_checks("communities"),
        CheckConstraint("level >= 0", name="ck_communities_level_nonnegative"),
        CheckConstraint("cardinality(member_entity_ids) >= 1", name="ck_communities_members_nonempty"),
        CheckConstraint("length(summary) between 1 and 20000", name="ck_communities_summary_length"),
        _summary_method("communities"),
        Index("ix_communities_member_entity_ids", "member_entity_ids", postgresql_using="gin"),
        *_ann_indexes("communities"),
        # 0017: the hierarchy (parent one level up) and what each summary was made from.
        ForeignKeyConstraint(["tenant_id", "parent_id"],
                             ["memory.communities.tenant_id", "memory.communities.id"],
                             name="fk_communities_tenant_id_parent_id_communities"),
        CheckConstraint("parent_id is null or parent_id <> id", name="ck_communities_not_own_parent"),
        CheckConstraint("input_digest is null or length(input_digest) = 32",
                        name="ck_communities_input_digest_length"),
        Index("ix_communities_tenant_id_parent_id", "tenant_id", "parent_id"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    level: Mapped[int] = mapped_column(Integer)
    member_entity_ids: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    summary: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    built_at: Mapped[datetime] = _now()
    parent_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    input_digest: Mapped[bytes | None] = mapped_column(BYTEA)


class RaptorNode(_Summarised, _Embedded, Base):
    __tablename__ = "raptor_nodes"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_raptor_nodes"),
        _tenant_fk("raptor_nodes"),
        ForeignKeyConstraint(["tenant_id", "parent_id"],
                             ["memory.raptor_nodes.tenant_id", "memory.raptor_nodes.id"],
                             name="fk_raptor_nodes_tenant_id_parent_id_raptor_nodes"),
        _scoped("raptor_nodes"),
        *_embedding_checks("raptor_nodes"),
        CheckConstraint("level >= 0", name="ck_raptor_nodes_level_nonnegative"),
        CheckConstraint("parent_id is null or parent_id <> id", name="ck_raptor_nodes_not_own_parent"),
        CheckConstraint("length(summary) between 1 and 20000", name="ck_raptor_nodes_summary_length"),
        _summary_method("raptor_nodes"),
        Index("ix_raptor_nodes_member_chunk_ids", "member_chunk_ids", postgresql_using="gin"),
        Index("ix_raptor_nodes_member_fact_ids", "member_fact_ids", postgresql_using="gin"),
        Index("ix_raptor_nodes_tenant_id_parent_id", "tenant_id", "parent_id"),
        Index("ix_raptor_nodes_roots", "tenant_id", "level",
              postgresql_where=sql_text("parent_id is null")),
        *_ann_indexes("raptor_nodes"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    level: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    children: Mapped[list[uuid.UUID]] = mapped_column(UUIDS, server_default=sql_text("'{}'"))
    summary: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[uuid.UUID]] = mapped_column(UUIDS)
    created_at: Mapped[datetime] = _now()
    member_chunk_ids: Mapped[list[uuid.UUID]] = mapped_column(UUIDS, server_default=sql_text("'{}'"))
    member_fact_ids: Mapped[list[uuid.UUID]] = mapped_column(UUIDS, server_default=sql_text("'{}'"))
    centroid: Mapped[Any | None] = mapped_column(Vector(EMBEDDING_DIMENSION))
    updated_at: Mapped[datetime] = _now()


class UsageEvent(Base):
    __tablename__ = "usage_ledger"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_usage_ledger"),
        _tenant_fk("usage_ledger"),
        CheckConstraint(r"operation ~ '^[a-z][a-z0-9_.]{0,62}$'",
                        name="ck_usage_ledger_operation_format"),
        CheckConstraint("channel in ('graphql', 'mcp', 'python', 'cli', 'worker')",
                        name="ck_usage_ledger_channel_known"),
        CheckConstraint("(item_table is null) = (item_id is null)", name="ck_usage_ledger_item_pair"),
        Index("ix_usage_ledger_tenant_id_occurred_at", "tenant_id", "occurred_at"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    operation: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    item_table: Mapped[str | None] = mapped_column(Text)
    item_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    user_id: Mapped[str] = mapped_column(Text, server_default=sql_text("auth.user_id()"))
    occurred_at: Mapped[datetime] = _now()


class UsageDaily(Base):
    __tablename__ = "usage_daily"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_usage_daily"),
        UniqueConstraint("tenant_id", "day", "operation", "channel",
                         name="uq_usage_daily_tenant_id_day_operation_channel"),
        _tenant_fk("usage_daily"),
        CheckConstraint("operations >= 0 and users >= 0", name="ck_usage_daily_counts_nonnegative"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = _tenant()
    id: Mapped[uuid.UUID] = _id()
    day: Mapped[date] = mapped_column(Date)
    operation: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    operations: Mapped[int] = mapped_column(BigInteger)
    users: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = _now()


class ValueDaily(Base):
    """Per day and item: how often the ledger named it (0017); readable with the item."""

    __tablename__ = "value_daily"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "day", "item_table", "item_id", name="pk_value_daily"),
        _tenant_fk("value_daily"),
        CheckConstraint("uses >= 0 and marks >= 0 and users >= 0 and marks <= uses",
                        name="ck_value_daily_counts"),
        Index("ix_value_daily_tenant_id_item_table_item_id", "tenant_id", "item_table", "item_id", "day"),
        {"schema": "memory"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    day: Mapped[date] = mapped_column(Date)
    item_table: Mapped[str] = mapped_column(Text)
    item_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    uses: Mapped[int] = mapped_column(BigInteger)
    marks: Mapped[int] = mapped_column(BigInteger)
    users: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = _now()


# --- views (not in metadata: the drift check compares tables only) ------------------

views = MetaData()

current_claims = Table(
    "current_claims", views,
    *(Column(c.name, c.type) for c in FactClaim.__table__.columns
      if c.name not in ("superseded_at",)),
    Column("text", Text),
    schema="knowledge",
)
"""Claims true now and still believed, with their text (RLS of the caller)."""

effective_claims = Table(
    "effective_claims", views,
    *(Column(c.name, c.type) for c in current_claims.columns),
    Column("beaten_by", UUID(as_uuid=True)),
    schema="knowledge",
)
"""Current claims plus ``beaten_by``: the keyed fact that outranks and contradicts one."""

__all__ = [
    "Community", "Decision", "DecisionLink", "Entity", "Episode", "FactClaim", "FactConflict",
    "FactContent", "Observation", "Profile", "Quarantine", "RaptorNode", "Shape", "TenantSettings",
    "UsageDaily", "UsageEvent", "ValueDaily", "WorkingMemoryItem", "current_claims", "effective_claims",
]
