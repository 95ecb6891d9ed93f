"""Derive jobs in the background: a service identity, private episodes, decision items, usage refresh.

Why: ``engram worker run`` now runs the derive jobs (extraction, conflicts,
consolidation, episodes, decision hooks, communities, profiles, RAPTOR, usage)
for every tenant on an interval. Four things were missing for that:

* **Which tenants exist.** The worker logs in as ``engram_worker``, which reads
  scope ids only (see 0007), and ``engram_app`` sees a tenant only once one is
  bound. ``auth.service_tenants()`` (SECURITY DEFINER, executable by
  ``engram_worker`` only) returns each tenant's id, organization id and scope
  names, nothing else. Its owner reads ``auth.tenants`` and ``auth.scopes``
  through two owner policies that admit only sessions logged in as a member of
  ``engram_worker``, so no other definer function gains that reach.
* **A service identity.** Jobs must read and write every scope of a tenant. The
  worker binds ``auth.bind_service_identity(org, scope names)`` on an
  ``engram_app`` connection: it calls ``auth.bind_identity`` with the reserved
  user ``service:derive`` (the author and actor of everything a job writes) and
  then marks the transaction as the service's (``engram.service_tenant``).
  ``auth.is_service()`` is true only when that mark names the bound tenant *and*
  the bound user is ``service:derive``: a verified token whose subject happens to
  be ``service:derive`` binds through ``auth.bind_identity`` alone and is an
  ordinary user. The app role still cannot bypass RLS; it gains no table grant.
* **Private episodes.** Working memory is private to its user, but an episode is
  readable by anyone holding one of its scopes, so an episode built from a user's
  working memory would leak it. ``memory.episodes.private`` (default false, so
  recorded episodes keep their meaning) makes an episode readable, updatable and
  deletable only by its ``user_id`` (and the service that builds it); the episode
  policies are recreated with that rule. An episode that lists working-memory
  items (``source_item_ids``) is private **by construction**: a trigger makes it
  private and gives it the items' owner as ``user_id`` (all items must have one
  owner and be readable by the writer), so neither column needs a grant and
  nobody records an episode as someone else. The episode builder, running as the
  service, reads every user's working memory (``working_memory__select_service``);
  the insert policy admits an episode of another user only for the service.
  ``started_at`` becomes updatable so an open episode that gains an
  earlier-stamped item stays true.
* **Decision items carry a category.** ``memory.working_memory.category`` (only on
  ``kind = 'decision'`` items) is what the decision hook files the decision under,
  so ``precedent_for`` links connect decisions of one kind.
* **Usage refresh that writes only changes.** ``memory.aggregate_usage`` (0005)
  rewrites every row of a day on each call, which on a schedule would append
  chain events every tick. ``memory.refresh_usage(day)`` computes the same
  aggregate and writes only rows whose counts changed (SECURITY DEFINER for the
  same reason as ``aggregate_usage``).

Columns are added to two chained tables (episodes, working memory), so their
existing rows are re-baselined afterwards, as 0010 does.

Revision ID: 0011_derive_jobs
Revises: 0010_memory_lanes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_derive_jobs"
down_revision = "0010_memory_lanes"
branch_labels = None
depends_on = None

# Tables whose rows change image here (new columns): re-baselined after the change.
CHANGED = ("memory.episodes", "memory.working_memory")

_READ = "tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes())"
_WRITE = "tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes())"
_MINE = ("(not private or user_id = (select auth.user_id()) or (select auth.is_service()))")

FUNCTIONS_SQL = r"""
create function auth.service_user() returns text
    language sql immutable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$ select 'service:derive'::text $$;
comment on function auth.service_user() is
    'The user the derive jobs act as (author of what they write, actor of their events).';

create function auth.is_service() returns boolean
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select coalesce(auth.user_id() = auth.service_user()
                    and nullif(current_setting('engram.service_tenant', true), '') = auth.tenant_id()::text,
                    false)
$$;
comment on function auth.is_service() is
    'Whether this transaction runs as the derive service: bound by auth.bind_service_identity '
    '(not by a token) to the tenant that is bound now.';

create function auth.bind_service_identity(p_org_id text, p_scopes text[]) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid;
begin
    perform set_config('engram.service_tenant', '', true);
    v_tenant := auth.bind_identity(p_org_id, auth.service_user(), '{}', coalesce(p_scopes, '{}'));
    perform set_config('engram.service_tenant', v_tenant::text, true);
    return v_tenant;
