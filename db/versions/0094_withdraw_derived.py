"""What was derived from a chunk leaves with the chunk's audience, in the same transaction.

Why: derived memory is built per exact scope set, from rows readable in exactly that set
(docs/security.md). When a document's audience narrows (moved from ``team`` to ``exec``, or
from ``team, exec`` to ``exec``) its chunks follow at once (0002's ``propagate_scopes``), but
everything derived from them stayed in the old scope set: the claims extracted from the
chunks (until the extractor read them again), and the RAPTOR summaries, community
summaries, entity profiles, observations and decisions built from them (until the next
derive run, every five minutes under ``engram up``, never without a worker). A ``team``
reader who may no longer read the document was served "Project Falcon is the plan to
acquire Zephyr Robotics for 40 million euros" as a fact, a community summary, an entity
profile and a RAPTOR summary. A deleted document left its summaries for its readers the
same way (its claims were already retracted, 0018).

What changes:

A row shared into scope set S is read by whoever holds one scope of S, so a row derived
from a chunk may stay only while S is within the chunk's scope set: every reader of the row
can then read the chunk. Derived rows are built in the chunk's scope set of the moment, so
the rule holds until the chunk's set narrows (loses a scope); widening keeps it.

* ``memory.tg_chunks__retract_extractions`` (0018, SECURITY DEFINER) also runs when a
  chunk's scope set narrows (``not old.scopes <@ new.scopes``): the claims extracted from it
  in a scope set outside the new one stop being current, as all of them do when the chunk
  is deleted. The extractor's next reading writes them into the new scope set.
* ``memory.withdraw_derived(tenant, chunk, document, readers)`` (SECURITY INVOKER: it
  deletes through the writer's own policies; a writer of the chunk may write every scope of
  its old set) deletes the derived rows shared into a scope outside ``readers`` (the
  chunk's new scope set; none when it is deleted): the RAPTOR leaves holding the chunk and
  every node above them (the nodes below are kept, without a parent, and join a tree again
  at the next run); the communities that hold an entity of the chunk's claims, and every
  community above them; the profiles of those entities; the observations drawn from those
  claims; the decision recorded from the chunk's document. The next derive run builds what
  the rows still readable in each scope set support. On a move (not a delete) the extracted
  claims outside the new set are deleted too (a superseded claim keeps its text, and
  ``claim(id)`` serves a readable claim current or not), and so are the entities only they
  named (the name came from the chunk; an entity a note aliases, or that a row the writer
  cannot read still names, stays).
* ``memory.tg_chunks__withdraw_derived`` runs it before a chunk is deleted with its
  document, and before a chunk's scope set narrows. A chunk deleted while its document
  stays (an edit replacing its chunks) keeps the audience: its summaries are refreshed by
  the next derive run, as before.
* ``ix_observations_source_claim_ids`` (GIN) finds the observations drawn from a claim.

Nothing runs without a bound identity of the chunk's tenant (a tenant's deletion cascades).

Revision ID: 0094_withdraw_derived
Revises: 0093_scope_in_use
"""

from __future__ import annotations

from alembic import op

from orchestrator.db.migrate import patched, released_sql

revision = "0094_withdraw_derived"
down_revision = "0093_scope_in_use"
branch_labels = None
depends_on = None

# 0018's retraction trigger and its function, as released; this revision patches them.
def _retraction() -> str:
    return released_sql("0018_extraction", "UPGRADE_SQL",
                        "create function memory.tg_chunks__retract_extractions",
                        "create function knowledge.intern_contents")


