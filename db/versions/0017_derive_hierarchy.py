"""Derived memory, second pass: community levels, profiles per perspective and user, value per item.

Why: three gaps in what the derive jobs could store.

* **Community hierarchy.** Communities had a ``level`` but nothing linked a level
  to the one above, so recall could not tell a fine cluster from the overview
  that contains it. ``memory.communities.parent_id`` names the community one
  Louvain pass up that contains it (same tenant, same scope set: the job builds
  each scope set's hierarchy on its own). ``input_digest`` (SHA-256 of what a
  summary was made from: the member claims at level 0, the children's summaries
  and the claims between them above) lets a rerun skip re-summarising a
  community whose input did not change, at every level.
* **Profiles per perspective and per user.** A profile drew on world facts only;
  opinions and preferences live in their creator's perspective partition
  (``user:<author>``), so two people's opinions of the same person must never be
  summarised together. ``perspective_key`` (``world`` or ``user:<author>``) makes
  the partition part of the profile's identity; a user's own profile
  (``subject_user_id``) is always in that user's partition, which a BEFORE
  trigger sets (the application cannot record a user profile in another
  partition). ``input_digest`` again says what the summary was made from, so an
  unchanged profile is neither re-summarised (one endpoint call each with an
  abstractive summarizer) nor rewritten. Two partial unique indexes make one
  profile per subject, partition and scope set, so two concurrent runs cannot
  both insert one (duplicates left by earlier concurrent runs are removed first,
  keeping the newest: profiles are derived and the next run rebuilds them).
* **Value per item and day.** ``memory.usage_daily`` counts operations per
  channel; nothing said which *items* were used. ``memory.value_daily`` keeps,
  per tenant, day and item (``item_table``, ``item_id`` from the ledger), how
  many ledger rows named it (``uses``), how many of those were ``mark_used``
  feedback (``marks``) and by how many users. It is written only by
  ``memory.refresh_value(day)`` (SECURITY DEFINER like ``refresh_usage``: it
  counts every user's ledger rows and writes only rows whose counts changed). A
  row is readable only when its item is: ``memory.item_visible(table, id)``
  (SECURITY INVOKER) looks the item up under the caller's own RLS, so the value
  of a document, claim or summary never reveals that a hidden one exists or was
  used; an item table it does not know is visible to nobody.

Columns are added to two chained tables (communities, profiles), so their
existing rows are re-baselined afterwards, as 0010 does.

Revision ID: 0017_derive_hierarchy
Revises: 0016_row_versions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017_derive_hierarchy"
down_revision = "0016_row_versions"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
TS = sa.DateTime(timezone=True)
# Tables whose rows change image here (new columns): re-baselined after the change.
CHANGED = ("memory.communities", "memory.profiles")
# The item tables the ledger names (recall's items, and documents for excerpts) and their
# schema-qualified names; item_visible looks each up under the caller's RLS.
ITEM_TABLES = ("sources.documents", "sources.chunks", "knowledge.fact_claim", "memory.communities",
               "memory.raptor_nodes", "memory.working_memory", "memory.profiles", "memory.episodes",
               "memory.observations", "memory.decisions")

_VISIBLE_CASES = "\n".join(
    f"        when '{t}' then exists (select 1 from {t} x where x.tenant_id = auth.tenant_id() and x.id = p_id)"
    for t in ITEM_TABLES)

SQL = rf"""
grant insert (parent_id, input_digest), update (parent_id, input_digest) on memory.communities to engram_app;
grant insert (perspective_key, input_digest), update (input_digest, updated_at) on memory.profiles to engram_app;
comment on column memory.communities.parent_id is
    'The community one Louvain pass up that contains this one (null at the top of its hierarchy).';
comment on column memory.communities.input_digest is
    'SHA-256 of what the summary was made from (member claims; above level 0 also the children''s '
    'summaries); an unchanged digest is not re-summarised.';
comment on column memory.profiles.perspective_key is
    'world (world facts), or user:<author> (that person''s opinions, preferences and experiences); '
    'partitions are never summarised together.';
comment on column memory.profiles.input_digest is
    'SHA-256 of the claims the summary was made from; an unchanged digest is not re-summarised.';

create function memory.tg_profiles__perspective() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if new.subject_user_id is not null then
        new.perspective_key := 'user:' || new.subject_user_id;
    end if;
    return new;
