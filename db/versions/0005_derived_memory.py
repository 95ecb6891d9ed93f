"""Derived memory: working memory, profiles, episodes, observations, decisions, communities, RAPTOR, usage.

Why: recall reads more than documents and facts. Background builders (a later
issue) distil the corpus and the dialogue into summaries; this revision gives
them storage with the same guarantees as everything else: ``tenant_id`` first
in every primary key, forced RLS, scopes validated by ``auth.check_scopes`` in
a BEFORE trigger, and the embedding-queue columns (``embed_state`` and friends)
with an HNSW cosine index wherever a recall lane searches by vector.

* ``working_memory``: recent session items, private to their user (read needs
  the scope *and* the same user) and gone from recall after ``expires_at``.
* ``profiles``: a summary about an entity or a user, ranked by its embedding.
* ``episodes``: bounded dialogue summaries with their time span.
* ``observations``: consolidated beliefs with a confidence; only those at or
  above 0.65 are recallable (``memory.recallable_observations``).
* ``decisions`` and ``decision_links`` (caused, influenced, precedent_for).
* ``communities`` (graph clusters) and ``raptor_nodes`` (recursive summaries;
  roots are the overviews).
* ``usage_ledger``: one row per operation by channel, readable by its user;
  ``usage_daily`` is its per-day aggregate, built by ``memory.aggregate_usage``
  (SECURITY DEFINER: it counts the whole tenant's ledger, which no single user
  may read).

Revision ID: 0005_derived_memory
Revises: 0004_knowledge
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0005_derived_memory"
down_revision = "0004_knowledge"
branch_labels = None
depends_on = None

EMBEDDING_DIMENSION = 384
RECALLABLE_CONFIDENCE = 0.65

UUID = postgresql.UUID(as_uuid=True)
UUIDS = postgresql.ARRAY(postgresql.UUID(as_uuid=True))
TS = sa.DateTime(timezone=True)

# Tables with a scope set; each gets the standard policies and the scope trigger.
SCOPED = ("working_memory", "profiles", "episodes", "observations", "decisions", "decision_links",
          "communities", "raptor_nodes")
# Tables a recall lane searches by vector: HNSW cosine index and embed queue index.
EMBEDDED = ("working_memory", "profiles", "episodes", "observations", "communities", "raptor_nodes")


def _base(table: str) -> list[sa.SchemaItem]:
    return [
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", UUID, server_default=sa.text("uuidv7()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=f"pk_{table}"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=f"fk_{table}_tenant_id_tenants",
                                ondelete="CASCADE"),
    ]


def _scopes(table: str) -> list[sa.SchemaItem]:
    return [
        sa.Column("scopes", UUIDS, nullable=False),
        sa.CheckConstraint("cardinality(scopes) >= 1", name=f"ck_{table}_scopes_nonempty"),
    ]


def _embedding(table: str) -> list[sa.SchemaItem]:
    state = postgresql.ENUM(name="embed_state", schema="sources", create_type=False)
    return [
        sa.Column("embedding", Vector(EMBEDDING_DIMENSION), nullable=True),
        sa.Column("embed_state", state, server_default=sa.text("'pending'"), nullable=False),
        sa.Column("embed_attempts", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("embed_error", sa.Text(), nullable=True),
        sa.Column("embed_model", sa.Text(), nullable=True),
        sa.Column("embedded_at", TS, nullable=True),
        sa.CheckConstraint("embed_attempts >= 0", name=f"ck_{table}_embed_attempts_nonnegative"),
        sa.CheckConstraint("(embed_state = 'ready') = (embedding is not null)",
                           name=f"ck_{table}_embedding_matches_state"),
    ]


def _created() -> sa.Column[object]:
    return sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False)


def _entity_fk(table: str, column: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["tenant_id", column], ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                                   name=f"fk_{table}_tenant_id_{column}_entities")


def _scoped_sql(table: str, *, extra: str = "") -> str:
    read = f"tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()){extra}"
    write = f"tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()){extra}"
    return f"""
alter table memory.{table} enable row level security;
alter table memory.{table} force row level security;
create policy {table}__select_app on memory.{table} for select to engram_app using ({read});
create policy {table}__insert_app on memory.{table} for insert to engram_app with check ({write});
create policy {table}__update_app on memory.{table} for update to engram_app using ({write}) with check ({write});
create policy {table}__delete_app on memory.{table} for delete to engram_app using ({write});
create trigger tg_{table}__scopes before insert or update on memory.{table}
    for each row execute function memory.tg_scoped__check();