# (anchor in 0018's text, what it becomes): also on an update of the scopes that narrows
# them, and then only the claims of a record whose scope set the chunk left.
RETRACT_PATCHES = (
    ("create function memory.tg_chunks__retract_extractions",
     "create or replace function memory.tg_chunks__retract_extractions"),
    ("""as $$
begin
    if auth.tenant_id() is distinct from old.tenant_id then
        return old;
    end if;
""", """as $$
declare
    v_kept record := case when tg_op = 'DELETE' then old else new end;
begin
    if auth.tenant_id() is distinct from old.tenant_id then
        return v_kept;
    end if;
    if tg_op = 'UPDATE' and old.scopes <@ new.scopes then
        return v_kept;  -- every reader of the old scope set still reads the chunk
    end if;
"""),
    ("""     where e.tenant_id = old.tenant_id and e.chunk_id = old.id
""", """     where e.tenant_id = old.tenant_id and e.chunk_id = old.id
       and (tg_op = 'DELETE' or not (e.scopes <@ new.scopes))
"""),
    ("""c.scopes <@ e.scopes;
    return old;""", """c.scopes <@ e.scopes;
    return v_kept;"""),
    ("'Before a chunk is deleted: the claims extracted from it stop being current",
     "'Before a chunk is deleted, or its scope set narrows: the claims extracted from it stop "
     "'\n    'being current"),
    ("create trigger tg_chunks__retract_extractions before delete on sources.chunks",
     "drop trigger tg_chunks__retract_extractions on sources.chunks;\n"
     "create trigger tg_chunks__retract_extractions before delete or update of scopes "
     "on sources.chunks"),
)


# A tree's rows that match, and every row above them, deleted; the rows below lose their
# parent (and join a tree again at the next run). RAPTOR nodes and communities alike.
PATH_SQL = """
with recursive up(id) as (
    select n.id from memory.{table} n
     where n.tenant_id = p_tenant and {matches} and not (n.scopes <@ p_readers)
    union
    select n.parent_id from memory.{table} n join up on n.id = up.id
     where n.tenant_id = p_tenant and n.parent_id is not null
)
select array_agg(id) into v_gone from up;
if v_gone is not null then
    update memory.{table} set parent_id = null
     where tenant_id = p_tenant and parent_id = any(v_gone) and not id = any(v_gone);
    delete from memory.{table} where tenant_id = p_tenant and id = any(v_gone);
end if;"""


def _path(table: str, matches: str, indent: int) -> str:
    return "\n".join(" " * indent + line if line else line
                     for line in PATH_SQL.format(table=table, matches=matches).strip("\n").split("\n"))