end
$$;
comment on function memory.tg_profiles__perspective() is
    'A user''s own profile lives in that user''s perspective partition, whatever the writer said.';
create trigger tg_profiles__perspective before insert on memory.profiles
    for each row execute function memory.tg_profiles__perspective();

create function memory.item_visible(p_table text, p_id uuid) returns boolean
    language sql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select coalesce(case p_table
{_VISIBLE_CASES}
        else false end, false)
$$;
comment on function memory.item_visible(text, uuid) is
    'Whether the caller can read item p_id of p_table (under the caller''s own RLS); false for '
    'tables it does not know.';
grant execute on function memory.item_visible(text, uuid) to engram_app;

-- SECURITY DEFINER like memory.refresh_usage: it counts every user's ledger rows of
-- the bound tenant, which no single engram_app identity may read, and returns a count.
create function memory.refresh_value(p_day date) returns integer
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid := auth.tenant_id();
    v_rows integer;
begin
    if v_tenant is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    if p_day is null then
        raise exception 'a day is needed' using errcode = '22023';
    end if;
    insert into memory.value_daily as v (tenant_id, day, item_table, item_id, uses, marks, users)
    select v_tenant, p_day, l.item_table, l.item_id, count(*), count(*) filter (where l.operation = 'mark_used'),
           count(distinct l.user_id)
      from memory.usage_ledger l
     where l.tenant_id = v_tenant and l.occurred_at >= p_day and l.occurred_at < p_day + 1
       and l.item_id is not null
     group by l.item_table, l.item_id
    on conflict (tenant_id, day, item_table, item_id)
        do update set uses = excluded.uses, marks = excluded.marks, users = excluded.users, updated_at = now()
        where (v.uses, v.marks, v.users) is distinct from (excluded.uses, excluded.marks, excluded.users);
    get diagnostics v_rows = row_count;
    return v_rows;
end
$$;
comment on function memory.refresh_value(date) is
    'Recomputes the bound tenant''s value_daily rows of one day from the ledger, writing only rows '
    'whose counts changed; returns how many. SECURITY DEFINER: reads every user''s ledger rows.';
revoke all on function memory.refresh_value(date) from public;
grant execute on function memory.refresh_value(date) to engram_app;

alter table memory.value_daily enable row level security;
alter table memory.value_daily force row level security;
create policy value_daily__select_app on memory.value_daily for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and memory.item_visible(item_table, item_id));
create policy value_daily__select_owner on memory.value_daily for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
create policy value_daily__insert_owner on memory.value_daily for insert to engram_owner
    with check (tenant_id = (select auth.tenant_id()));
create policy value_daily__update_owner on memory.value_daily for update to engram_owner
    using (tenant_id = (select auth.tenant_id())) with check (tenant_id = (select auth.tenant_id()));
grant select on memory.value_daily to engram_app;
comment on table memory.value_daily is
    'Per day and item: ledger rows naming it (uses), mark_used feedback (marks), distinct users; '
    'readable only alongside the item.';
comment on policy value_daily__select_app on memory.value_daily is
    'A value row is visible exactly when its item is visible to the caller (memory.item_visible).';
"""

DOWNGRADE_SQL = """
drop function memory.refresh_value(date);
drop function memory.item_visible(text, uuid);
drop trigger tg_profiles__perspective on memory.profiles;
drop function memory.tg_profiles__perspective();
revoke insert (parent_id, input_digest), update (parent_id, input_digest) on memory.communities from engram_app;
revoke insert (perspective_key, input_digest), update (input_digest, updated_at) on memory.profiles from engram_app;
"""

DEDUPE_PROFILES = """
delete from memory.profiles p using memory.profiles q
 where q.tenant_id = p.tenant_id and q.scopes = p.scopes and q.id > p.id
   and q.subject_entity_id is not distinct from p.subject_entity_id
   and q.subject_user_id is not distinct from p.subject_user_id
   and (p.subject_user_id is not null
        or q.perspective_key = p.perspective_key)
