"""Ranking that learns from use: what each recall served and how it was ranked, and the tenants' models.

Why: the learned ranker (``orchestrator/recall/ranker.py``) needs training data a
tenant owns, and a tenant's model must be an artifact with provenance.

* ``memory.rank_events``: one row per recall or memory_prepare: who asked, by
  which channel, which model ranked it (or why fused order stood), the
  receipt it belongs to, and for every served item and the best pooled items
  that were not served: the item, its document (for excerpts: ``mark_used``
  names documents), its served rank (0: pooled, not served) and its feature
  vector (``feature_count`` values each, flattened). One row, one statement per
  recall; readable by the user it records, like the usage ledger, and chained
  like every memory table (one chain event per recall's insert statement).
* ``memory.rank_models``: a tenant's trained models: the LightGBM text
  artifact, its SHA-256, the model card (features, parameters, figures on the
  held-back slice, the position-bias correction used), training sizes, and
  which one is active (at most one per tenant, a partial unique index). Chained
  (``provenance.attach_chain``): every model written or activated is an event of
  the tenant's hash chain. Only the derive service identity (``auth.is_service()``)
  writes models, because training reads every user's events; every user of the
  tenant reads them (recall loads the active one under the asker's identity).
* ``memory.rank_training_rows(since, window)`` (SECURITY DEFINER, like
  ``memory.aggregate_usage``): the tenant's events since ``since`` with a label
  per item: whether the user who was served it sent ``mark_used`` feedback for
  it within ``window`` afterwards. It returns feature vectors, ranks and labels
  only, never an item id, a text or a user; for the service identity it reads
  the whole tenant, for anyone else only the caller's own events.

Revision ID: 0050_rank_learning
Revises: 0041_lexical_terms (after merging branch cost; first chained from 0019_derivation_batches)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0050_rank_learning"
down_revision = "0041_lexical_terms"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
TS = sa.DateTime(timezone=True)

SQL = r"""
alter table memory.rank_events enable row level security;
alter table memory.rank_events force row level security;
create policy rank_events__select_app on memory.rank_events for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and user_id = (select auth.user_id()));
create policy rank_events__insert_app on memory.rank_events for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and user_id = (select auth.user_id()));
create policy rank_events__select_owner on memory.rank_events for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
grant select on memory.rank_events to engram_app;
grant insert (operation, channel, model, model_id, feature_version, question_hash, receipt_id,
              item_tables, item_ids, document_ids, served_ranks, feature_count, features)
    on memory.rank_events to engram_app;
comment on table memory.rank_events is
    'One row per recall or memory_prepare: served and pooled items, their served ranks and feature '
    'vectors, the model that ranked them; readable by the user it records.';

alter table memory.rank_models enable row level security;
alter table memory.rank_models force row level security;
create policy rank_models__select_app on memory.rank_models for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy rank_models__insert_app on memory.rank_models for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and (select auth.is_service()));
create policy rank_models__update_app on memory.rank_models for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and (select auth.is_service()))
    with check (tenant_id = (select auth.tenant_id()) and (select auth.is_service()));
grant select on memory.rank_models to engram_app;
grant insert (version, artifact, sha256, feature_version, card, events, training_rows, positives,
              position_bias, active, activated_at)
    on memory.rank_models to engram_app;
grant update (active, activated_at) on memory.rank_models to engram_app;
comment on table memory.rank_models is
    'A tenant''s learned ranking models (LightGBM text, SHA-256, card); at most one active; '
    'written by the derive service identity only; chained.';

-- SECURITY DEFINER: the service trains on every user's events and feedback, which no
-- single engram_app identity may read; it returns numbers and labels, never ids or text.
create function memory.rank_training_rows(p_since timestamptz, p_window interval)
    returns table (event_id uuid, occurred_at timestamptz, served_ranks integer[],
                   feature_count integer, features real[], used boolean[])
    language plpgsql stable security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid := auth.tenant_id();
    v_user text := auth.user_id();
    v_all boolean := auth.is_service();
begin
    if v_tenant is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    if p_window is null or p_window <= interval '0' then
        raise exception 'the label window must be positive' using errcode = '22023';
    end if;
    return query
    select e.id, e.occurred_at, e.served_ranks, e.feature_count, e.features,
           array(select exists (
                     select 1 from memory.usage_ledger l
                      where l.tenant_id = e.tenant_id and l.user_id = e.user_id
                        and l.operation = 'mark_used'
                        and l.occurred_at >= e.occurred_at and l.occurred_at < e.occurred_at + p_window
                        and ((l.item_table = 'sources.documents' and l.item_id = x.doc)
                             or (l.item_table = x.tab and l.item_id = x.item)))
                   from unnest(e.item_tables, e.item_ids, e.document_ids) with ordinality as x(tab, item, doc, n)
                  order by x.n)
      from memory.rank_events e
     where e.tenant_id = v_tenant and (v_all or e.user_id = v_user)
       and e.occurred_at >= coalesce(p_since, '-infinity'::timestamptz)
     order by e.occurred_at, e.id;
end
$$;
comment on function memory.rank_training_rows(timestamptz, interval) is
    'The bound tenant''s rank events since p_since, each item labelled used when its user sent '
    'mark_used for it (its document, for excerpts) within p_window. The service identity reads '
    'the whole tenant, anyone else their own events. SECURITY DEFINER; returns no ids or text.';
