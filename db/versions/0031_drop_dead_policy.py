"""Drop ``decision_links__update_app``: a policy no grant can reach.

Why: the policy-coverage check (``sql_checks/65_policy_coverage.sql``) asks every
RLS policy for a pgTAP allow and a deny case. ``memory.decision_links`` took its
policies from the scoped-table template of ``0005_derived_memory``, which creates
an UPDATE policy for ``engram_app``; but a causal link is written once and deleted,
never changed, and the application has no UPDATE grant on the table. The policy
could never allow anything, so it had no allow case to have: a policy that
documents a permission nobody holds. Dropping it changes no behaviour.

Revision ID: 0031_drop_dead_policy
Revises: 0030_job_runs
"""

from __future__ import annotations

from alembic import op

revision = "0031_drop_dead_policy"
down_revision = "0030_job_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("drop policy decision_links__update_app on memory.decision_links")


def downgrade() -> None:
    op.execute("""
create policy decision_links__update_app on memory.decision_links for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))""")
