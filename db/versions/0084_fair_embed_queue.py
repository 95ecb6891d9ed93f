"""The embedding queue serves every tenant, and every document, its turn.

Why: the worker claimed the oldest pending rows of a table (``order by created_at``, over
``ix_<table>_embed_queue (created_at) where embed_state = 'pending'``). One tenant's bulk
write, or one large document, therefore held every row written after it, of every tenant:
a 2 MB document (1,584 chunks) written through MCP kept a one-paragraph note written a
second later, by anyone, pending for minutes, its document unsearchable by meaning.

What changes: each embeddable table's queue index leads with ``tenant_id`` (chunks:
``(tenant_id, ordinal, created_at)``, the others ``(tenant_id, created_at)``), still
partial on pending rows. The worker (``orchestrator.worker.queue``) finds the tenants
with pending rows by walking that index (one probe per tenant, not a scan of the
backlog), gives each its share of a batch, and within a tenant takes chunks by their
place in their document first: every pending document's first chunks before any
document's later ones. Same name, same predicate; nothing else depends on the order.
``engram_worker`` may now read ``sources.chunks.ordinal`` (a chunk's place in its document)
for that order; it reads no other new column.

Revision ID: 0084_fair_embed_queue
Revises: 0083_usage_written_after
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0084_fair_embed_queue"
down_revision = "0083_usage_written_after"
branch_labels = None
depends_on = None

PENDING = sa.text("embed_state = 'pending'")
# (schema, table, the columns after tenant_id); orchestrator.worker.queue.EMBEDDABLE's order.
QUEUES = (
    ("sources", "chunks", ("ordinal", "created_at")),
    ("knowledge", "fact_content", ("created_at",)),
    *(("memory", t, ("created_at",)) for t in (
        "working_memory", "profiles", "episodes", "observations", "communities",
        "raptor_nodes", "decisions")),
)


def upgrade() -> None:
    op.execute("grant select (ordinal) on sources.chunks to engram_worker")
    for schema, table, columns in QUEUES:
        op.drop_index(f"ix_{table}_embed_queue", table_name=table, schema=schema)
        op.create_index(f"ix_{table}_embed_queue", table, ["tenant_id", *columns], schema=schema,
                        postgresql_where=PENDING)


def downgrade() -> None:
    for schema, table, _ in QUEUES:
        op.drop_index(f"ix_{table}_embed_queue", table_name=table, schema=schema)
        op.create_index(f"ix_{table}_embed_queue", table, ["created_at"], schema=schema,
                        postgresql_where=PENDING)
    op.execute("revoke select (ordinal) on sources.chunks from engram_worker")