revoke all on function memory.rank_training_rows(timestamptz, interval) from public;
grant execute on function memory.rank_training_rows(timestamptz, interval) to engram_app;
"""


def upgrade() -> None:
    channels = "'graphql', 'mcp', 'python', 'cli', 'worker', 'rest'"
    # The REST prepare endpoint is a channel of its own (usage rows say where a recall came from).
    op.drop_constraint("ck_usage_ledger_channel_known", "usage_ledger", schema="memory")
    op.create_check_constraint("ck_usage_ledger_channel_known", "usage_ledger",
                               f"channel in ({channels})", schema="memory")
    op.create_table(
        "rank_models",
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", UUID, server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("artifact", sa.Text(), nullable=False),
        sa.Column("sha256", postgresql.BYTEA(), nullable=False),
        sa.Column("feature_version", sa.Text(), nullable=False),
        sa.Column("card", postgresql.JSONB(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("training_rows", sa.Integer(), nullable=False),
        sa.Column("positives", sa.Integer(), nullable=False),
        sa.Column("position_bias", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("activated_at", TS, nullable=True),
        sa.Column("trained_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("trained_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_rank_models"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_rank_models_tenant_id_tenants",
                                ondelete="CASCADE"),
        sa.UniqueConstraint("tenant_id", "version", name="uq_rank_models_tenant_id_version"),
        sa.CheckConstraint("version >= 1", name="ck_rank_models_version_positive"),
        sa.CheckConstraint("length(sha256) = 32", name="ck_rank_models_sha256_length"),
        sa.CheckConstraint("length(artifact) between 1 and 10000000", name="ck_rank_models_artifact_length"),
        sa.CheckConstraint("events >= 0 and training_rows >= 0 and positives >= 0",
                           name="ck_rank_models_sizes_nonnegative"),
        sa.CheckConstraint("jsonb_typeof(card) = 'object'", name="ck_rank_models_card_object"),
        sa.CheckConstraint("active = (activated_at is not null)", name="ck_rank_models_active_since"),
        schema="memory",
    )
    op.create_index("uq_rank_models_tenant_id_active", "rank_models", ["tenant_id"], schema="memory",
                    unique=True, postgresql_where=sa.text("active"))

    op.create_table(
        "rank_events",
        sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False),
        sa.Column("id", UUID, server_default=sa.text("uuidv7()"), nullable=False),
        sa.Column("user_id", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("model_id", UUID, nullable=True),
        sa.Column("feature_version", sa.Text(), nullable=False),
        sa.Column("question_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("receipt_id", UUID, nullable=True),
        sa.Column("item_tables", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("item_ids", postgresql.ARRAY(UUID), nullable=False),
        sa.Column("document_ids", postgresql.ARRAY(UUID), nullable=False),
        sa.Column("served_ranks", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("feature_count", sa.Integer(), nullable=False),
        sa.Column("features", postgresql.ARRAY(sa.REAL()), nullable=False),
        sa.Column("occurred_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_rank_events"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name="fk_rank_events_tenant_id_tenants",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "model_id"], ["memory.rank_models.tenant_id", "memory.rank_models.id"],
                                name="fk_rank_events_tenant_id_model_id_rank_models"),
        sa.CheckConstraint("operation in ('recall', 'prepare')", name="ck_rank_events_operation_known"),
        sa.CheckConstraint(f"channel in ({channels})", name="ck_rank_events_channel_known"),
        sa.CheckConstraint("length(question_hash) = 32", name="ck_rank_events_question_hash_length"),
        sa.CheckConstraint("length(model) between 1 and 500", name="ck_rank_events_model_length"),
        sa.CheckConstraint(
            "cardinality(item_ids) = cardinality(item_tables) and cardinality(document_ids) = cardinality(item_tables) "
            "and cardinality(served_ranks) = cardinality(item_tables) and cardinality(item_tables) <= 1000",
            name="ck_rank_events_items_aligned"),
        sa.CheckConstraint("feature_count between 1 and 256 and "
                           "cardinality(features) = feature_count * cardinality(item_tables)",
                           name="ck_rank_events_features_aligned"),
        schema="memory",
    )
    op.create_index("ix_rank_events_tenant_id_occurred_at", "rank_events", ["tenant_id", "occurred_at"],
                    schema="memory")
    op.create_index("ix_rank_events_tenant_id_model_id", "rank_events", ["tenant_id", "model_id"],
                    schema="memory")
    op.execute(SQL)
    for table in ("memory.rank_models", "memory.rank_events"):
        op.execute(sa.text("select provenance.attach_chain(cast(:t as regclass))").bindparams(t=table))


def downgrade() -> None:
    op.execute("drop function memory.rank_training_rows(timestamptz, interval)")
    op.drop_table("rank_events", schema="memory")
    op.drop_table("rank_models", schema="memory")
    op.execute("delete from memory.usage_ledger where channel = 'rest'")
    op.drop_constraint("ck_usage_ledger_channel_known", "usage_ledger", schema="memory")
    op.create_check_constraint("ck_usage_ledger_channel_known", "usage_ledger",
                               "channel in ('graphql', 'mcp', 'python', 'cli', 'worker')",
                               schema="memory")