end
$$;
comment on function auth.bind_service_identity(text, text[]) is
    'Binds the derive service (user service:derive, write on p_scopes) to the transaction and '
    'marks it as the service''s. The worker passes every scope of the tenant.';
revoke all on function auth.bind_service_identity(text, text[]) from public;
grant execute on function auth.bind_service_identity(text, text[]) to engram_app;

-- SECURITY DEFINER: the worker role reads no tenant and no scope name, yet the
-- scheduler must know every tenant's organization and scopes to bind the
-- service identity on an engram_app connection. Only ids and names come back.
create function auth.service_tenants()
    returns table (tenant_id uuid, org_id text, scopes text[])
    language sql stable security definer
    set search_path = pg_catalog, pg_temp
as $$
    select t.id, t.org_id,
           coalesce(array_agg(s.name order by s.name) filter (where s.name is not null), '{}')
      from auth.tenants t
      left join auth.scopes s on s.tenant_id = t.id
     group by t.id, t.org_id
     order by t.id
$$;
comment on function auth.service_tenants() is
    'Every tenant''s id, organization id and scope names, for the derive scheduler '
    '(SECURITY DEFINER; executable by engram_worker only).';
revoke all on function auth.service_tenants() from public;
grant execute on function auth.service_tenants() to engram_worker;

create policy tenants__select_owner on auth.tenants for select to engram_owner
    using ((select pg_has_role(session_user, 'engram_worker', 'member')));
create policy scopes__select_owner on auth.scopes for select to engram_owner
    using ((select pg_has_role(session_user, 'engram_worker', 'member')));

-- SECURITY DEFINER like memory.aggregate_usage: it counts every user's ledger
-- rows of the bound tenant and returns only a count.
create function memory.refresh_usage(p_day date) returns integer
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
    insert into memory.usage_daily as d (tenant_id, day, operation, channel, operations, users)
    select v_tenant, p_day, l.operation, l.channel, count(*), count(distinct l.user_id)
      from memory.usage_ledger l
     where l.tenant_id = v_tenant and l.occurred_at >= p_day and l.occurred_at < p_day + 1
     group by l.operation, l.channel
    on conflict (tenant_id, day, operation, channel)
        do update set operations = excluded.operations, users = excluded.users, updated_at = now()
        where (d.operations, d.users) is distinct from (excluded.operations, excluded.users);
    get diagnostics v_rows = row_count;
    return v_rows;
end
$$;
comment on function memory.refresh_usage(date) is
    'Like memory.aggregate_usage, but writes only the usage_daily rows whose counts changed; '
    'returns how many. SECURITY DEFINER: reads every user''s ledger rows, returns a count.';
revoke all on function memory.refresh_usage(date) from public;
grant execute on function memory.refresh_usage(date) to engram_app;

create function memory.tg_episodes__owner() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_added uuid[];
    v_owners text[];
    v_found bigint;
begin
    if tg_op = 'UPDATE' then
        if new.source_item_ids is not distinct from old.source_item_ids then
            return new;
        end if;
        select coalesce(array_agg(i), '{}') into v_added
          from unnest(new.source_item_ids) as i where not i = any(old.source_item_ids);
    else
        v_added := new.source_item_ids;
    end if;
    if cardinality(v_added) = 0 then
        return new;
    end if;
    -- Read under the writer's RLS: a user sees only their own items, the service every user's.
    select array_agg(distinct w.user_id order by w.user_id), count(distinct w.id) into v_owners, v_found
      from memory.working_memory w
     where w.tenant_id = new.tenant_id and w.id = any(v_added);
    if v_found < (select count(distinct i) from unnest(v_added) as i) then
        raise exception 'an episode''s source items must be working-memory items you can read'
            using errcode = '23503';
    end if;
    if cardinality(v_owners) > 1 then
        raise exception 'an episode summarises one user''s working memory, not that of %',
            array_to_string(v_owners, ', ') using errcode = '22023';
    end if;
    if tg_op = 'UPDATE' and old.user_id is distinct from v_owners[1] then
        raise exception 'an episode of % cannot take items of %', old.user_id, v_owners[1]
            using errcode = '42501';
    end if;
    new.user_id := v_owners[1];
    new.private := true;
    return new;
