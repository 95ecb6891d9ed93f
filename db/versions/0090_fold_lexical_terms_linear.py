"""Folding BM25 document frequencies: a count that reaches 0 goes, and no join to plan badly.

Why: ``recall.fold_lexical_terms`` (0041) upserted each tenant's summed deltas and, in the
same statement, deleted the rows the upsert left at 0 by joining the tenant's terms with
the upsert's ``RETURNING``. Two things were wrong with that join:

* **It deleted nothing.** The statements of a ``WITH`` run on one snapshot: the outer
  ``DELETE`` cannot see a row the upsert inserted, and a row the upsert updated counts as
  modified by the same command, which a ``DELETE`` skips. A lexeme whose every chunk went
  (an edited or deleted document) kept its row at ``chunks = 0`` for good.
* **Its cost hung on a join order.** The join reads the upsert's ``RETURNING`` rows, which
  a large fold spills to disk; a nested loop with the tenant's terms outside rescans them
  once per term. After ``engram ingest /usr/share/doc`` (1,097 files, 26,155 chunks: 19,491
  delta rows holding 1.25 million lexemes, 288k-354k keys) the derive tick's fold was seen
  running for more than five minutes on one core in ``BufFileRead``, while the worker's own
  fold waited on the tenant's lock; the same statement on the same deltas, planned again
  with the statistics autovacuum had gathered since, took 2.6 s. Which plan the first run
  had was not caught (``benchmarks/lexical_fold.py`` with stale statistics did not bring
  it back); the fold below has no join for a plan to get wrong.

Now the upsert returns the row addresses of the rows it left at 0 (one pass over its own
output, no join), and a statement of its own deletes them by address after it (the
tenant's lock keeps every other folder out between the two). Rows left at 0 by the old
fold are deleted here (as the migrating superuser: under the table's forced RLS the owner
sees none of them).

Revision ID: 0090_fold_lexical_terms_linear
Revises: 0089_chunk_sections
"""

from __future__ import annotations

from alembic import op

from orchestrator.db.migrate import patched, released_sql

revision = "0090_fold_lexical_terms_linear"
down_revision = "0089_chunk_sections"
branch_labels = None
depends_on = None

# 0041's fold with two changes (each anchor must occur once): the upsert returns the
# addresses of the rows it left at 0, and a statement of its own deletes them.
FOLD_PATCHES = (
    ("""    v_done integer := 0;
begin""", """    v_done integer := 0;
    v_emptied tid[];
begin"""),
    ("""            returning t.lexeme, t.scopes, t.chunks
        )
        delete from recall.lexical_terms t
         using folded f
         where t.tenant_id = v_tenant and t.lexeme = f.lexeme and t.scopes = f.scopes and f.chunks = 0;
""", """            returning t.ctid as tid, t.chunks
        )
        select coalesce(array_agg(f.tid) filter (where f.chunks = 0), '{}') into v_emptied
          from folded f;
        -- A statement of its own: it sees what the upsert wrote (a WITH's statements share
        -- one snapshot, so 0041's delete beside the upsert never saw a row it left at 0). By
        -- the addresses alone (a TID scan): a test of the tenant too would let the planner
        -- walk the tenant's rows by the primary key instead (80 ms a small fold, measured).
        if cardinality(v_emptied) > 0 then
            delete from recall.lexical_terms t where t.ctid = any (v_emptied) and t.chunks = 0;
        end if;
"""),
)


def _released_fold() -> str:
    """0041's fold as released: from its ``create function`` to the end of 0041's ``TRIGGER``
    (its comment, revoke and grant), as a ``create or replace``."""
    return "create or replace " + released_sql(
        "0041_lexical_terms", "TRIGGER", "create function recall.fold_lexical_terms(")[len("create "):]


def upgrade() -> None:
    op.execute(patched(_released_fold(), FOLD_PATCHES, "0041's fold"))
    op.execute("reset role")
    op.execute("delete from recall.lexical_terms where chunks = 0")
    op.execute("set role engram_owner")


def downgrade() -> None:
    op.execute(_released_fold())