grant select, delete on memory.{table} to engram_app;
"""


FUNCTIONS_SQL = r"""
create function memory.tg_scoped__check() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'UPDATE' and new.tenant_id is distinct from old.tenant_id then
        raise exception 'a row cannot move to another tenant' using errcode = '42501';
    end if;
    new.scopes := auth.check_scopes(new.tenant_id, new.scopes);
    return new;
end
$$;
comment on function memory.tg_scoped__check() is
    'Validates and sorts the scope set of a derived-memory row (shared by every scoped table).';

create function memory.tg_working_memory__owner() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if auth.user_id() is not null then
        new.user_id := auth.user_id();
    end if;
    if new.user_id is null then
        raise exception 'a working-memory item needs a user (no user is bound)' using errcode = '28000';
    end if;
    return new;
end
$$;
comment on function memory.tg_working_memory__owner() is
    'A working-memory item belongs to the bound user, whatever the caller wrote.';

create function memory.tg_embedded__requeue() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    -- Changed text means the stored vector describes something else now.
    if to_jsonb(new) -> tg_argv[0] is distinct from to_jsonb(old) -> tg_argv[0] then
        new.embedding := null;
        new.embed_state := 'pending';
        new.embed_attempts := 0;
        new.embed_error := null;
    end if;
    return new;
end
$$;
comment on function memory.tg_embedded__requeue() is
    'Puts a row back on the embedding queue when its embedded text column (argument) changes.';

-- SECURITY DEFINER: the aggregate counts every user's ledger rows of the bound
-- tenant, which no single engram_app identity may read; it returns counts only.
create function memory.aggregate_usage(p_day date) returns integer
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
    insert into memory.usage_daily (tenant_id, day, operation, channel, operations, users)
    select v_tenant, p_day, l.operation, l.channel, count(*), count(distinct l.user_id)
      from memory.usage_ledger l
     where l.tenant_id = v_tenant and l.occurred_at >= p_day and l.occurred_at < p_day + 1
     group by l.operation, l.channel
    on conflict (tenant_id, day, operation, channel)
        do update set operations = excluded.operations, users = excluded.users, updated_at = now();
    get diagnostics v_rows = row_count;
    return v_rows;
end
$$;
comment on function memory.aggregate_usage(date) is
    'Recomputes the bound tenant''s usage_daily rows for one day from the ledger (idempotent). '
    'SECURITY DEFINER: reads every user''s ledger rows, returns only counts.';
revoke all on function memory.aggregate_usage(date) from public;
"""

POLICIES_SQL = """
alter table memory.usage_ledger enable row level security;
alter table memory.usage_ledger force row level security;
alter table memory.usage_daily enable row level security;
alter table memory.usage_daily force row level security;
create policy usage_ledger__select_app on memory.usage_ledger for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and user_id = (select auth.user_id()));
create policy usage_ledger__insert_app on memory.usage_ledger for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and user_id = (select auth.user_id()));
create policy usage_ledger__select_owner on memory.usage_ledger for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
create policy usage_daily__select_app on memory.usage_daily for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy usage_daily__select_owner on memory.usage_daily for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
create policy usage_daily__insert_owner on memory.usage_daily for insert to engram_owner
    with check (tenant_id = (select auth.tenant_id()));
create policy usage_daily__update_owner on memory.usage_daily for update to engram_owner
    using (tenant_id = (select auth.tenant_id())) with check (tenant_id = (select auth.tenant_id()));

grant usage on schema memory to engram_app;
grant usage on type memory.causal_link to engram_app;
grant insert (session_id, text, scopes, expires_at) on memory.working_memory to engram_app;
grant update (text, scopes, expires_at) on memory.working_memory to engram_app;
grant insert (subject_entity_id, subject_user_id, summary, scopes) on memory.profiles to engram_app;
grant update (summary, scopes) on memory.profiles to engram_app;
-- user_id is left to its default, the bound user: nobody records an episode as someone else.
grant insert (session_id, summary, started_at, ended_at, turn_count, scopes) on memory.episodes to engram_app;
grant update (summary, ended_at, turn_count, scopes) on memory.episodes to engram_app;
grant insert (text, confidence, subject_entity_id, perspective_key, source_claim_ids, scopes)
    on memory.observations to engram_app;