"""


def _as_superuser(sql: str, *params: str) -> None:
    # Only the migrating superuser sees every row (FORCE RLS hides them from the owner).
    op.execute("reset role")
    if params:
        for p in params:
            op.execute(sa.text(sql).bindparams(t=p))
    else:
        op.execute(sql)
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.add_column("communities", sa.Column("parent_id", UUID, nullable=True), schema="memory")
    op.add_column("communities", sa.Column("input_digest", postgresql.BYTEA(), nullable=True), schema="memory")
    op.create_foreign_key("fk_communities_tenant_id_parent_id_communities", "communities", "communities",
                          ["tenant_id", "parent_id"], ["tenant_id", "id"],
                          source_schema="memory", referent_schema="memory")
    op.create_check_constraint("ck_communities_not_own_parent", "communities",
                               "parent_id is null or parent_id <> id", schema="memory")
    op.create_check_constraint("ck_communities_input_digest_length", "communities",
                               "input_digest is null or length(input_digest) = 32", schema="memory")
    op.create_index("ix_communities_tenant_id_parent_id", "communities", ["tenant_id", "parent_id"],
                    schema="memory")

    op.add_column("profiles", sa.Column("perspective_key", sa.Text(), server_default=sa.text("'world'"),
                                        nullable=False), schema="memory")
    op.add_column("profiles", sa.Column("input_digest", postgresql.BYTEA(), nullable=True), schema="memory")
    op.create_check_constraint("ck_profiles_perspective_key_format", "profiles",
                               "perspective_key = 'world' or perspective_key ~ '^user:.+'", schema="memory")
    op.create_check_constraint("ck_profiles_input_digest_length", "profiles",
                               "input_digest is null or length(input_digest) = 32", schema="memory")
    # A user profile written before this revision moves into its user's partition.
    _as_superuser("update memory.profiles set perspective_key = 'user:' || subject_user_id "
                  "where subject_user_id is not null")
    _as_superuser(DEDUPE_PROFILES)
    op.create_index("uq_profiles_tenant_id_subject_entity_id_perspective_key_scopes", "profiles",
                    ["tenant_id", "subject_entity_id", "perspective_key", "scopes"], schema="memory",
                    unique=True, postgresql_where=sa.text("subject_entity_id is not null"))
    op.create_index("uq_profiles_tenant_id_subject_user_id_scopes", "profiles",
                    ["tenant_id", "subject_user_id", "scopes"], schema="memory",
                    unique=True, postgresql_where=sa.text("subject_user_id is not null"))

    op.create_table(
        "value_daily",
        sa.Column("tenant_id", UUID, nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("item_table", sa.Text(), nullable=False),
        sa.Column("item_id", UUID, nullable=False),
        sa.Column("uses", sa.BigInteger(), nullable=False),
        sa.Column("marks", sa.BigInteger(), nullable=False),
        sa.Column("users", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "day", "item_table", "item_id", name="pk_value_daily"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_value_daily_tenant_id_tenants",
                                ondelete="CASCADE"),
        sa.CheckConstraint("uses >= 0 and marks >= 0 and users >= 0 and marks <= uses",
                           name="ck_value_daily_counts"),
        schema="memory",
    )
    op.create_index("ix_value_daily_tenant_id_item_table_item_id", "value_daily",
                    ["tenant_id", "item_table", "item_id", "day"], schema="memory")
    op.execute(SQL)
    op.execute(sa.text("select provenance.attach_chain(cast(:t as regclass))").bindparams(t="memory.value_daily"))
    _as_superuser("select provenance.baseline(cast(:t as regclass))", *CHANGED)


def downgrade() -> None:
    op.drop_table("value_daily", schema="memory")
    op.execute(DOWNGRADE_SQL)
    op.drop_index("uq_profiles_tenant_id_subject_user_id_scopes", table_name="profiles", schema="memory")
    op.drop_index("uq_profiles_tenant_id_subject_entity_id_perspective_key_scopes", table_name="profiles",
                  schema="memory")
    op.drop_constraint("ck_profiles_input_digest_length", "profiles", schema="memory")
    op.drop_constraint("ck_profiles_perspective_key_format", "profiles", schema="memory")
    op.drop_column("profiles", "input_digest", schema="memory")
    op.drop_column("profiles", "perspective_key", schema="memory")
    op.drop_index("ix_communities_tenant_id_parent_id", table_name="communities", schema="memory")
    op.drop_constraint("ck_communities_input_digest_length", "communities", schema="memory")
    op.drop_constraint("ck_communities_not_own_parent", "communities", schema="memory")
    op.drop_constraint("fk_communities_tenant_id_parent_id_communities", "communities", schema="memory")
    op.drop_column("communities", "input_digest", schema="memory")
    op.drop_column("communities", "parent_id", schema="memory")
    _as_superuser("select provenance.baseline(cast(:t as regclass))", *CHANGED)
