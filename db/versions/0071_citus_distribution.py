"""Citus: every tenant table distributed by tenant_id, colocated; the shared tables replicated.

Why: past one PostgreSQL, Engram scales out by tenant (docs/scale-out.md). When the
``citus`` extension exists in the database (the docker/compose.citus.yaml coordinator
creates it before migrating), this revision makes the three shared tables reference
tables (a copy on every node) and distributes every other table by ``tenant_id`` into one
colocation group, anchored on ``auth.scopes``: all of a tenant's rows, in every table,
live on the same shard group, so a statement that names one tenant (every recall and every
request write: their scans carry ``tenant_id = auth.tenant_id()``) is routed to one node,
and foreign keys, triggers and the provenance chain's per-tenant lock and sequence stay
local to it. sql_checks/85_citus_ready.sql proves from the catalog that the keys allow
this (every primary key leads with tenant_id, every unique key and tenant-to-tenant
foreign key includes it).

Order matters to Citus: reference tables first, then the anchor, then each table after
every table its foreign keys point at. Engram's triggers are created on the shards, which
Citus allows only with ``citus.enable_unsafe_triggers`` (each trigger touches rows of its
own tenant only: the same catalog check). On a server without Citus nothing happens. The
statements are kept as data so that tests/test_citus_ddl.py can run them against stand-in
functions that enforce Citus's rules, on a server without Citus.

It is the last revision of its round, so that it sees every table; a later migration that
adds a tenant table distributes it itself when Citus is present
(tests/test_citus_ddl.py fails until it is listed).

Revision ID: 0071_citus_distribution
Revises: 0050_rank_learning
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0071_citus_distribution"
down_revision = "0050_rank_learning"
branch_labels = None
depends_on = None

REFERENCE_TABLES = ("auth.tenants", "engram.installation", "worker.embedding_models")
COLOCATION_ANCHOR = "auth.scopes"
# Every table with tenant_id, each after the tables its foreign keys reference.
DISTRIBUTED_TABLES = (
    "auth.scopes",
    "sources.documents",
    "sources.chunks",
    "knowledge.entities",
    "knowledge.fact_content",
    "knowledge.fact_claim",
    "knowledge.shapes",
    "knowledge.tenant_settings",
    "knowledge.quarantine",
    "knowledge.conflicts",
    "memory.working_memory",
    "memory.profiles",
    "memory.episodes",
    "memory.observations",
    "memory.decisions",
    "memory.decision_links",
    "memory.communities",
    "memory.raptor_nodes",
    "memory.usage_ledger",
    "memory.usage_daily",
    "memory.lifecycle_policies",
    "memory.document_use",
    "memory.extractions",
    "memory.value_daily",
    "provenance.agents",
    "provenance.activities",
    "provenance.derivations",
    "provenance.events",
    "provenance.pending",
    "provenance.pending_commits",
    "provenance.receipts",
    "worker.embedding_cache",
    "worker.embed_retries",
    "recall.lexical_stats",
    "memory.job_runs",
    "provenance.receipt_queue",
    "recall.lexical_terms",
    "recall.lexical_term_deltas",
    "memory.rank_models",
    "memory.rank_events",
)

# Run by the migrating superuser when Citus is present, in order.
CITUS_SETUP = ("set local citus.enable_unsafe_triggers = on",)


def citus_statements() -> list[str]:
    statements = [f"select create_reference_table('{t}')" for t in REFERENCE_TABLES]
    for table in DISTRIBUTED_TABLES:
        colocate = "" if table == COLOCATION_ANCHOR else f", colocate_with => '{COLOCATION_ANCHOR}'"
        statements.append(f"select create_distributed_table('{table}', 'tenant_id'{colocate})")
    statements.append(
        "insert into engram.installation (key, value) values ('distribution', 'citus') "
        "on conflict (key) do update set value = excluded.value, recorded_at = now()")
    return statements


def citus_present(bind: sa.engine.Connection) -> bool:
    return bool(bind.execute(sa.text(
        "select exists (select 1 from pg_extension where extname = 'citus')")).scalar())


def upgrade() -> None:
    if not citus_present(op.get_bind()):
        return
    op.execute("reset role")
    for stmt in (*CITUS_SETUP, *citus_statements()):
        op.execute(stmt)
    op.execute("set role engram_owner")


def downgrade() -> None:
    if not citus_present(op.get_bind()):
        return
    op.execute("reset role")
    op.execute("set local citus.enable_unsafe_triggers = on")
    for table in reversed(DISTRIBUTED_TABLES):
        op.execute(f"select undistribute_table('{table}', cascade_via_foreign_keys => true)")
    for table in REFERENCE_TABLES:
        op.execute(f"select undistribute_table('{table}', cascade_via_foreign_keys => true)")
    op.execute("delete from engram.installation where key = 'distribution'")
    op.execute("set role engram_owner")
