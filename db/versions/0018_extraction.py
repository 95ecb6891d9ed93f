"""Extracted claims end with the chunk they were read from.

Why: the extractor records, per chunk, the claims it wrote
(``memory.extractions.claim_ids``). When a document is edited its chunks are
replaced, and when it is deleted they go; until now the claims read from the old
text stayed current, so recall kept serving what the source no longer says.

``memory.tg_chunks__retract_extractions`` runs before each chunk row is deleted
(an edit re-chunks by deleting, a document delete cascades) and sets
``superseded_at`` on the chunk's extracted claims that are still current: their
record time ends, nothing is deleted, history and lineage stay. It runs in the
deleting transaction, so there is no moment in which the new text is stored and
the old claims are still served.

SECURITY DEFINER: whoever may delete a chunk may retract what was read from it,
even where the document's scope set has since drifted from the claims' (a scope
change re-extracts, but on the next run, not atomically) and the deleter may read
but not write the claims' older scopes. It cannot reach further: it touches only
``superseded_at`` of extractor claims listed by the deleted chunk's own extraction
record whose scope set is exactly that record's, and a record can only be written
into scopes its writer may write (0009's policies), so a crafted record retracts
nothing its writer could not retract directly. The owner's policies
(``extractions__select_owner``, added here, and 0004's ``fact_claim__update_owner``)
keep it inside the bound tenant and the claims the caller can read. Without a
bound identity (a DBA deleting a tenant) it does nothing: everything goes anyway.

Two changes to the claim write path, because extraction writes thousands of
claims a run and profiling it (benchmarks/derive.py, docs/derive.md) found the
database's per-claim work dominating:

* ``knowledge.intern_contents(texts)``: the set-based ``intern_content``. One
  statement stores every new text of a batch, where one call per text was one
  ``fact_content`` insert statement (and one provenance chain append) each.
  SECURITY DEFINER for the same reason as ``intern_content`` (content rows are
  readable only through visible claims); it stores and returns exactly what
  ``intern_content`` would for each text.
* ``knowledge.tg_fact_claim__detect_conflicts`` returns at once when no shape of
  the tenant can make the new claim conflict (its predicate neither functional,
  ``max_count = 1``, nor exclusive with another): ``find_conflicts`` reports a
  pair only under such a shape, so skipping it there changes no result, and it
  was a scan of every claim about the subject (a popular entity has thousands of
  extracted mentions). A shape added while claims are being written is covered
  by the sweep (``detect_conflicts``, run by the derive tick), as before.

Revision ID: 0018_extraction
Revises: 0017_derive_hierarchy
"""

from __future__ import annotations

from alembic import op

revision = "0018_extraction"
down_revision = "0017_derive_hierarchy"
branch_labels = None
depends_on = None

# 0004's trigger function, with or without the fast path (downgrade restores 0004's).
DETECT_CONFLICTS = """
create or replace function knowledge.tg_fact_claim__detect_conflicts() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin{fast_path}
    -- Writers in one partition and subject queue here; the second one's query
    -- (a fresh snapshot after the wait) sees the first's committed claim, so a
    -- pair of concurrent conflicting writes yields exactly one conflict row.
    perform pg_advisory_xact_lock_shared(hashtextextended('knowledge.conflicts:' || new.tenant_id::text, 0));
    perform pg_advisory_xact_lock(hashtextextended(
        'knowledge.claims:' || new.tenant_id::text || ':' || new.perspective_key || ':' || new.subject_id::text, 0));
    perform knowledge.record_conflicts(new.id);
    return null;
end
$$;
"""

UPGRADE_SQL = """
create policy extractions__select_owner on memory.extractions for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));

create function memory.tg_chunks__retract_extractions() returns trigger
    language plpgsql security definer
    set search_path = pg_catalog, pg_temp
as $$
begin
    if auth.tenant_id() is distinct from old.tenant_id then
        return old;
    end if;
    update knowledge.fact_claim c set superseded_at = now()
      from memory.extractions e
     where e.tenant_id = old.tenant_id and e.chunk_id = old.id
       and c.tenant_id = e.tenant_id and c.id = any(e.claim_ids) and c.superseded_at is null
       and c.author_role = 'extractor' and c.scopes @> e.scopes and c.scopes <@ e.scopes;
    return old;
end
$$;
comment on function memory.tg_chunks__retract_extractions() is
    'Before a chunk is deleted: the claims extracted from it stop being current (superseded_at); '
    'SECURITY DEFINER so a drifted scope set cannot keep them alive; bound tenant only.';
revoke all on function memory.tg_chunks__retract_extractions() from public;

create trigger tg_chunks__retract_extractions before delete on sources.chunks
    for each row execute function memory.tg_chunks__retract_extractions();

create function knowledge.intern_contents(p_texts text[])
    returns table (content_text text, content_id uuid)
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid := auth.tenant_id();
begin
    if v_tenant is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    if exists (select 1 from unnest(p_texts) as u(t) where u.t is null or btrim(u.t) = '') then
        raise exception 'fact text must not be empty' using errcode = '22023';
    end if;
    insert into knowledge.fact_content (tenant_id, text)
    select distinct v_tenant, u.t from unnest(p_texts) as u(t)
        on conflict (tenant_id, content_hash) do nothing;
    return query
        select u.t, c.id from (select distinct x.t from unnest(p_texts) as x(t)) u
          join knowledge.fact_content c
            on c.tenant_id = v_tenant and c.content_hash = sha256(convert_to(u.t, 'UTF8'));
end
$$;
comment on function knowledge.intern_contents(text[]) is
    'intern_content for many texts in one statement: (text, id) per distinct text (SECURITY '
    'DEFINER: content rows are readable only through visible claims).';
revoke all on function knowledge.intern_contents(text[]) from public;
grant execute on function knowledge.intern_contents(text[]) to engram_app;

""" + DETECT_CONFLICTS.format(fast_path="""
    -- find_conflicts reports a pair only under a shape that makes this predicate
    -- functional or exclusive; without one there is nothing to find (or lock for).
    if not exists (select 1 from knowledge.shapes s
                    where s.tenant_id = new.tenant_id
                      and ((s.predicate = new.predicate
                            and (s.max_count = 1 or cardinality(s.exclusive_with) > 0))
                           or new.predicate = any(s.exclusive_with))) then
        return null;
    end if;""")

DOWNGRADE_SQL = DETECT_CONFLICTS.format(fast_path="") + """
drop function knowledge.intern_contents(text[]);
drop trigger tg_chunks__retract_extractions on sources.chunks;
drop function memory.tg_chunks__retract_extractions();
drop policy extractions__select_owner on memory.extractions;
"""


def upgrade() -> None:
    op.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.execute(DOWNGRADE_SQL)
