"""Memory lanes: what the remaining recall lanes and derive jobs need from the schema.

Why, table by table:

* ``sources.documents.occurred_at``: when what a document describes happened
  (front matter ``date``; a dialogue turn's session time), as opposed to when the
  row was written. The timeline lane reads a selected document's neighbours in
  time within its collection through ``ix_documents_tenant_id_collection_occurred_at``.
* ``knowledge.entities`` gets ``ix_entities_tenant_id_name_key``: recall finds
  its entity seeds by probing the question's word n-grams against ``name_key``
  (the existing index leads with ``entity_type``, which recall does not know).
* ``memory.decisions`` become embeddable (``embed_text``, a stored generated
  column of category, scenario, reasoning and outcome): the causal lane finds
  decisions by meaning and then walks their causal links. ``source_table`` and
  ``source_id`` name the item a decision hook made the decision from, unique per
  tenant, so the hook is idempotent.
* ``memory.working_memory.kind``: ``note`` or ``decision`` (an item an agent
  marks as a decision; the decision hook turns it into a decision record).
* Every summary records which method and model made it (``summary_method``,
  ``summary_model``) on communities, RAPTOR nodes, profiles, episodes and
  observations.
* ``memory.raptor_nodes``: level-0 nodes list the chunks and fact contents they
  cluster (``member_chunk_ids``, ``member_fact_ids``; GIN-indexed so new or
  deleted content finds its node), keep the ``centroid`` of their members'
  embeddings (new content joins the nearest node without rebuilding the tree)
  and ``updated_at``.
* ``memory.episodes.source_item_ids``: the working-memory items an episode
  summarises (empty for episodes recorded directly).
* ``memory.observations.observation_key``: the consolidation job's identity of
  an observation (unique per tenant when set), so a rerun updates instead of
  duplicating.

Adding columns changes the canonical image of every existing row of those
tables, so the revision appends a BASELINE event per row afterwards (as 0006 did
when the chain was first attached): ``provenance.verify_rows`` stays clean.

Revision ID: 0010_memory_lanes
Revises: 0009_derive
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0010_memory_lanes"
down_revision = "0009_derive"
branch_labels = None
depends_on = None

EMBEDDING_DIMENSION = 384
UUIDS = postgresql.ARRAY(postgresql.UUID(as_uuid=True))
TS = sa.DateTime(timezone=True)
EXTRACTIVE = "extractive:centroid-mmr"
SUMMARISED = ("communities", "raptor_nodes", "profiles", "episodes", "observations")
# Tables whose rows change image here (new columns): re-baselined after the change.
CHANGED = ("sources.documents", "memory.decisions", "memory.working_memory", "memory.communities",
           "memory.raptor_nodes", "memory.profiles", "memory.episodes", "memory.observations")
DECISION_TEXT = ("category || ': ' || scenario || ' Reasoning: ' || reasoning"
                 " || coalesce(' Outcome: ' || outcome, '')")

SQL = r"""
grant insert (occurred_at), update (occurred_at) on sources.documents to engram_app;
comment on column sources.documents.occurred_at is
    'When what the document describes happened (front matter date, a dialogue turn''s time); '
    'the timeline lane orders a collection by it.';
comment on index sources.ix_documents_tenant_id_collection_occurred_at is
    'The timeline lane''s probe: a document''s neighbours in time within its collection.';
comment on index knowledge.ix_entities_tenant_id_name_key is
    'Recall''s entity seeds: the question''s word n-grams probed against canonical names.';

grant insert (kind) on memory.working_memory to engram_app;
comment on column memory.working_memory.kind is
    'note, or decision: an item marked as a decision, which the decision hook records.';

grant insert (source_table, source_id) on memory.decisions to engram_app;
create trigger tg_decisions__requeue before update on memory.decisions
    for each row execute function memory.tg_embedded__requeue('outcome');
select worker.make_embeddable('memory.decisions',
    array['tenant_id', 'id', 'embed_text', 'embed_state', 'embed_attempts', 'embed_model', 'created_at']);
comment on column memory.decisions.embed_text is
    'What the causal lane embeds: category, scenario, reasoning and outcome.';
comment on column memory.decisions.source_id is
    'The item (source_table) a decision hook recorded this decision from; unique per tenant.';

grant insert (member_chunk_ids, member_fact_ids, centroid, summary_method, summary_model),
      update (member_chunk_ids, member_fact_ids, centroid, summary_method, summary_model, updated_at)
    on memory.raptor_nodes to engram_app;
