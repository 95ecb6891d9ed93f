"""The conflict sweep pairs only claims whose predicates a shape can make contradict.

Why: ``knowledge.find_conflicts(null)``, the whole-tenant sweep the derive tick runs
(``detect_conflicts``, under the tenant's exclusive conflict lock, which every claim write of
the tenant waits for), joined every current claim with every other current claim of its
subject and perspective, and only then asked whether a shape makes the pair a conflict.
Extraction writes a ``mentioned_in`` claim per document an entity is named in and a
``co_mentioned_with`` claim per pair of entities named together, and none of those
predicates has a shape: after ``engram ingest /usr/share/doc`` a tenant held 160,540 claims,
27,044 of them about one subject, and no shape at all, so the sweep walked hundreds of
millions of pairs to find none. It ran for minutes on one core while extraction's claim
writes waited on the lock (beside it and extraction the embedding worker did 6-7 rows a
second, 12-13 just after a restart; the sweep's own share was not measured). The write path has skipped claims of unshaped predicates since 0018.

A pair is reported only when its predicates are the same and a shape makes that predicate
functional (``max_count = 1``), or differ and a shape makes one exclusive with the other:
both predicates are then among the shaped ones (a functional predicate, a predicate with
``exclusive_with``, or a predicate named in one). The sweep now keeps to claims of those
predicates on both sides before it pairs them; what it reports is exactly what it did
(pgTAP 13 and 61), and with no shape it reads nothing but the shapes.

Revision ID: 0091_conflict_sweep_shaped
Revises: 0090_fold_lexical_terms_linear
"""

from __future__ import annotations

from alembic import op

from orchestrator.db.migrate import patched, released_sql

revision = "0091_conflict_sweep_shaped"
down_revision = "0090_fold_lexical_terms_linear"
branch_labels = None
depends_on = None

# (anchor in 0004's text, what it becomes): the shaped predicates, once; both sides of a pair
# among them.
PATCHES = (
    ("""as $$
    select case when p.predicate <> q.predicate then 'relation'
""", """as $$
    with shaped as (
        -- The predicates a shape can make contradict (0091): functional ones, ones with
        -- exclusive_with, and those named in it. Both sides of every pair reported are.
        select s.predicate from knowledge.shapes s
         where s.tenant_id = (select auth.tenant_id())
           and (s.max_count = 1 or cardinality(s.exclusive_with) > 0)
        union
        select x from knowledge.shapes s cross join unnest(s.exclusive_with) as x
         where s.tenant_id = (select auth.tenant_id())
    )
    select case when p.predicate <> q.predicate then 'relation'
"""),
    ("""     where p.tenant_id = (select auth.tenant_id()) and p.superseded_at is null
""", """     where p.tenant_id = (select auth.tenant_id()) and p.superseded_at is null
       -- As arrays: a test at each scan, which no join order can put after the pairing.
       and p.predicate = any (array(select predicate from shaped))
       and q.predicate = any (array(select predicate from shaped))
"""),
)


def _released() -> str:
    """0004's ``find_conflicts`` as released, as a ``create or replace``."""
    return "create or replace " + released_sql(
        "0004_knowledge", "FUNCTIONS_SQL", "create function knowledge.find_conflicts(",
        "comment on function knowledge.find_conflicts(")[len("create "):]


def upgrade() -> None:
    op.execute(patched(_released(), PATCHES, "0004's find_conflicts"))


def downgrade() -> None:
    op.execute(_released())