WITHDRAW_SQL = """
create index ix_observations_source_claim_ids on memory.observations using gin (source_claim_ids);

create function memory.withdraw_derived(p_tenant uuid, p_chunk uuid, p_document uuid,
                                        p_readers uuid[]) returns void
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_claims uuid[];
    v_entities uuid[];
    v_gone uuid[];
begin
    select coalesce(e.claim_ids, '{}') into v_claims
      from memory.extractions e where e.tenant_id = p_tenant and e.chunk_id = p_chunk;
    v_claims := coalesce(v_claims, '{}');
    select coalesce(array_agg(distinct x), '{}') into v_entities
      from knowledge.fact_claim c
     cross join lateral unnest(array[c.subject_id, c.object_id]) as x
     where c.tenant_id = p_tenant and c.id = any(v_claims) and x is not null;

    -- RAPTOR: the leaves holding the chunk and every node above them.
{raptor}
    if cardinality(v_entities) > 0 then
        -- Communities holding one of the claims' entities, and every community above them.
{communities}
        delete from memory.profiles
         where tenant_id = p_tenant and subject_entity_id = any(v_entities)
           and not (scopes <@ p_readers);
    end if;
    if cardinality(v_claims) > 0 and cardinality(p_readers) > 0 then
        -- Moved, not deleted: the extracted claims the old readers could fetch by id (a
        -- superseded claim keeps its text) go; the extractor writes them into the new set.
        delete from knowledge.fact_claim
         where tenant_id = p_tenant and id = any(v_claims) and author_role = 'extractor'
           and not (scopes <@ p_readers);
        -- An entity that only those claims named, and no note aliases, goes with them: its
        -- name came from the chunk. One still named by a row the writer cannot read stays.
        begin
            delete from knowledge.entities e
             where e.tenant_id = p_tenant and e.id = any(v_entities) and e.merged_into is null
               and e.given_aliases = '{}'::jsonb and not (e.scopes <@ p_readers)
               and not exists (select 1 from knowledge.fact_claim c
                                where c.tenant_id = p_tenant
                                  and (c.subject_id = e.id or c.object_id = e.id))
               and not exists (select 1 from knowledge.entities m
                                where m.tenant_id = p_tenant and m.merged_into = e.id)
               and not exists (select 1 from memory.profiles f
                                where f.tenant_id = p_tenant and f.subject_entity_id = e.id)
               and not exists (select 1 from memory.observations o
                                where o.tenant_id = p_tenant and o.subject_entity_id = e.id);
        exception when foreign_key_violation then
            null;
        end;
    end if;
    if cardinality(v_claims) > 0 then
        delete from memory.observations
         where tenant_id = p_tenant and source_claim_ids && v_claims
           and not (scopes <@ p_readers);
    end if;
    delete from memory.decisions
     where tenant_id = p_tenant and source_table = 'sources.documents' and source_id = p_document
       and not (scopes <@ p_readers);
end
$$;
comment on function memory.withdraw_derived(uuid, uuid, uuid, uuid[]) is
    'Deletes what was derived from a chunk and is shared into a scope outside p_readers (the '
    'chunk''s scopes now; none when deleted): its RAPTOR path, communities, profiles, '
    'observations, its document''s decision; as the caller: the next derive run rebuilds.';
revoke all on function memory.withdraw_derived(uuid, uuid, uuid, uuid[]) from public;
grant execute on function memory.withdraw_derived(uuid, uuid, uuid, uuid[]) to engram_app;

create function memory.tg_chunks__withdraw_derived() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_kept record := case when tg_op = 'DELETE' then old else new end;
begin
    if auth.tenant_id() is distinct from old.tenant_id then
        return v_kept;
    end if;
    if tg_op = 'UPDATE' then
        if old.scopes <@ new.scopes then
            return v_kept;  -- nobody loses the chunk
        end if;
    elsif exists (select 1 from sources.documents d
                   where d.tenant_id = old.tenant_id and d.id = old.document_id) then
        return v_kept;  -- an edit replacing the chunk: the same readers; the next run refreshes
    end if;
    perform memory.withdraw_derived(old.tenant_id, old.id, old.document_id,
                                    case when tg_op = 'DELETE' then '{}'::uuid[] else new.scopes end);
    return v_kept;
end
$$;
comment on function memory.tg_chunks__withdraw_derived() is
    'Before a chunk leaves its readers (deleted with its document, or its scope set narrows): '
    'what was derived from it and is shared outside its readers now is withdrawn '
    '(memory.withdraw_derived).';
revoke all on function memory.tg_chunks__withdraw_derived() from public;

create trigger tg_chunks__withdraw_derived before delete or update of scopes on sources.chunks
    for each row execute function memory.tg_chunks__withdraw_derived();
""".replace("{raptor}", _path("raptor_nodes", "n.member_chunk_ids @> array[p_chunk]", 4)).replace(
    "{communities}", _path("communities", "n.member_entity_ids && v_entities", 8))


def upgrade() -> None:
    op.execute(patched(_retraction(), RETRACT_PATCHES, "0018's retraction trigger"))
    op.execute(WITHDRAW_SQL)


def downgrade() -> None:
    op.execute("drop trigger tg_chunks__withdraw_derived on sources.chunks")
    op.execute("drop function memory.tg_chunks__withdraw_derived()")
    op.execute("drop function memory.withdraw_derived(uuid, uuid, uuid, uuid[])")
    op.execute("drop index memory.ix_observations_source_claim_ids")
    op.execute("drop trigger tg_chunks__retract_extractions on sources.chunks")
    # 0018's function and trigger (on delete only), over the function this revision replaced.
    op.execute(patched(_retraction(), RETRACT_PATCHES[:1], "0018's retraction function"))
