"""Client-chosen keys are unique per scope set, so a write can never learn that a hidden row exists.

Why: a document's ``(collection, path)`` and a keyed fact's ``(fact_key, as_of)``
were unique per tenant. A writer who may not read a row still met it through the
constraint: ``upsertDocument`` at a hidden document's path answered CONFLICT
("duplicate key ... uq_documents_tenant_id_collection_path") where a free path
succeeded, and ``assertFact`` at a hidden keyed fact's key and moment did the same.
That is an existence oracle: one probe per guessed path tells whether a document
the caller may not see is there.

Now both keys include the row's **scope set** (the sorted, de-duplicated array
``auth.check_scopes`` stores). A writer can write a row only into scopes it holds
write on, and write implies read, so every row with the same key *and* the same
scope set is one it can read: the constraint can only ever refuse a write because of
a row the writer sees. A hidden row at the same ``(collection, path)`` in another
scope set no longer collides; the write lands as it would at a free key. Which
visible row a path names, when readers see several, is the application's rule
(``orchestrator.ingest.documents``); a second keyed snapshot at the same key and
moment that the writer *can* see is refused by ``orchestrator.ingest.knowledge``
before the insert, as before.

Downgrade restores per-tenant uniqueness and fails if two rows now share a key
in different scope sets (decide which to keep first).

Revision ID: 0020_scope_set_keys
Revises: 0070_vectorchord_tier
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_scope_set_keys"
down_revision = "0070_vectorchord_tier"
branch_labels = None
depends_on = None

KEYED = sa.text("fact_key is not null")


def upgrade() -> None:
    op.drop_constraint("uq_documents_tenant_id_collection_path", "documents", schema="sources")
    op.create_unique_constraint("uq_documents_tenant_id_collection_path_scopes", "documents",
                                ["tenant_id", "collection", "path", "scopes"], schema="sources")
    op.drop_index("ix_fact_claim_tenant_id_fact_key_as_of", table_name="fact_claim",
                  schema="knowledge")
    op.create_index("uq_fact_claim_tenant_id_fact_key_as_of_scopes", "fact_claim",
                    ["tenant_id", "fact_key", "as_of", "scopes"], schema="knowledge", unique=True,
                    postgresql_where=KEYED)
    op.execute("""
comment on constraint uq_documents_tenant_id_collection_path_scopes on sources.documents is
    'A path is unique per scope set: a writer can only collide with documents it can read.';
comment on index knowledge.uq_fact_claim_tenant_id_fact_key_as_of_scopes is
    'A keyed snapshot (key, as_of) is unique per scope set: a writer can only collide with '
    'claims it can read.';
""")


def downgrade() -> None:
    op.drop_index("uq_fact_claim_tenant_id_fact_key_as_of_scopes", table_name="fact_claim",
                  schema="knowledge")
    op.create_index("ix_fact_claim_tenant_id_fact_key_as_of", "fact_claim",
                    ["tenant_id", "fact_key", "as_of"], schema="knowledge", unique=True,
                    postgresql_where=KEYED)
    op.drop_constraint("uq_documents_tenant_id_collection_path_scopes", "documents",
                       schema="sources")
    op.create_unique_constraint("uq_documents_tenant_id_collection_path", "documents",
                                ["tenant_id", "collection", "path"], schema="sources")
