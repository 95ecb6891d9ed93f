"""Recall's probes stay index probes under row level security.

Why: under RLS PostgreSQL evaluates a query's own conditions after the policy's,
unless their functions are LEAKPROOF, and only leakproof conditions may become
index conditions. Measured on a 30k-chunk tenant, three lanes therefore scanned
the whole tenant as ``engram_app`` while the superuser probed an index
(benchmarks/recall_latency.py):

* **title**: ``recall.title_key(title) in (question n-grams)`` is not
  leakproof (the function is inlined into ``regexp_replace``, ``lower`` and
  ``unaccent``), so the expression index of 0008 was never used: 170 ms. The
  key is now a stored generated column, ``documents.title_key``, compared with
  ``=`` on text (leakproof) through ``ix_documents_tenant_id_title_key``, which
  replaces 0008's expression index of the same name.
* **area catalog**: listing the areas read every document of the tenant. With
  ``ix_documents_tenant_id_area`` the statement skips from one area to the next
  (``area > previous``, leakproof) instead.
* **lexical**: ``lexical @@ query`` (``ts_match_vq``) is not leakproof, so the
  GIN index on ``(tenant_id, lexical)`` served only the tenant condition and
  every chunk of the tenant was matched one by one: 480 ms vs 1.4 ms.
  ``ts_match_vq`` returns a boolean and raises no error that depends on the
  tsvector it reads, so nothing about a hidden row can leak through it; this
  revision marks it LEAKPROOF. Only a superuser may; on a server where the
  migrating role is not one, the revision says so (a WARNING) and the lane
  stays correct but scans. ``pg_dump`` does not carry the flag, so a restored
  database needs this revision's ``upgrade`` statement again (docs/database.md).

Three more things the benchmark showed:

* the app role's ``hnsw.ef_search`` goes from 100 to 200: in a tenant holding 30%
  of a 300k-chunk index the dense pool's recall@40 against exact search was 0.76;
* ``plan_cache_mode = force_custom_plan`` for the app role: the recall statement
  is the same text for every tenant, so a cached generic plan made for one
  tenant's size would be reused for a tenant a thousand times larger or smaller;
  every execution is planned for its own parameters (about 12 ms);
* ``recall.compact_all_lexical_stats(min_deltas)`` folds the BM25 statistic
  deltas of every tenant that has more than ``min_deltas`` of them (0008's
  ``compact_lexical_stats`` was never called, and one delta row per written
  document accumulates without bound). SECURITY DEFINER, executable by
  ``engram_worker`` only: the derive scheduler calls it once per tick.

Adding ``title_key`` changes every document's canonical image, so documents are
re-baselined, as 0010 does.

Revision ID: 0014_recall_probes
Revises: 0013_row_version_probe
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_recall_probes"
down_revision = "0013_row_version_probe"
branch_labels = None
depends_on = None

LEAKPROOF_MATCH = """
do $leakproof$
begin
    if (select rolsuper from pg_roles where rolname = current_user) then
        alter function pg_catalog.ts_match_vq(tsvector, tsquery) leakproof;
    else
        raise warning 'engram: % is not a superuser, so ts_match_vq stays not LEAKPROOF: '
                      'the lexical lane scans each tenant''s chunks under RLS instead of probing '
                      'its GIN index; run this as a superuser: alter function '
                      'pg_catalog.ts_match_vq(tsvector, tsquery) leakproof', current_user;
    end if;
end
$leakproof$
"""


ROLE_SETTINGS = ("hnsw.ef_search = 200", "plan_cache_mode = force_custom_plan")
ROLE_SETTINGS_BEFORE = ("hnsw.ef_search = 100",)

COMPACT_SQL = """
-- SECURITY DEFINER as engram_owner (whose policy on lexical_stats is the only one
-- that may delete): the worker role may not read or write the statistics itself.
create function recall.compact_all_lexical_stats(p_min_deltas integer) returns integer
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
    v_done integer := 0;
begin
    for v_tenant in
        select s.tenant_id from recall.lexical_stats s
         group by s.tenant_id having count(*) > greatest(p_min_deltas, 1)
    loop
        perform recall.compact_lexical_stats(v_tenant);
        v_done := v_done + 1;
    end loop;
    return v_done;
end
$$;
comment on function recall.compact_all_lexical_stats(integer) is
    'Maintenance: compacts the BM25 statistic deltas of every tenant with more than p_min_deltas '
    'rows; returns how many tenants. SECURITY DEFINER, for engram_worker (the derive scheduler).';
revoke all on function recall.compact_all_lexical_stats(integer) from public;
grant usage on schema recall to engram_worker;
grant execute on function recall.compact_all_lexical_stats(integer) to engram_worker;
"""


def _role_settings(settings: tuple[str, ...]) -> str:
    parts = []
    for setting in settings:
        name, value = (s.strip() for s in setting.split("=", 1))
        parts.append("execute format('alter role engram_app in database %I "
                     f"set {name} = %L', current_database(), '{value}');")
    return "do $s$ begin " + " ".join(parts) + " end $s$"


def _baseline() -> None:
    op.execute("reset role")
    op.execute("select provenance.baseline('sources.documents'::regclass)")
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.execute("drop index sources.ix_documents_tenant_id_title_key")
    op.add_column("documents", sa.Column("title_key", sa.Text(), sa.Computed("recall.title_key(title)",
                                                                               persisted=True),
                                         nullable=True), schema="sources")
    op.create_index("ix_documents_tenant_id_title_key", "documents", ["tenant_id", "title_key"],
                    schema="sources")
    op.create_index("ix_documents_tenant_id_area", "documents", ["tenant_id", "area"], schema="sources",
                    postgresql_where=sa.text("area is not null"))
    op.execute("comment on column sources.documents.title_key is "
               "'recall.title_key(title), stored: the title lane compares it with = (leakproof under RLS).'")
    op.execute("comment on index sources.ix_documents_tenant_id_title_key is "
               "'The title lane''s probe: complete titles matched against the question''s word n-grams.'")
    op.execute("comment on index sources.ix_documents_tenant_id_area is "
               "'The Area catalog skips from one area to the next.'")
    op.execute(COMPACT_SQL)
    op.execute("reset role")
    op.execute(LEAKPROOF_MATCH)
    op.execute(_role_settings(ROLE_SETTINGS))
    op.execute("set role engram_owner")
    _baseline()


def downgrade() -> None:
    op.execute("drop function recall.compact_all_lexical_stats(integer)")
    op.execute("revoke usage on schema recall from engram_worker")
    op.execute("reset role")
    op.execute("do $s$ begin execute format('alter role engram_app in database %I reset plan_cache_mode', "
               "current_database()); end $s$")
    op.execute(_role_settings(ROLE_SETTINGS_BEFORE))
    op.execute("set role engram_owner")
    # ts_match_vq keeps its flag: other objects of the database may rely on it by now.
    op.drop_index("ix_documents_tenant_id_area", table_name="documents", schema="sources")
    op.drop_index("ix_documents_tenant_id_title_key", table_name="documents", schema="sources")
    op.drop_column("documents", "title_key", schema="sources")
    op.execute("create index ix_documents_tenant_id_title_key on sources.documents "
               "(tenant_id, recall.title_key(title))")
    _baseline()