grant update (text, confidence, source_claim_ids, scopes) on memory.observations to engram_app;
grant insert (category, scenario, reasoning, outcome, confidence, decided_at, decided_by, scopes)
    on memory.decisions to engram_app;
grant update (outcome, confidence, scopes) on memory.decisions to engram_app;
grant insert (from_decision_id, to_decision_id, kind, scopes) on memory.decision_links to engram_app;
grant insert (level, member_entity_ids, summary, scopes) on memory.communities to engram_app;
grant update (member_entity_ids, summary, scopes, built_at) on memory.communities to engram_app;
grant insert (level, parent_id, children, summary, scopes) on memory.raptor_nodes to engram_app;
grant update (parent_id, children, summary, scopes) on memory.raptor_nodes to engram_app;
grant select on memory.usage_ledger, memory.usage_daily to engram_app;
grant insert (operation, channel, item_table, item_id) on memory.usage_ledger to engram_app;
grant execute on function memory.aggregate_usage(date) to engram_app;

create view memory.recallable_observations with (security_barrier = true, security_invoker = true) as
    select o.* from memory.observations o where o.confidence >= 0.65;
comment on view memory.recallable_observations is
    'Observations confident enough to be recalled (>= 0.65); reads through the caller''s RLS.';
create view memory.current_working_memory with (security_barrier = true, security_invoker = true) as
    select w.* from memory.working_memory w where w.expires_at > now();
comment on view memory.current_working_memory is 'Working-memory items that have not expired.';
grant select on memory.recallable_observations, memory.current_working_memory to engram_app;