grant insert (summary_method, summary_model), update (summary_method, summary_model)
    on memory.communities, memory.profiles, memory.episodes, memory.observations to engram_app;
grant insert (source_item_ids), update (source_item_ids) on memory.episodes to engram_app;
grant insert (observation_key) on memory.observations to engram_app;
comment on column memory.raptor_nodes.member_chunk_ids is
    'Level 0: the chunks this node clusters (higher levels cluster nodes, see children).';
comment on column memory.raptor_nodes.member_fact_ids is
    'Level 0: the fact contents this node clusters.';
comment on column memory.raptor_nodes.centroid is
    'Mean of the members'' embeddings: new content joins the nearest node.';
comment on column memory.episodes.source_item_ids is
    'The working-memory items this episode summarises (empty when recorded directly).';
comment on column memory.observations.observation_key is
    'The consolidation job''s identity of this observation; a rerun updates it in place.';
"""


def _summary_columns(table: str) -> None:
    op.add_column(table, sa.Column("summary_method", sa.Text(), server_default=sa.text(f"'{EXTRACTIVE}'"),
                                   nullable=False), schema="memory")
    op.add_column(table, sa.Column("summary_model", sa.Text(), nullable=True), schema="memory")
    op.create_check_constraint(f"ck_{table}_summary_method_length", table,
                               "length(summary_method) between 1 and 200", schema="memory")
    op.execute(f"comment on column memory.{table}.summary_method is "
               f"'How the summary was made: extractive:<method> or abstractive:<endpoint kind>.'")
    op.execute(f"comment on column memory.{table}.summary_model is "
               f"'The model that wrote an abstractive summary (null for extractive ones).'")


def _baseline() -> None:
    # Only the migrating superuser sees every row (FORCE RLS hides them from the owner).
    op.execute("reset role")
    for table in CHANGED:
        op.execute(sa.text("select provenance.baseline(cast(:t as regclass))").bindparams(t=table))
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.add_column("documents", sa.Column("occurred_at", TS, nullable=True), schema="sources")
    op.create_index("ix_documents_tenant_id_collection_occurred_at", "documents",
                    ["tenant_id", "collection", "occurred_at"], schema="sources",
                    postgresql_where=sa.text("occurred_at is not null"))
    op.create_index("ix_entities_tenant_id_name_key", "entities", ["tenant_id", "name_key"],
                    schema="knowledge")

    op.add_column("working_memory", sa.Column("kind", sa.Text(), server_default=sa.text("'note'"),
                                              nullable=False), schema="memory")
    op.create_check_constraint("ck_working_memory_kind_known", "working_memory",
                               "kind in ('note', 'decision')", schema="memory")

    state = postgresql.ENUM(name="embed_state", schema="sources", create_type=False)
    for column in (
        sa.Column("embed_text", sa.Text(), sa.Computed(DECISION_TEXT, persisted=True), nullable=False),
        sa.Column("embedding", Vector(EMBEDDING_DIMENSION), nullable=True),
        sa.Column("embed_state", state, server_default=sa.text("'pending'"), nullable=False),
        sa.Column("embed_attempts", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("embed_error", sa.Text(), nullable=True),
        sa.Column("embed_model", sa.Text(), nullable=True),
        sa.Column("embedded_at", TS, nullable=True),
        sa.Column("source_table", sa.Text(), nullable=True),
        sa.Column("source_id", postgresql.UUID(as_uuid=True), nullable=True),
    ):
        op.add_column("decisions", column, schema="memory")
    op.create_check_constraint("ck_decisions_embed_attempts_nonnegative", "decisions", "embed_attempts >= 0",
                               schema="memory")
    op.create_check_constraint("ck_decisions_embedding_matches_state", "decisions",
                               "(embed_state = 'ready') = (embedding is not null)", schema="memory")
    op.create_check_constraint("ck_decisions_source_pair", "decisions",
                               "(source_table is null) = (source_id is null)", schema="memory")
    op.create_index("ix_decisions_embedding_hnsw", "decisions", ["embedding"], schema="memory",
                    postgresql_using="hnsw", postgresql_with={"m": 16, "ef_construction": 64},
                    postgresql_ops={"embedding": "vector_cosine_ops"})
    op.create_index("ix_decisions_embed_queue", "decisions", ["created_at"], schema="memory",
                    postgresql_where=sa.text("embed_state = 'pending'"))
    op.create_index("uq_decisions_tenant_id_source_table_source_id", "decisions",
                    ["tenant_id", "source_table", "source_id"], schema="memory", unique=True,
                    postgresql_where=sa.text("source_id is not null"))

    for table in SUMMARISED:
        _summary_columns(table)
    op.add_column("raptor_nodes", sa.Column("member_chunk_ids", UUIDS, server_default=sa.text("'{}'"),
                                            nullable=False), schema="memory")
    op.add_column("raptor_nodes", sa.Column("member_fact_ids", UUIDS, server_default=sa.text("'{}'"),
                                            nullable=False), schema="memory")
    op.add_column("raptor_nodes", sa.Column("centroid", Vector(EMBEDDING_DIMENSION), nullable=True),
                  schema="memory")
    op.add_column("raptor_nodes", sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
                  schema="memory")
    op.create_index("ix_raptor_nodes_member_chunk_ids", "raptor_nodes", ["member_chunk_ids"], schema="memory",
                    postgresql_using="gin")
    op.create_index("ix_raptor_nodes_member_fact_ids", "raptor_nodes", ["member_fact_ids"], schema="memory",
                    postgresql_using="gin")
    op.add_column("episodes", sa.Column("source_item_ids", UUIDS, server_default=sa.text("'{}'"),
                                        nullable=False), schema="memory")
    op.add_column("observations", sa.Column("observation_key", sa.Text(), nullable=True), schema="memory")
    op.create_check_constraint("ck_observations_observation_key_length", "observations",
                               "observation_key is null or length(observation_key) between 1 and 200",
                               schema="memory")
    op.create_index("uq_observations_tenant_id_observation_key", "observations",
                    ["tenant_id", "observation_key"], schema="memory", unique=True,
                    postgresql_where=sa.text("observation_key is not null"))
    op.execute(SQL)
    _baseline()


def downgrade() -> None:
    op.drop_index("uq_observations_tenant_id_observation_key", table_name="observations", schema="memory")
    op.drop_constraint("ck_observations_observation_key_length", "observations", schema="memory")
    op.drop_column("observations", "observation_key", schema="memory")
    op.drop_column("episodes", "source_item_ids", schema="memory")
    op.drop_index("ix_raptor_nodes_member_fact_ids", table_name="raptor_nodes", schema="memory")
    op.drop_index("ix_raptor_nodes_member_chunk_ids", table_name="raptor_nodes", schema="memory")
    for column in ("updated_at", "centroid", "member_fact_ids", "member_chunk_ids"):
        op.drop_column("raptor_nodes", column, schema="memory")
    for table in SUMMARISED:
        op.drop_constraint(f"ck_{table}_summary_method_length", table, schema="memory")
        op.drop_column(table, "summary_model", schema="memory")
        op.drop_column(table, "summary_method", schema="memory")
    op.execute("""
