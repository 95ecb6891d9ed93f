"""Read policies say ``arrayoverlap(scopes, read_scopes)``, so the planner's row estimates stay sane.

Why: every read policy of 0002-0011 tests ``scopes && (select auth.read_scopes())``.
The right-hand side is an InitPlan, unknown when the plan is made, so the
planner falls back to the ``&&`` operator's default selectivity of 1%: under
RLS every scan of a tenant table is estimated at a hundredth of the tenant's
rows, although a reader usually sees most of them. With those estimates the
recall statement got plans made for tiny inputs (measured with
benchmarks/recall_latency.py on 10k chunks over 20 tenants; the superuser
estimates the whole tenant and plans as expected):

* the dense lane of a 3,000-chunk tenant, estimated at 30 rows, sorted every
  chunk's exact distance instead of walking the HNSW index: 24 ms vs 18 ms;
* the fact lane put the claims' subject entities (estimated at one row) outside
  a nested loop and probed ``knowledge.effective_claims`` once per entity and
  claim: 180 probes instead of 20.

The execution time of the whole statement was 1.43x the superuser's. A boolean
function call without a planner support function is estimated at one third,
so the same test written as ``pg_catalog.arrayoverlap(scopes, ...)`` (the very
function behind ``&&``: same result, same cost per row) gives estimates within
a small factor of the truth, and the ratio drops to about 1.1x. Nothing about who
may read what changes: each policy keeps its name, command, roles and every
other condition; only the spelling of the overlap test differs, which
``sql_checks/06_rls_estimates.sql`` checks for every policy, so tables that later
revisions add follow suit.

Revision ID: 0015_rls_estimates
Revises: 0014_recall_probes
"""

from __future__ import annotations

from alembic import op

revision = "0015_rls_estimates"
down_revision = "0014_recall_probes"
branch_labels = None
depends_on = None

TENANT = "tenant_id = (select auth.tenant_id())"
OVERLAP = {
    "new": "pg_catalog.arrayoverlap(scopes, (select auth.read_scopes()))",
    "old": "scopes && (select auth.read_scopes())",
}
USER = "(select auth.user_id())"

# (table, policy, USING, WITH CHECK): every policy that tests the reader's scopes, as
# 0002-0011 wrote it, with {read} for the overlap test.
POLICIES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("sources.documents", "documents__select_app", f"{TENANT} and {{read}}", None),
    ("sources.chunks", "chunks__select_app", f"{TENANT} and {{read}}", None),
    ("knowledge.entities", "entities__select_app", f"{TENANT} and {{read}}", None),
    ("knowledge.fact_claim", "fact_claim__select_app", f"{TENANT} and {{read}}", None),
    ("knowledge.fact_claim", "fact_claim__select_owner", f"{TENANT} and {{read}}", None),
    ("knowledge.fact_claim", "fact_claim__update_owner", f"{TENANT} and {{read}}", TENANT),
    ("knowledge.conflicts", "conflicts__select_app", f"{TENANT} and {{read}}", None),
    ("knowledge.conflicts", "conflicts__insert_app", None, f"{TENANT} and {{read}}"),
    ("knowledge.quarantine", "quarantine__select_app",
     f"{TENANT} and (author = {USER} or {{read}})", None),
    ("memory.communities", "communities__select_app", f"{TENANT} and {{read}}", None),
    ("memory.decision_links", "decision_links__select_app", f"{TENANT} and {{read}}", None),
    ("memory.decisions", "decisions__select_app", f"{TENANT} and {{read}}", None),
    ("memory.episodes", "episodes__select_app",
     f"{TENANT} and {{read}} and (not private or user_id = {USER} or (select auth.is_service()))",
     None),
    ("memory.extractions", "extractions__select_app", f"{TENANT} and {{read}}", None),
    ("memory.observations", "observations__select_app", f"{TENANT} and {{read}}", None),
    ("memory.profiles", "profiles__select_app", f"{TENANT} and {{read}}", None),
    ("memory.raptor_nodes", "raptor_nodes__select_app", f"{TENANT} and {{read}}", None),
    ("memory.working_memory", "working_memory__select_app",
     f"{TENANT} and {{read}} and user_id = {USER}", None),
    ("recall.lexical_stats", "lexical_stats__select_app", f"{TENANT} and {{read}}", None),
)


def _alter(spelling: str) -> None:
    read = OVERLAP[spelling]
    for table, policy, using, check in POLICIES:
        clauses = []
        if using is not None:
            clauses.append(f"using ({using.format(read=read)})")
        if check is not None:
            clauses.append(f"with check ({check.format(read=read)})")
        op.execute(f"alter policy {policy} on {table} " + " ".join(clauses))


def upgrade() -> None:
    _alter("new")


def downgrade() -> None:
    _alter("old")