comment on table memory.working_memory is 'Recent session items of one user; expire at expires_at.';
comment on table memory.profiles is 'A summary about an entity or a user, ranked by its embedding.';
comment on table memory.episodes is 'Bounded dialogue summaries with their time span.';
comment on table memory.observations is 'Consolidated observations with confidence; recallable from 0.65.';
comment on table memory.decisions is 'Decisions: category, scenario, reasoning, outcome, confidence.';
comment on table memory.decision_links is 'Causal links between decisions: caused, influenced, precedent_for.';
comment on table memory.communities is 'Graph clusters of entities with a summary, by level.';
comment on table memory.raptor_nodes is 'RAPTOR tree: recursive cluster summaries; roots are overviews.';
comment on table memory.usage_ledger is 'One row per operation by channel; readable by the user it records.';
comment on table memory.usage_daily is 'Per-day counts of the ledger by operation and channel.';
"""


def upgrade() -> None:
    op.execute("create schema memory authorization engram_owner")
    op.execute("comment on schema memory is 'Derived memory: summaries, episodes, decisions, usage.'")
    postgresql.ENUM("caused", "influenced", "precedent_for", name="causal_link", schema="memory").create(op.get_bind())

    op.create_table(
        "working_memory", *_base("working_memory"),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        *_scopes("working_memory"), *_embedding("working_memory"), _created(),
        sa.Column("expires_at", TS, server_default=sa.text("now() + interval '1 day'"), nullable=False),
        sa.CheckConstraint("length(session_id) between 1 and 200", name="ck_working_memory_session_id_length"),
        sa.CheckConstraint("length(text) between 1 and 20000", name="ck_working_memory_text_length"),
        sa.CheckConstraint("expires_at > created_at", name="ck_working_memory_expires_after_created"),
        schema="memory",
    )
    op.create_index("ix_working_memory_tenant_id_user_id_session_id", "working_memory",
                    ["tenant_id", "user_id", "session_id"], schema="memory")

    op.create_table(
        "profiles", *_base("profiles"),
        sa.Column("subject_entity_id", UUID, nullable=True),
        sa.Column("subject_user_id", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        *_scopes("profiles"), *_embedding("profiles"), _created(),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        _entity_fk("profiles", "subject_entity_id"),
        sa.CheckConstraint("(subject_entity_id is null) <> (subject_user_id is null)", name="ck_profiles_one_subject"),
        sa.CheckConstraint("length(summary) between 1 and 20000", name="ck_profiles_summary_length"),
        schema="memory",
    )
    op.create_index("ix_profiles_tenant_id_subject_entity_id", "profiles", ["tenant_id", "subject_entity_id"],
                    schema="memory")
    op.create_index("ix_profiles_tenant_id_subject_user_id", "profiles", ["tenant_id", "subject_user_id"],
                    schema="memory")

    op.create_table(
        "episodes", *_base("episodes"),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=False),
        sa.Column("turn_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        *_scopes("episodes"), *_embedding("episodes"), _created(),
        sa.CheckConstraint("ended_at >= started_at", name="ck_episodes_span_ordered"),
        sa.CheckConstraint("turn_count >= 0", name="ck_episodes_turn_count_nonnegative"),
        sa.CheckConstraint("length(summary) between 1 and 20000", name="ck_episodes_summary_length"),
        schema="memory",
    )
    op.create_index("ix_episodes_tenant_id_started_at", "episodes", ["tenant_id", "started_at"], schema="memory")

    op.create_table(
        "observations", *_base("observations"),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("confidence", postgresql.DOUBLE_PRECISION(), nullable=False),
        sa.Column("subject_entity_id", UUID, nullable=True),
        sa.Column("perspective_key", sa.Text(), server_default=sa.text("'world'"), nullable=False),
        sa.Column("source_claim_ids", UUIDS, server_default=sa.text("'{}'"), nullable=False),
        *_scopes("observations"), *_embedding("observations"), _created(),
        _entity_fk("observations", "subject_entity_id"),
        sa.CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_observations_confidence_range"),
        sa.CheckConstraint("length(text) between 1 and 20000", name="ck_observations_text_length"),
        schema="memory",
    )

    op.create_table(
        "decisions", *_base("decisions"),
        sa.Column("category", sa.Text(), nullable=False),
        sa.Column("scenario", sa.Text(), nullable=False),
        sa.Column("reasoning", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("confidence", postgresql.DOUBLE_PRECISION(), nullable=False),
        sa.Column("decided_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("decided_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        *_scopes("decisions"), _created(),
        sa.CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_decisions_confidence_range"),
        sa.CheckConstraint("length(category) between 1 and 100", name="ck_decisions_category_length"),
        sa.CheckConstraint("length(scenario) between 1 and 20000", name="ck_decisions_scenario_length"),
        sa.CheckConstraint("length(reasoning) between 1 and 20000", name="ck_decisions_reasoning_length"),
        schema="memory",
    )
    op.create_index("ix_decisions_tenant_id_decided_at", "decisions", ["tenant_id", "decided_at"], schema="memory")

    op.create_table(
        "decision_links", *_base("decision_links"),
        sa.Column("from_decision_id", UUID, nullable=False),
        sa.Column("to_decision_id", UUID, nullable=False),
        sa.Column("kind", postgresql.ENUM(name="causal_link", schema="memory", create_type=False), nullable=False),
        *_scopes("decision_links"), _created(),
        sa.UniqueConstraint("tenant_id", "from_decision_id", "to_decision_id", "kind",
                            name="uq_decision_links_from_to_kind"),
        sa.ForeignKeyConstraint(["tenant_id", "from_decision_id"], ["memory.decisions.tenant_id", "memory.decisions.id"],
                                name="fk_decision_links_tenant_id_from_decision_id_decisions", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "to_decision_id"], ["memory.decisions.tenant_id", "memory.decisions.id"],
                                name="fk_decision_links_tenant_id_to_decision_id_decisions", ondelete="CASCADE"),
        sa.CheckConstraint("from_decision_id <> to_decision_id", name="ck_decision_links_not_self"),
        schema="memory",
    )
    op.create_index("ix_decision_links_tenant_id_to_decision_id", "decision_links",
                    ["tenant_id", "to_decision_id"], schema="memory")

    op.create_table(
        "communities", *_base("communities"),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("member_entity_ids", UUIDS, nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        *_scopes("communities"), *_embedding("communities"), _created(),
        sa.Column("built_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("level >= 0", name="ck_communities_level_nonnegative"),
        sa.CheckConstraint("cardinality(member_entity_ids) >= 1", name="ck_communities_members_nonempty"),
        sa.CheckConstraint("length(summary) between 1 and 20000", name="ck_communities_summary_length"),
        schema="memory",
    )
    op.create_index("ix_communities_member_entity_ids", "communities", ["member_entity_ids"], schema="memory",
                    postgresql_using="gin")

    op.create_table(
        "raptor_nodes", *_base("raptor_nodes"),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("parent_id", UUID, nullable=True),
        sa.Column("children", UUIDS, server_default=sa.text("'{}'"), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        *_scopes("raptor_nodes"), *_embedding("raptor_nodes"), _created(),
        sa.ForeignKeyConstraint(["tenant_id", "parent_id"], ["memory.raptor_nodes.tenant_id", "memory.raptor_nodes.id"],
                                name="fk_raptor_nodes_tenant_id_parent_id_raptor_nodes"),
        sa.CheckConstraint("level >= 0", name="ck_raptor_nodes_level_nonnegative"),
        sa.CheckConstraint("parent_id is null or parent_id <> id", name="ck_raptor_nodes_not_own_parent"),
        sa.CheckConstraint("length(summary) between 1 and 20000", name="ck_raptor_nodes_summary_length"),
        schema="memory",
    )
    op.create_index("ix_raptor_nodes_tenant_id_parent_id", "raptor_nodes", ["tenant_id", "parent_id"], schema="memory")
    op.create_index("ix_raptor_nodes_roots", "raptor_nodes", ["tenant_id", "level"], schema="memory",
                    postgresql_where=sa.text("parent_id is null"))

    op.create_table(
        "usage_ledger", *_base("usage_ledger"),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("item_table", sa.Text(), nullable=True),
        sa.Column("item_id", UUID, nullable=True),
        sa.Column("user_id", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("occurred_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(r"operation ~ '^[a-z][a-z0-9_.]{0,62}$'", name="ck_usage_ledger_operation_format"),
        sa.CheckConstraint("channel in ('graphql', 'mcp', 'python', 'cli', 'worker')",
                           name="ck_usage_ledger_channel_known"),
        sa.CheckConstraint("(item_table is null) = (item_id is null)", name="ck_usage_ledger_item_pair"),
        schema="memory",
    )
    op.create_index("ix_usage_ledger_tenant_id_occurred_at", "usage_ledger", ["tenant_id", "occurred_at"],
                    schema="memory")

    op.create_table(
        "usage_daily", *_base("usage_daily"),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("operations", sa.BigInteger(), nullable=False),
        sa.Column("users", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.UniqueConstraint("tenant_id", "day", "operation", "channel",
                            name="uq_usage_daily_tenant_id_day_operation_channel"),
        sa.CheckConstraint("operations >= 0 and users >= 0", name="ck_usage_daily_counts_nonnegative"),
        schema="memory",
    )

    for table in EMBEDDED:
        op.create_index(f"ix_{table}_embedding_hnsw", table, ["embedding"], schema="memory",
                        postgresql_using="hnsw", postgresql_with={"m": 16, "ef_construction": 64},
                        postgresql_ops={"embedding": "vector_cosine_ops"})
        op.create_index(f"ix_{table}_embed_queue", table, ["created_at"], schema="memory",
                        postgresql_where=sa.text("embed_state = 'pending'"))

    op.execute(FUNCTIONS_SQL)
    for table in SCOPED:
        mine = " and user_id = (select auth.user_id())" if table == "working_memory" else ""
        op.execute(_scoped_sql(table, extra=mine))
    op.execute("""
create trigger tg_working_memory__owner before insert on memory.working_memory
    for each row execute function memory.tg_working_memory__owner();
create trigger tg_working_memory__requeue before update on memory.working_memory
    for each row execute function memory.tg_embedded__requeue('text');
create trigger tg_observations__requeue before update on memory.observations
    for each row execute function memory.tg_embedded__requeue('text');
create trigger tg_profiles__requeue before update on memory.profiles
    for each row execute function memory.tg_embedded__requeue('summary');
create trigger tg_episodes__requeue before update on memory.episodes
    for each row execute function memory.tg_embedded__requeue('summary');
create trigger tg_communities__requeue before update on memory.communities
    for each row execute function memory.tg_embedded__requeue('summary');
create trigger tg_raptor_nodes__requeue before update on memory.raptor_nodes
    for each row execute function memory.tg_embedded__requeue('summary');
""")
    op.execute(POLICIES_SQL)


def downgrade() -> None:
    op.execute("drop schema memory cascade")
