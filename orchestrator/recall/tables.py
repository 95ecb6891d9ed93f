"""Mapped tables of ``db/versions/0008_recall.py`` and ``0041_lexical_terms.py``.

``LexicalStat`` holds BM25's corpus statistics (N and the total length) and
``LexicalTerm`` its document frequencies, per scope set, as append-only deltas (see
the revisions' docstrings for why there is no hot counter row). The documents'
title key (0014) is mapped on ``Document`` itself.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Index,
    PrimaryKeyConstraint,
    Text,
)
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base


class LexicalStat(Base):
    __tablename__ = "lexical_stats"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_lexical_stats"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_stats_scopes_nonempty"),
        {"schema": "recall"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    chunks: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                  server_default=sql_text("now()"))



class LexicalTerm(Base):
    __tablename__ = "lexical_terms"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id", name="pk_lexical_terms"),
        CheckConstraint("cardinality(scopes) >= 1", name="ck_lexical_terms_scopes_nonempty"),
        Index("ix_lexical_terms_tenant_id_lexeme", "tenant_id", "lexeme",
              postgresql_include=["scopes", "chunks"]),
        {"schema": "recall"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True),
                                                 server_default=sql_text("auth.tenant_id()"))
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=sql_text("uuidv7()"))
    scopes: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)))
    lexeme: Mapped[str] = mapped_column(Text)
    chunks: Mapped[int] = mapped_column(BigInteger)