end
$$;
comment on function memory.tg_episodes__owner() is
    'An episode that lists working-memory items belongs to their one owner and is private.';
create trigger tg_episodes__owner before insert or update on memory.episodes
    for each row execute function memory.tg_episodes__owner();
"""

POLICIES_SQL = f"""
create policy working_memory__select_service on memory.working_memory for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and (select auth.is_service()));

drop policy episodes__select_app on memory.episodes;
drop policy episodes__insert_app on memory.episodes;
drop policy episodes__update_app on memory.episodes;
drop policy episodes__delete_app on memory.episodes;
create policy episodes__select_app on memory.episodes for select to engram_app
    using ({_READ} and {_MINE});
create policy episodes__insert_app on memory.episodes for insert to engram_app
    with check ({_WRITE} and (user_id = (select auth.user_id()) or (select auth.is_service())));
create policy episodes__update_app on memory.episodes for update to engram_app
    using ({_WRITE} and {_MINE}) with check ({_WRITE} and {_MINE});
create policy episodes__delete_app on memory.episodes for delete to engram_app
    using ({_WRITE} and {_MINE});

grant update (started_at) on memory.episodes to engram_app;
grant insert (category) on memory.working_memory to engram_app;

comment on column memory.episodes.private is
    'Readable only by user_id (an episode built from that user''s working memory).';
comment on column memory.working_memory.category is
    'For an item marked as a decision: the category the decision hook files it under.';
comment on policy working_memory__select_service on memory.working_memory is
    'The derive service (auth.is_service) reads every user''s items to build private episodes '
    'and decisions.';
"""

DOWNGRADE_SQL = f"""
drop policy working_memory__select_service on memory.working_memory;
drop policy episodes__select_app on memory.episodes;
drop policy episodes__insert_app on memory.episodes;
drop policy episodes__update_app on memory.episodes;
drop policy episodes__delete_app on memory.episodes;
create policy episodes__select_app on memory.episodes for select to engram_app using ({_READ});
create policy episodes__insert_app on memory.episodes for insert to engram_app with check ({_WRITE});
create policy episodes__update_app on memory.episodes for update to engram_app
    using ({_WRITE}) with check ({_WRITE});
create policy episodes__delete_app on memory.episodes for delete to engram_app using ({_WRITE});
revoke update (started_at) on memory.episodes from engram_app;
drop trigger tg_episodes__owner on memory.episodes;
drop function memory.tg_episodes__owner();
revoke insert (category) on memory.working_memory from engram_app;
drop function memory.refresh_usage(date);
drop policy tenants__select_owner on auth.tenants;
drop policy scopes__select_owner on auth.scopes;
drop function auth.service_tenants();
drop function auth.bind_service_identity(text, text[]);
drop function auth.is_service();
drop function auth.service_user();
"""


def _baseline() -> None:
    # Only the migrating superuser sees every row (FORCE RLS hides them from the owner).
    op.execute("reset role")
    for table in CHANGED:
        op.execute(sa.text("select provenance.baseline(cast(:t as regclass))").bindparams(t=table))
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.add_column("episodes", sa.Column("private", sa.Boolean(), server_default=sa.text("false"),
                                        nullable=False), schema="memory")
    op.create_check_constraint("ck_episodes_private_has_user", "episodes",
                               "not private or user_id is not null", schema="memory")
    op.create_index("ix_episodes_tenant_id_user_id_session_id", "episodes",
                    ["tenant_id", "user_id", "session_id"], schema="memory")
    op.add_column("working_memory", sa.Column("category", sa.Text(), nullable=True), schema="memory")
    op.create_check_constraint(
        "ck_working_memory_category_of_decision", "working_memory",
        "category is null or (kind = 'decision' and length(category) between 1 and 100)",
        schema="memory")
    op.execute(FUNCTIONS_SQL)
    op.execute(POLICIES_SQL)
    _baseline()


def downgrade() -> None:
    op.execute(DOWNGRADE_SQL)
    op.drop_constraint("ck_working_memory_category_of_decision", "working_memory", schema="memory")
    op.drop_column("working_memory", "category", schema="memory")
    op.drop_index("ix_episodes_tenant_id_user_id_session_id", table_name="episodes", schema="memory")
    op.drop_constraint("ck_episodes_private_has_user", "episodes", schema="memory")
    op.drop_column("episodes", "private", schema="memory")
    _baseline()
