"""A conflict is readable only by someone who can read both its claims and its subject.

Why: a conflict row carries its two claims' ids and their subject's id, and was
shared into the union of the claims' scopes, so a reader of either claim's scopes
read it. A reader of ``board`` saw a conflict between a ``board`` claim and an
``hr`` claim, with the ``hr`` claim's id (and, for a subject in ``hr``, the
subject's id): ids of rows the reader cannot read.

Now ``conflicts__select_app`` also asks that both claims and the subject entity are
readable (each test runs under that table's own policies), so a conflict shows
exactly what its reader could already see. ``knowledge.record_conflicts`` records a
pair only when the writer can read the subject too: its ``returning`` must satisfy
the read policy, and a writer asserting claims about an entity it cannot read must
not fail for a conflict it may not see. The derive tick's sweep (as the service,
which reads everything) still records every conflict, for the readers who may see it.

Revision ID: 0021_conflict_visibility
Revises: 0020_scope_set_keys
"""

from __future__ import annotations

from alembic import op

revision = "0021_conflict_visibility"
down_revision = "0020_scope_set_keys"
branch_labels = None
depends_on = None

READ = ("tenant_id = (select auth.tenant_id()) "
        "and pg_catalog.arrayoverlap(scopes, (select auth.read_scopes()))")
PARTIES = """
           and exists (select 1 from knowledge.fact_claim a
                        where a.tenant_id = conflicts.tenant_id and a.id = conflicts.claim_a)
           and exists (select 1 from knowledge.fact_claim b
                        where b.tenant_id = conflicts.tenant_id and b.id = conflicts.claim_b)
           and exists (select 1 from knowledge.entities e
                        where e.tenant_id = conflicts.tenant_id and e.id = conflicts.subject_id)"""

RECORD = """
create or replace function knowledge.record_conflicts(p_claim uuid default null) returns integer
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_count integer;
begin
    with found as (select * from knowledge.find_conflicts(p_claim)),
    ins as (
        insert into knowledge.conflicts (kind, claim_a, claim_b, subject_id, predicate, perspective_key, scopes)
        select f.kind, f.claim_a, f.claim_b, a.subject_id,
               case when a.predicate = b.predicate then a.predicate
                    else least(a.predicate, b.predicate) || ' / ' || greatest(a.predicate, b.predicate) end,
               a.perspective_key,
               (select array_agg(distinct s order by s) from unnest(a.scopes || b.scopes) s)
          from found f
          join knowledge.fact_claim a on a.tenant_id = (select auth.tenant_id()) and a.id = f.claim_a
          join knowledge.fact_claim b on b.tenant_id = (select auth.tenant_id()) and b.id = f.claim_b{subject}
        on conflict (tenant_id, claim_a, claim_b) do nothing
        returning 1
    )
    select count(*) into v_count from ins;
    return v_count;
end
$$;
"""
SUBJECT = """
          -- Under the caller's policies: a conflict whose subject it cannot read is not its to
          -- record (nor to read); the service's sweep records it for those who may.
          join knowledge.entities e on e.tenant_id = a.tenant_id and e.id = a.subject_id"""


def upgrade() -> None:
    op.execute(f"alter policy conflicts__select_app on knowledge.conflicts using ({READ}{PARTIES})")
    op.execute(RECORD.format(subject=SUBJECT))
    op.execute("""
comment on policy conflicts__select_app on knowledge.conflicts is
    'Readable with read on one of its scopes and read access to both claims and the subject.';
""")


def downgrade() -> None:
    op.execute(RECORD.format(subject=""))
    op.execute(f"alter policy conflicts__select_app on knowledge.conflicts using ({READ})")
    op.execute("comment on policy conflicts__select_app on knowledge.conflicts is null")
