"""Derivation links a mention only to an entity every reader of the mention's scopes can read.

Why: extraction runs as the derive service, which reads every scope, and linked each
mention with ``knowledge.resolve_entity``: the visible entity of that name or alias.
A chunk shared into ``board`` that says "Bob" was linked to the person "Robert
<surname>" whose row is shared into ``hr`` only, so the ``board`` claims had a
subject ``board`` readers cannot read, and the profile built from them was titled
with the ``hr`` entity's canonical name, served to ``board`` readers in recall and
in the trace.

``knowledge.resolve_entity_within(type, name, scopes, create)`` resolves like
``resolve_entity`` (same normalisation, same per-name lock, so concurrent runs end
with one entity) but only among entities shared into **every** scope of ``scopes``
(``entities.scopes @> scopes``): an entity that anyone reading the mention can read.
When there is none, it creates one in ``scopes``. A person known in ``hr`` and
mentioned in a ``board`` document is then two entities, one per audience, and no
name crosses from one to the other. ``resolve_entity`` itself is unchanged: a user
who names an entity deliberately picks among what they can read.

Revision ID: 0022_entity_resolution_within
Revises: 0021_conflict_visibility
"""

from __future__ import annotations

from alembic import op

revision = "0022_entity_resolution_within"
down_revision = "0021_conflict_visibility"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
create function knowledge.resolve_entity_within(p_type text, p_name text, p_scopes uuid[],
                                                p_create boolean default true) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_key text := knowledge.normalize_name(p_name);
    v_id uuid;
begin
    if auth.tenant_id() is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    if v_key is null then
        raise exception 'an entity name must contain a letter or digit' using errcode = '22023';
    end if;
    if p_scopes is null or cardinality(p_scopes) = 0 then
        raise exception 'a mention is resolved within at least one scope' using errcode = '22023';
    end if;
    -- The same lock as resolve_entity: one entity per name however the two are mixed.
    perform pg_advisory_xact_lock(hashtextextended(
        'knowledge.entity:' || auth.tenant_id()::text || ':' || lower(p_type) || ':' || v_key, 0));
    select e.id into v_id from knowledge.entities e
     where e.tenant_id = (select auth.tenant_id()) and e.entity_type = p_type
       and e.merged_into is null and (e.name_key = v_key or v_key = any(e.alias_keys))
       and e.scopes @> p_scopes
     order by (e.name_key = v_key) desc, e.created_at, e.id
     limit 1;
    if v_id is null and p_create then
        insert into knowledge.entities (entity_type, canonical_name, scopes)
        values (p_type, btrim(p_name), p_scopes) returning id into v_id;
    end if;
    return v_id;
end
$$;
comment on function knowledge.resolve_entity_within(text, text, uuid[], boolean) is
    'resolve_entity among the entities shared into every scope of p_scopes (readable by every '
    'reader of a row in p_scopes); creates it in p_scopes when none is and p_create.';
revoke all on function knowledge.resolve_entity_within(text, text, uuid[], boolean) from public;
grant execute on function knowledge.resolve_entity_within(text, text, uuid[], boolean) to engram_app;
""")


def downgrade() -> None:
    op.execute("drop function knowledge.resolve_entity_within(text, text, uuid[], boolean)")
