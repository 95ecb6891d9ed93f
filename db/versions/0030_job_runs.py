"""Derive job runs that failed or skipped an item, kept where a reader (and the console) can see them.

Why: one poisoned item (an entity mention longer than a name may be, a row the
database refuses) used to fail its job for the whole tenant on every tick, and
the only trace was a line in the worker's log. The jobs now skip such an item,
count it and go on (``orchestrator/derive/poison.py``); ``memory.job_runs`` keeps
the runs worth a look: those that failed and those that skipped something, with
the skipped items (where to find each, and why; never its content), so the
console's job view and ``engram derive`` can show them after the log has
rotated. A run that only did its work is not kept (the chain's activity says
what it wrote): a quiet tick writes nothing, as before.

Visibility: a run is shared into the scopes its identity could write when it
ran (the service: every scope of the tenant), and readable only by a reader of
**every** one of them (``scopes <@ auth.read_scopes()``): its counts and item
names cover all of them, so a reader of one scope must not learn what another
scope holds from a job report. A run is written by its own identity (``run_by``
is the bound user), is never updated, and only the service deletes (it prunes
its tenant's runs older than ``ENGRAM_DERIVE_JOB_RUNS_KEEP_DAYS`` as it goes).
The table is chained like every memory table.

Revision ID: 0030_job_runs
Revises: 0081_embedding_progress
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0030_job_runs"
down_revision = "0081_embedding_progress"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
UUIDS = postgresql.ARRAY(postgresql.UUID(as_uuid=True))
TS = sa.DateTime(timezone=True)

SQL = r"""
alter table memory.job_runs enable row level security;
alter table memory.job_runs force row level security;
-- The overlap test first, spelled as every read policy spells it (0015: the planner's
-- estimate); the containment is the rule.
create policy job_runs__select_app on memory.job_runs for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and arrayoverlap(scopes, (select auth.read_scopes()))
           and scopes <@ (select auth.read_scopes()));
create policy job_runs__insert_app on memory.job_runs for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes())
                and run_by = (select auth.user_id()));
create policy job_runs__delete_service on memory.job_runs for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and (select auth.is_service()));
create trigger tg_job_runs__scopes before insert on memory.job_runs
    for each row execute function memory.tg_scoped__check();
grant select, delete on memory.job_runs to engram_app;
grant insert (job, ok, line, skipped, problems, scopes, started_at) on memory.job_runs to engram_app;
comment on table memory.job_runs is
    'Derive job runs that failed or skipped an item (which, and why); readable by readers of every '
    'scope the run covered. Quiet runs are not kept.';
comment on policy job_runs__select_app on memory.job_runs is
    'A run covers every scope its identity could write: only a reader of all of them sees it.';
comment on policy job_runs__insert_app on memory.job_runs is
    'A run is recorded by its own identity, into scopes it may write.';
comment on policy job_runs__delete_service on memory.job_runs is
    'Only the derive service prunes old runs.';
"""


def upgrade() -> None:
    op.create_table(
        "job_runs",
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", UUID, server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("run_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("skipped", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("problems", postgresql.JSONB(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_job_runs"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_job_runs_tenant_id_tenants",
                                ondelete="CASCADE"),
        sa.CheckConstraint(r"job ~ '^[a-z][a-z0-9_.]{0,62}$'", name="ck_job_runs_job_format"),
        sa.CheckConstraint("length(line) <= 2000", name="ck_job_runs_line_length"),
        sa.CheckConstraint("skipped >= 0", name="ck_job_runs_skipped_nonnegative"),
        sa.CheckConstraint("jsonb_typeof(problems) = 'array' and jsonb_array_length(problems) <= 100",
                           name="ck_job_runs_problems_list"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_job_runs_scopes_nonempty"),
        schema="memory",
    )
    op.create_index("ix_job_runs_tenant_id_job_finished_at", "job_runs", ["tenant_id", "job", "finished_at"],
                    schema="memory")
    op.execute(SQL)
    op.execute(sa.text("select provenance.attach_chain(cast(:t as regclass))").bindparams(t="memory.job_runs"))


def downgrade() -> None:
    op.drop_table("job_runs", schema="memory")