drop trigger if exists tg_decisions__requeue on memory.decisions;
drop trigger if exists tg_decisions__notify_embed_insert on memory.decisions;
drop trigger if exists tg_decisions__notify_embed_update on memory.decisions;
drop policy if exists decisions__select_worker on memory.decisions;
drop policy if exists decisions__update_worker on memory.decisions;
revoke all on memory.decisions from engram_worker;
""")
    op.drop_index("uq_decisions_tenant_id_source_table_source_id", table_name="decisions", schema="memory")
    op.drop_index("ix_decisions_embed_queue", table_name="decisions", schema="memory")
    op.drop_index("ix_decisions_embedding_hnsw", table_name="decisions", schema="memory")
    for name in ("ck_decisions_source_pair", "ck_decisions_embedding_matches_state",
                 "ck_decisions_embed_attempts_nonnegative"):
        op.drop_constraint(name, "decisions", schema="memory")
    for column in ("source_id", "source_table", "embedded_at", "embed_model", "embed_error", "embed_attempts",
                   "embed_state", "embedding", "embed_text"):
        op.drop_column("decisions", column, schema="memory")
    op.drop_constraint("ck_working_memory_kind_known", "working_memory", schema="memory")
    op.drop_column("working_memory", "kind", schema="memory")
    op.drop_index("ix_entities_tenant_id_name_key", table_name="entities", schema="knowledge")
    op.drop_index("ix_documents_tenant_id_collection_occurred_at", table_name="documents", schema="sources")
    op.drop_column("documents", "occurred_at", schema="sources")
    _baseline()
