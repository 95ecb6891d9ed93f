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

Revision ID: 0015_extraction
Revises: 0014_recall_probes
"""

from __future__ import annotations

from alembic import op

revision = "0015_extraction"
down_revision = "0014_recall_probes"
branch_labels = None
depends_on = None

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
"""

DOWNGRADE_SQL = """
drop trigger tg_chunks__retract_extractions on sources.chunks;
drop function memory.tg_chunks__retract_extractions();
drop policy extractions__select_owner on memory.extractions;
"""


def upgrade() -> None:
    op.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.execute(DOWNGRADE_SQL)
