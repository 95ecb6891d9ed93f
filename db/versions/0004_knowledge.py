"""Knowledge model: entities, fact content and claims, keyed facts, shapes, quarantine, conflicts.

Why: facts are the grounded evidence recall ranks first, and they must stay
trustworthy while many writers (people, agents, extractors) add to them. So the
database, not the application, owns every rule:

* ``entities``: typed, canonical name, aliases; ``name_key`` and ``alias_keys``
  are the normalised forms (NFKC, lower case, collapsed blanks) that
  ``knowledge.resolve_entity`` matches, under a per-name advisory lock so two
  writers mentioning the same person create one entity. ``merge_entities``
  repoints claims and leaves the merged-away row in place with ``merged_into``
  set, so its id stays resolvable (``knowledge.canonical_entity``).
* ``fact_content`` is immutable text deduplicated per tenant by SHA-256; it has
  no scopes of its own: a content row is readable exactly when a claim the
  caller can read points at it, so a private claim never leaks its text through
  the shared row. Writers intern text through ``knowledge.intern_content``
  (SECURITY DEFINER, see there).
* ``fact_claim`` says who claims which content about which subject: predicate,
  object entity or typed literal, scopes, author and role, epistemic kind,
  perspective key (``world`` for world facts, ``user:<author>`` otherwise),
  confidence, authority, valid time (``valid_from``/``valid_to``) and record
  time (``recorded_at``/``superseded_at``), keyed-fact columns (``fact_key``,
  ``as_of``) and access counters. A claim whose object is an entity is a
  relation; subject and object are btree-indexed for graph walks.
* ``shapes`` (SHACL-style, one row per predicate, managed by the DBA) are
  checked by ``knowledge.check_claim`` in the claim's BEFORE trigger. A failing
  claim is not inserted: it lands in ``quarantine`` with the reasons and the
  original payload, visible to its writer, releasable after correction.
  ``knowledge.dry_run_shape`` reports what a shape change would reject.
* ``conflicts``: value, time and relation conflicts within one perspective
  partition, detected on write (an AFTER trigger that first takes an advisory
  lock per tenant, partition and subject, so concurrent writers of conflicting
  claims produce exactly one row) and on demand (``detect_conflicts``).
  ``resolve_conflict`` closes the loser's validity; nothing is deleted.

Structural bad input (malformed values, valid-to before valid-from, confidence
outside [0, 1], an entity of another tenant or invisible to the writer) is
refused with a SQLSTATE that orchestrator/errors.py maps; rule violations
(shapes) are quarantined.

Read  = the caller holds read (or write) on at least one of the row's scopes.
Write = the caller holds write on every one of the row's scopes.

Revision ID: 0004_knowledge
Revises: 0003_index_tier
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision = "0004_knowledge"
down_revision = "0003_index_tier"
branch_labels = None
depends_on = None

EMBEDDING_DIMENSION = 384
DATATYPES = ("string", "number", "integer", "boolean", "date", "datetime", "uri", "entity")

UUID = postgresql.UUID(as_uuid=True)
UUIDS = postgresql.ARRAY(postgresql.UUID(as_uuid=True))
TS = sa.DateTime(timezone=True)


def _tenant() -> sa.Column[object]:
    return sa.Column("tenant_id", UUID, server_default=sa.text("auth.tenant_id()"), nullable=False)


def _id() -> sa.Column[object]:
    return sa.Column("id", UUID, server_default=sa.text("uuidv7()"), nullable=False)


def _embedding_columns(table: str) -> list[sa.SchemaItem]:
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


FUNCTIONS_SQL = r"""
create function knowledge.normalize_name(p_name text) returns text
    language sql immutable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select nullif(btrim(regexp_replace(lower(normalize(p_name, NFKC)), '[\s[:punct:]]+', ' ', 'g')), '')
$$;
comment on function knowledge.normalize_name(text) is
    'The key entity resolution matches on: NFKC, lower case, punctuation and blanks collapsed.';

create function knowledge.literal_conforms(p_value text, p_datatype text) returns boolean
    language sql stable parallel safe security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select case p_datatype
        when 'string' then true
        when 'number' then p_value ~ '^[+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?$'
        when 'integer' then p_value ~ '^[+-]?[0-9]{1,18}$'
        when 'boolean' then p_value in ('true', 'false')
        when 'date' then p_value ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' and pg_input_is_valid(p_value, 'date')
        when 'datetime' then p_value ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ]' and pg_input_is_valid(p_value, 'timestamptz')
        when 'uri' then p_value ~ '^[A-Za-z][A-Za-z0-9+.-]*:[^\s]+$'
        else false
    end
$$;
comment on function knowledge.literal_conforms(text, text) is
    'Whether a literal object value is a well-formed value of its datatype.';

create function knowledge.canonical_entity(p_entity uuid) returns uuid
    language sql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
    with recursive chain(id, merged_into, depth) as (
        select e.id, e.merged_into, 0 from knowledge.entities e where e.id = p_entity
        union all
        select e.id, e.merged_into, c.depth + 1
          from chain c join knowledge.entities e on e.tenant_id = (select auth.tenant_id()) and e.id = c.merged_into
         where c.depth < 32
    )
    select id from chain where merged_into is null
$$;
comment on function knowledge.canonical_entity(uuid) is
    'Follows merges: the surviving entity an id (possibly merged away) now means; null if invisible.';

create function knowledge.resolve_entity(p_type text, p_name text, p_scopes uuid[],
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
    -- Two writers mentioning the same new name must end with one entity: they
    -- queue on the name, and the second finds the first's row.
    perform pg_advisory_xact_lock(hashtextextended(
        'knowledge.entity:' || auth.tenant_id()::text || ':' || lower(p_type) || ':' || v_key, 0));
    select e.id into v_id from knowledge.entities e
     where e.tenant_id = (select auth.tenant_id()) and e.entity_type = p_type
       and e.merged_into is null and (e.name_key = v_key or v_key = any(e.alias_keys))
     order by (e.name_key = v_key) desc, e.created_at, e.id
     limit 1;
    if v_id is null and p_create then
        insert into knowledge.entities (entity_type, canonical_name, scopes)
        values (p_type, btrim(p_name), p_scopes) returning id into v_id;
    end if;
    return v_id;
end
$$;
comment on function knowledge.resolve_entity(text, text, uuid[], boolean) is
    'The visible entity of this type whose name or alias matches p_name (normalised); '
    'creates it in p_scopes when none does and p_create.';

create function knowledge.merge_entities(p_survivor uuid, p_merged uuid) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_survivor knowledge.entities;
    v_merged knowledge.entities;
begin
    if p_survivor = p_merged then
        raise exception 'an entity cannot be merged into itself' using errcode = '22023';
    end if;
    select * into v_survivor from knowledge.entities
     where tenant_id = (select auth.tenant_id()) and id = knowledge.canonical_entity(p_survivor);
    select * into v_merged from knowledge.entities
     where tenant_id = (select auth.tenant_id()) and id = p_merged and merged_into is null;
    if v_survivor.id is null or v_merged.id is null then
        raise exception 'entity % or % does not exist, is not visible or was merged already',
            p_survivor, p_merged using errcode = 'P0002';
    end if;
    if v_survivor.id = v_merged.id then
        raise exception 'an entity cannot be merged into itself' using errcode = '22023';
    end if;
    update knowledge.entities
       set aliases = (select coalesce(array_agg(distinct a order by a), '{}')
                        from unnest(v_survivor.aliases || v_merged.aliases || v_merged.canonical_name) a
                       where knowledge.normalize_name(a) is distinct from v_survivor.name_key)
     where tenant_id = v_survivor.tenant_id and id = v_survivor.id;
    if not found then
        raise exception 'no write access to entity %', v_survivor.id using errcode = '42501';
    end if;
    update knowledge.entities set merged_into = v_survivor.id
     where tenant_id = v_merged.tenant_id and id = v_merged.id;
    if not found then
        raise exception 'no write access to entity %', v_merged.id using errcode = '42501';
    end if;
    update knowledge.entities set merged_into = v_survivor.id
     where tenant_id = v_merged.tenant_id and merged_into = v_merged.id;
    -- Claims the caller cannot write keep pointing at the merged-away id, which
    -- still resolves to the survivor through canonical_entity.
    update knowledge.fact_claim set subject_id = v_survivor.id
     where tenant_id = v_merged.tenant_id and subject_id = v_merged.id;
    update knowledge.fact_claim set object_id = v_survivor.id
     where tenant_id = v_merged.tenant_id and object_id = v_merged.id;
    return v_survivor.id;
end
$$;
comment on function knowledge.merge_entities(uuid, uuid) is
    'Merges p_merged into p_survivor: aliases move, writable claims are repointed, and the '
    'merged-away row stays with merged_into set so its id remains resolvable.';

create function knowledge.tg_entities__normalize() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'UPDATE' and new.tenant_id is distinct from old.tenant_id then
        raise exception 'an entity cannot move to another tenant' using errcode = '42501';
    end if;
    new.scopes := auth.check_scopes(new.tenant_id, new.scopes);
    new.canonical_name := btrim(new.canonical_name);
    new.name_key := knowledge.normalize_name(new.canonical_name);
    if new.name_key is null then
        raise exception 'an entity name must contain a letter or digit' using errcode = '22023';
    end if;
    select coalesce(array_agg(distinct a order by a), '{}'),
           coalesce(array_agg(distinct knowledge.normalize_name(a)), '{}')
      into new.aliases, new.alias_keys
      from unnest(coalesce(new.aliases, '{}')) a where knowledge.normalize_name(a) is not null;
    if new.merged_into is not null then
        if new.merged_into = new.id then
            raise exception 'an entity cannot be merged into itself' using errcode = '22023';
        end if;
        -- Merges point at survivors only, so chains stay one step deep and never loop.
        if exists (select 1 from knowledge.entities e where e.tenant_id = new.tenant_id
                      and e.id = new.merged_into and e.merged_into is not null) then
            raise exception 'entity % was merged away; merge into its survivor', new.merged_into
                using errcode = '22023';
        end if;
        if tg_op = 'UPDATE' and old.merged_into is not null and new.merged_into is distinct from old.merged_into
           and knowledge.canonical_entity(old.merged_into) is distinct from new.merged_into then
            raise exception 'a merged entity can only be repointed to its survivor' using errcode = '42501';
        end if;
    elsif tg_op = 'UPDATE' and old.merged_into is not null then
        raise exception 'a merge cannot be undone by clearing merged_into' using errcode = '42501';
    end if;
    if tg_op = 'UPDATE' then
        new.created_at := old.created_at;
        new.created_by := old.created_by;
        new.updated_at := now();
        if new.summary is distinct from old.summary or new.canonical_name is distinct from old.canonical_name then
            new.embedding := null;
            new.embed_state := 'pending';
        end if;
    end if;
    return new;
end
$$;
comment on function knowledge.tg_entities__normalize() is
    'Validates scopes, computes the normalised name and alias keys, guards merges.';

-- SECURITY DEFINER: a content row has no scopes of its own and is readable only
-- through a visible claim, so the writer cannot read (nor deduplicate against)
-- rows whose claims it cannot see. This function, owned by engram_owner, only
-- inserts the text into the bound tenant or returns the existing id; it reveals
-- nothing beyond "this exact text exists in your tenant", which needs the text.
create function knowledge.intern_content(p_text text) returns uuid
    language plpgsql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_tenant uuid := auth.tenant_id();
    v_id uuid;
begin
    if v_tenant is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    if p_text is null or btrim(p_text) = '' then
        raise exception 'fact text must not be empty' using errcode = '22023';
    end if;
    insert into knowledge.fact_content (tenant_id, text) values (v_tenant, p_text)
        on conflict (tenant_id, content_hash) do nothing returning id into v_id;
    if v_id is null then
        select c.id into v_id from knowledge.fact_content c
         where c.tenant_id = v_tenant and c.content_hash = sha256(convert_to(p_text, 'UTF8'));
    end if;
    return v_id;
end
$$;
comment on function knowledge.intern_content(text) is
    'Stores fact text once per tenant (by SHA-256) and returns its id (SECURITY DEFINER: '
    'content rows are readable only through visible claims).';
revoke all on function knowledge.intern_content(text) from public;

create function knowledge.tg_fact_content__immutable() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_op = 'INSERT' then
        new.content_hash := sha256(convert_to(new.text, 'UTF8'));
        return new;
    end if;
    if new.text is distinct from old.text or new.content_hash is distinct from old.content_hash
       or new.tenant_id is distinct from old.tenant_id or new.id is distinct from old.id
       or new.created_at is distinct from old.created_at then
        raise exception 'fact content is immutable; assert a new claim with new text instead'
            using errcode = '42501';
    end if;
    return new;
end
$$;
comment on function knowledge.tg_fact_content__immutable() is
    'Computes the content hash on insert; refuses any change to text, hash or identity.';

create function knowledge.shape_reasons(p_shape knowledge.shapes, p_claim knowledge.fact_claim)
    returns text[]
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_reasons text[] := '{}';
    v_subject_type text;
    v_object_type text;
    v_count integer;
begin
    if p_shape.subject_type is not null then
        select e.entity_type into v_subject_type from knowledge.entities e
         where e.tenant_id = p_claim.tenant_id and e.id = p_claim.subject_id;
        if v_subject_type is distinct from p_shape.subject_type then
            v_reasons := v_reasons || format('predicate %s needs a subject of type %s, not %s',
                p_shape.predicate, p_shape.subject_type, coalesce(v_subject_type, 'unknown'));
        end if;
    end if;
    if p_shape.datatype is not null and p_shape.datatype <> p_claim.object_datatype then
        v_reasons := v_reasons || format('predicate %s expects datatype %s, not %s',
            p_shape.predicate, p_shape.datatype, p_claim.object_datatype);
    end if;
    if p_shape.object_type is not null then
        if p_claim.object_id is null then
            v_reasons := v_reasons || format('predicate %s needs an entity of type %s as object',
                p_shape.predicate, p_shape.object_type);
        else
            select e.entity_type into v_object_type from knowledge.entities e
             where e.tenant_id = p_claim.tenant_id and e.id = p_claim.object_id;
            if v_object_type is distinct from p_shape.object_type then
                v_reasons := v_reasons || format('predicate %s needs an object of type %s, not %s',
                    p_shape.predicate, p_shape.object_type, coalesce(v_object_type, 'unknown'));
            end if;
        end if;
    end if;
    if p_shape.value_pattern is not null and p_claim.object_value is not null
       and p_claim.object_value !~ p_shape.value_pattern then
        v_reasons := v_reasons || format('value %s of predicate %s does not match the pattern %s',
            quote_literal(p_claim.object_value), p_shape.predicate, p_shape.value_pattern);
    end if;
    if p_shape.allowed_values is not null and p_claim.object_value is not null
       and not p_claim.object_value = any(p_shape.allowed_values) then
        v_reasons := v_reasons || format('value %s of predicate %s is not one of: %s',
            quote_literal(p_claim.object_value), p_shape.predicate,
            array_to_string(p_shape.allowed_values, ', '));
    end if;
    -- max_count = 1 marks a functional predicate: a second value is a conflict,
    -- not a shape violation. Larger maxima are hard limits.
    if p_shape.max_count is not null and p_shape.max_count > 1 then
        select count(*) into v_count from knowledge.fact_claim c
         where c.tenant_id = p_claim.tenant_id and c.subject_id = p_claim.subject_id
           and c.predicate = p_claim.predicate and c.perspective_key = p_claim.perspective_key
           and c.superseded_at is null and c.id <> p_claim.id
           and (c.object_id, c.object_value) is distinct from (p_claim.object_id, p_claim.object_value);
        if v_count + 1 > p_shape.max_count then
            v_reasons := v_reasons || format('predicate %s allows at most %s values per subject',
                p_shape.predicate, p_shape.max_count);
        end if;
    end if;
    return v_reasons;
end
$$;
comment on function knowledge.shape_reasons(knowledge.shapes, knowledge.fact_claim) is
    'Why a claim violates a shape (empty when it conforms). Minimum counts are checked by '
    'knowledge.dry_run_shape only: a single write cannot violate a minimum.';

create function knowledge.check_claim(p_claim knowledge.fact_claim)
    returns table (shape_id uuid, reasons text[])
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_shape knowledge.shapes;
    v_strict boolean;
begin
    select s.* into v_shape from knowledge.shapes s
     where s.tenant_id = p_claim.tenant_id and s.predicate = p_claim.predicate;
    if v_shape.id is null then
        select coalesce(bool_or(o.strict_shapes), false) into v_strict from knowledge.tenant_settings o
         where o.tenant_id = p_claim.tenant_id;
        if v_strict then
            return query select null::uuid,
                array[format('unknown predicate %s: this tenant accepts only predicates with a shape',
                             p_claim.predicate)];
        end if;
        return;
    end if;
    return query select v_shape.id, knowledge.shape_reasons(v_shape, p_claim)
                  where cardinality(knowledge.shape_reasons(v_shape, p_claim)) > 0;
end
$$;
comment on function knowledge.check_claim(knowledge.fact_claim) is
    'The shape a claim violates and why; no row when it conforms.';

create function knowledge.tg_fact_claim__check() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_subject uuid;
    v_object uuid;
    v_shape uuid;
    v_reasons text[];
    v_release uuid := nullif(current_setting('engram.quarantine_release', true), '')::uuid;
    v_quarantine uuid;
begin
    perform set_config('engram.last_quarantine', '', true);
    if auth.tenant_id() is not null and new.tenant_id is distinct from auth.tenant_id() then
        raise exception 'a claim belongs to the bound tenant' using errcode = '42501';
    end if;
    new.scopes := auth.check_scopes(new.tenant_id, new.scopes);
    if auth.user_id() is not null then
        new.author := auth.user_id();
    end if;
    if new.author is null then
        raise exception 'a claim needs an author (no user is bound)' using errcode = '28000';
    end if;
    new.perspective_key := case when new.epistemic_kind = 'world_fact' then 'world'
                                else 'user:' || new.author end;
    new.recorded_at := now();
    new.superseded_at := null;
    new.access_count := 0;
    new.last_accessed_at := null;
    new.disputed := false;
    select knowledge.canonical_entity(new.subject_id) into v_subject;
    if v_subject is null then
        raise exception 'subject entity % does not exist in this tenant or is not visible', new.subject_id
            using errcode = '23503';
    end if;
    new.subject_id := v_subject;
    if new.object_id is not null then
        select knowledge.canonical_entity(new.object_id) into v_object;
        if v_object is null then
            raise exception 'object entity % does not exist in this tenant or is not visible', new.object_id
                using errcode = '23503';
        end if;
        new.object_id := v_object;
        new.object_datatype := 'entity';
    elsif new.object_datatype = 'entity' then
        raise exception 'datatype entity needs an object entity' using errcode = '23514';
    elsif new.object_value is not null and not knowledge.literal_conforms(new.object_value, new.object_datatype) then
        raise exception 'object value % is not a valid %', quote_literal(new.object_value), new.object_datatype
            using errcode = '22P02';
    end if;

    select c.shape_id, c.reasons into v_shape, v_reasons from knowledge.check_claim(new) c;
    if v_reasons is null then
        return new;
    end if;
    if v_release is not null then
        update knowledge.quarantine q set reasons = v_reasons, shape_id = v_shape, payload = to_jsonb(new)
         where q.tenant_id = new.tenant_id and q.id = v_release returning q.id into v_quarantine;
    else
        insert into knowledge.quarantine (tenant_id, author, shape_id, reasons, payload, scopes)
        values (new.tenant_id, new.author, v_shape, v_reasons, to_jsonb(new), new.scopes)
        returning id into v_quarantine;
    end if;
    perform set_config('engram.last_quarantine', v_quarantine::text, true);
    return null;
end
$$;
comment on function knowledge.tg_fact_claim__check() is
    'Before a claim lands: tenant, scopes, author and perspective, visible entities (merges '
    'followed), literal datatype; a shape violation diverts the row into knowledge.quarantine.';

create function knowledge.tg_fact_claim__guard() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if (new.tenant_id, new.id, new.content_id, new.predicate, new.object_value, new.object_datatype,
        new.scopes, new.author, new.author_role, new.epistemic_kind, new.perspective_key,
        new.confidence, new.authority, new.valid_from, new.recorded_at, new.fact_key, new.as_of)
       is distinct from
       (old.tenant_id, old.id, old.content_id, old.predicate, old.object_value, old.object_datatype,
        old.scopes, old.author, old.author_role, old.epistemic_kind, old.perspective_key,
        old.confidence, old.authority, old.valid_from, old.recorded_at, old.fact_key, old.as_of) then
        raise exception 'a claim is a record: assert a new claim instead of changing this one'
            using errcode = '42501';
    end if;
    if new.subject_id is distinct from old.subject_id
       and knowledge.canonical_entity(old.subject_id) is distinct from new.subject_id then
        raise exception 'a claim''s subject changes only by merging its entity' using errcode = '42501';
    end if;
    if new.object_id is distinct from old.object_id
       and knowledge.canonical_entity(old.object_id) is distinct from new.object_id then
        raise exception 'a claim''s object changes only by merging its entity' using errcode = '42501';
    end if;
    if old.superseded_at is not null and new.superseded_at is distinct from old.superseded_at then
        raise exception 'a superseded claim stays superseded' using errcode = '42501';
    end if;
    return new;
end
$$;
comment on function knowledge.tg_fact_claim__guard() is
    'Claims are records: only validity end, supersession, dispute flag, access counters and '
    'merge repointing may change.';

create function knowledge.find_conflicts(p_claim uuid default null)
    returns table (kind knowledge.conflict_kind, claim_a uuid, claim_b uuid)
    language sql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
    select case when p.predicate <> q.predicate then 'relation'
                when p.valid_from is null and p.valid_to is null and q.valid_from is null and q.valid_to is null
                then 'value' else 'time' end::knowledge.conflict_kind,
           least(p.id, q.id), greatest(p.id, q.id)
      from knowledge.fact_claim p
      join knowledge.fact_claim q
        on q.tenant_id = p.tenant_id and q.subject_id = p.subject_id
       and q.perspective_key = p.perspective_key and q.id <> p.id and q.superseded_at is null
       and tstzrange(p.valid_from, p.valid_to) && tstzrange(q.valid_from, q.valid_to)
     where p.tenant_id = (select auth.tenant_id()) and p.superseded_at is null
       and (p_claim is null or p.id = p_claim)
       and (p_claim is not null or p.id < q.id)
       and (
            (q.predicate = p.predicate
             and (p.object_id, p.object_value) is distinct from (q.object_id, q.object_value)
             and exists (select 1 from knowledge.shapes s where s.tenant_id = p.tenant_id
                            and s.predicate = p.predicate and s.max_count = 1))
         or (q.predicate <> p.predicate
             and (p.object_id, p.object_value) is not distinct from (q.object_id, q.object_value)
             and exists (select 1 from knowledge.shapes s where s.tenant_id = p.tenant_id
                            and ((s.predicate = p.predicate and q.predicate = any(s.exclusive_with))
                              or (s.predicate = q.predicate and p.predicate = any(s.exclusive_with)))))
       )
$$;
comment on function knowledge.find_conflicts(uuid) is
    'Pairs of current visible claims in one perspective partition that contradict each other: '
    'value (functional predicate, different objects, no valid time), time (same, overlapping '
    'valid time), relation (exclusive predicates, same object). p_claim limits it to one claim.';

create function knowledge.record_conflicts(p_claim uuid default null) returns integer
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_count integer;
begin
    with found as (select * from knowledge.find_conflicts(p_claim)),
    ins as (
        insert into knowledge.conflicts (kind, claim_a, claim_b, subject_id, predicate, perspective_key, scopes)
        select f.kind, f.claim_a, f.claim_b, a.subject_id,
               case when a.predicate = b.predicate then a.predicate
                    else least(a.predicate, b.predicate) || ' / ' || greatest(a.predicate, b.predicate) end,
               a.perspective_key,
               (select array_agg(distinct s order by s) from unnest(a.scopes || b.scopes) s)
          from found f
          join knowledge.fact_claim a on a.tenant_id = (select auth.tenant_id()) and a.id = f.claim_a
          join knowledge.fact_claim b on b.tenant_id = (select auth.tenant_id()) and b.id = f.claim_b
        on conflict (tenant_id, claim_a, claim_b) do nothing
        returning 1
    )
    select count(*) into v_count from ins;
    return v_count;
end
$$;
comment on function knowledge.record_conflicts(uuid) is
    'Stores the conflicts find_conflicts reports (each pair once); returns how many are new.';

create function knowledge.detect_conflicts() returns integer
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
    if auth.tenant_id() is null then
        raise exception 'no identity is bound' using errcode = '28000';
    end if;
    -- Same lock as the write path, tenant-wide: a whole-tenant sweep must not
    -- race the per-subject detection of concurrent writers.
    perform pg_advisory_xact_lock(hashtextextended('knowledge.conflicts:' || auth.tenant_id()::text, 0));
    return knowledge.record_conflicts(null);
end
$$;
comment on function knowledge.detect_conflicts() is
    'On demand: records every conflict among the claims the caller can read; returns the new count.';

create function knowledge.tg_fact_claim__detect_conflicts() returns trigger
    language plpgsql security invoker
    set search_path = pg_catalog, pg_temp
as $$
begin
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
comment on function knowledge.tg_fact_claim__detect_conflicts() is
    'On write: records the new claim''s conflicts under a lock per tenant, partition and subject.';

create function knowledge.resolve_conflict(p_conflict uuid, p_strategy knowledge.resolution_strategy,
                                           p_winner uuid default null) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_conflict knowledge.conflicts;
    v_a knowledge.fact_claim;
    v_b knowledge.fact_claim;
    v_winner knowledge.fact_claim;
    v_loser knowledge.fact_claim;
    v_close timestamptz;
    v_rows integer;
begin
    select * into v_conflict from knowledge.conflicts
     where tenant_id = (select auth.tenant_id()) and id = p_conflict;
    if v_conflict.id is null then
        raise exception 'conflict % does not exist or is not visible', p_conflict using errcode = 'P0002';
    end if;
    if v_conflict.status <> 'open' then
        raise exception 'conflict % is already %', p_conflict, v_conflict.status using errcode = '55000';
    end if;
    select * into v_a from knowledge.fact_claim where tenant_id = v_conflict.tenant_id and id = v_conflict.claim_a;
    select * into v_b from knowledge.fact_claim where tenant_id = v_conflict.tenant_id and id = v_conflict.claim_b;
    if v_a.id is null or v_b.id is null then
        raise exception 'resolving conflict % needs read access to both claims', p_conflict using errcode = '42501';
    end if;
    if p_strategy = 'keep_both' then
        update knowledge.fact_claim set disputed = true
         where tenant_id = v_conflict.tenant_id and id in (v_a.id, v_b.id);
        get diagnostics v_rows = row_count;
        if v_rows <> 2 then
            raise exception 'no write access to the conflicting claims' using errcode = '42501';
        end if;
        update knowledge.conflicts set status = 'disputed', strategy = p_strategy, resolved_at = now(),
               resolved_by = auth.user_id()
         where tenant_id = v_conflict.tenant_id and id = v_conflict.id and status = 'open';
        if not found then
            raise exception 'no write access to conflict %', p_conflict using errcode = '42501';
        end if;
        return null;
    end if;
    if p_strategy = 'newest_wins' then
        v_winner := case when (v_a.recorded_at, v_a.id) > (v_b.recorded_at, v_b.id) then v_a else v_b end;
    elsif p_strategy = 'highest_authority_wins' then
        if v_a.authority = v_b.authority then
            raise exception 'both claims have authority %; choose another strategy', v_a.authority
                using errcode = '22023';
        end if;
        v_winner := case when v_a.authority > v_b.authority then v_a else v_b end;
    else
        if p_winner is null or p_winner not in (v_a.id, v_b.id) then
            raise exception 'a manual pick names one of the two claims (% or %)', v_a.id, v_b.id
                using errcode = '22023';
        end if;
        v_winner := case when p_winner = v_a.id then v_a else v_b end;
    end if;
    v_loser := case when v_winner.id = v_a.id then v_b else v_a end;
    -- The loser stops being true where the winner starts (or now); a loser that
    -- would end before it began is superseded instead: we learned it was wrong.
    v_close := case when v_winner.valid_from is not null and v_winner.valid_from > coalesce(v_loser.valid_from, '-infinity')
                    then v_winner.valid_from else now() end;
    if v_loser.valid_to is not null and v_loser.valid_to <= v_close then
        v_close := null;
    end if;
    if v_close is not null and v_close > coalesce(v_loser.valid_from, '-infinity') then
        update knowledge.fact_claim set valid_to = v_close
         where tenant_id = v_loser.tenant_id and id = v_loser.id;
    else
        update knowledge.fact_claim set superseded_at = now()
         where tenant_id = v_loser.tenant_id and id = v_loser.id;
    end if;
    if not found then
        raise exception 'no write access to the losing claim %', v_loser.id using errcode = '42501';
    end if;
    update knowledge.conflicts set status = 'resolved', strategy = p_strategy, winner_id = v_winner.id,
           resolved_at = now(), resolved_by = auth.user_id()
     where tenant_id = v_conflict.tenant_id and id = v_conflict.id and status = 'open';
    if not found then
        raise exception 'no write access to conflict %', p_conflict using errcode = '42501';
    end if;
    return v_winner.id;
end
$$;
comment on function knowledge.resolve_conflict(uuid, knowledge.resolution_strategy, uuid) is
    'Resolves an open conflict: newest_wins, highest_authority_wins, manual (p_winner) close the '
    'loser''s validity (never delete); keep_both marks both claims disputed. Returns the winner.';

create function knowledge.release_quarantine(p_id uuid, p_payload jsonb default null) returns uuid
    language plpgsql volatile security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_q knowledge.quarantine;
    v_row knowledge.fact_claim;
    v_id uuid;
begin
    select * into v_q from knowledge.quarantine
     where tenant_id = (select auth.tenant_id()) and id = p_id and status = 'held' for update;
    if v_q.id is null then
        raise exception 'no held quarantine entry %', p_id using errcode = 'P0002';
    end if;
    v_row := jsonb_populate_record(null::knowledge.fact_claim, v_q.payload || coalesce(p_payload, '{}'));
    perform set_config('engram.quarantine_release', v_q.id::text, true);
    insert into knowledge.fact_claim (content_id, subject_id, predicate, object_id, object_value,
                                      object_datatype, scopes, author_role, epistemic_kind, confidence,
                                      authority, valid_from, valid_to, fact_key, as_of)
    values (v_row.content_id, v_row.subject_id, v_row.predicate, v_row.object_id, v_row.object_value,
            v_row.object_datatype, v_row.scopes, v_row.author_role, v_row.epistemic_kind, v_row.confidence,
            v_row.authority, v_row.valid_from, v_row.valid_to, v_row.fact_key, v_row.as_of)
    returning id into v_id;
    perform set_config('engram.quarantine_release', '', true);
    if v_id is not null then
        update knowledge.quarantine set status = 'released', released_claim_id = v_id, released_at = now()
         where tenant_id = v_q.tenant_id and id = v_q.id;
    end if;
    return v_id;
end
$$;
comment on function knowledge.release_quarantine(uuid, jsonb) is
    'Retries a quarantined claim with corrections merged into its payload; returns the new claim, '
    'or null (and updated reasons) when it still violates a shape.';

create function knowledge.dry_run_shape(p_predicate text, p_subject_type text default null,
    p_object_type text default null, p_datatype text default null, p_min_count integer default null,
    p_max_count integer default null, p_value_pattern text default null, p_allowed_values text[] default null)
    returns table (claim_id uuid, subject_id uuid, reasons text[])
    language plpgsql stable security invoker
    set search_path = pg_catalog, pg_temp
as $$
declare
    v_shape knowledge.shapes;
begin
    v_shape := row(auth.tenant_id(), null, p_predicate, p_subject_type, p_object_type, p_datatype,
                   p_min_count, p_max_count, p_value_pattern, p_allowed_values, '{}', null, now(), now())::knowledge.shapes;
    return query
        select c.id, c.subject_id, r.reasons
          from knowledge.fact_claim c
          cross join lateral (select knowledge.shape_reasons(v_shape, c) as reasons) r
         where c.tenant_id = (select auth.tenant_id()) and c.predicate = p_predicate
           and c.superseded_at is null and cardinality(r.reasons) > 0;
    if p_min_count is not null and p_subject_type is not null then
        return query
            select null::uuid, e.id, array[format('entity %s of type %s has %s current %s claims; the shape needs at least %s',
                                                   e.canonical_name, e.entity_type, count(c.id), p_predicate, p_min_count)]
              from knowledge.entities e
              left join knowledge.fact_claim c on c.tenant_id = e.tenant_id and c.subject_id = e.id
                    and c.predicate = p_predicate and c.superseded_at is null
             where e.tenant_id = (select auth.tenant_id()) and e.entity_type = p_subject_type
               and e.merged_into is null
             group by e.id, e.canonical_name, e.entity_type
            having count(c.id) < p_min_count;
    end if;
end
$$;
comment on function knowledge.dry_run_shape(text, text, text, text, integer, integer, text, text[]) is
    'Reports which current claims (and entities, for minimum counts) a proposed shape would reject, '
    'among those the caller can read. Changes nothing.';

create function knowledge.touch_claims(p_ids uuid[]) returns integer
    language sql volatile security definer
    set search_path = pg_catalog, pg_temp
as $$
    with t as (
        update knowledge.fact_claim c set access_count = c.access_count + 1, last_accessed_at = now()
         where c.tenant_id = auth.tenant_id() and c.id = any(p_ids) and c.scopes && auth.read_scopes()
        returning 1
    )
    select count(*)::integer from t
$$;
-- SECURITY DEFINER: recall bumps the counters of the facts it selected for
-- every reader, including read-only ones, who may not update claims. The
-- owner's policy limits the update to claims the caller can read, and the
-- function touches only the two counter columns.
comment on function knowledge.touch_claims(uuid[]) is
    'Counts one access for each listed claim the caller can read (SECURITY DEFINER: readers '
    'cannot update claims). Returns how many were counted.';
revoke all on function knowledge.touch_claims(uuid[]) from public;
"""

TRIGGERS_SQL = """
create trigger tg_entities__normalize before insert or update on knowledge.entities
    for each row execute function knowledge.tg_entities__normalize();
create trigger tg_fact_content__immutable before insert or update on knowledge.fact_content
    for each row execute function knowledge.tg_fact_content__immutable();
create trigger tg_fact_claim__check before insert on knowledge.fact_claim
    for each row execute function knowledge.tg_fact_claim__check();
create trigger tg_fact_claim__guard before update on knowledge.fact_claim
    for each row execute function knowledge.tg_fact_claim__guard();
create trigger tg_fact_claim__detect_conflicts after insert on knowledge.fact_claim
    for each row execute function knowledge.tg_fact_claim__detect_conflicts();
"""

VIEWS_SQL = """
create view knowledge.current_claims with (security_barrier = true, security_invoker = true) as
    select c.tenant_id, c.id, c.content_id, t.text, c.subject_id, c.predicate, c.object_id,
           c.object_value, c.object_datatype, c.scopes, c.author, c.author_role, c.epistemic_kind,
           c.perspective_key, c.confidence, c.authority, c.valid_from, c.valid_to, c.recorded_at,
           c.fact_key, c.as_of, c.disputed, c.access_count, c.last_accessed_at
      from knowledge.fact_claim c
      join knowledge.fact_content t on t.tenant_id = c.tenant_id and t.id = c.content_id
     where c.superseded_at is null
       and (c.valid_from is null or c.valid_from <= now())
       and (c.valid_to is null or c.valid_to > now());
comment on view knowledge.current_claims is
    'Claims true now (valid time) and still believed (record time), with their text; reads '
    'through the caller''s RLS.';

create view knowledge.relations with (security_barrier = true, security_invoker = true) as
    select c.tenant_id, c.id, c.subject_id, c.predicate, c.object_id, c.scopes, c.epistemic_kind,
           c.perspective_key, c.confidence, c.authority, c.valid_from, c.valid_to
      from knowledge.fact_claim c
     where c.object_id is not null and c.superseded_at is null
       and (c.valid_from is null or c.valid_from <= now())
       and (c.valid_to is null or c.valid_to > now());
comment on view knowledge.relations is 'Current claims whose object is an entity: the graph''s edges.';

create view knowledge.current_keyed_facts with (security_barrier = true, security_invoker = true) as
    select distinct on (c.tenant_id, c.fact_key) c.*
      from knowledge.current_claims c
     where c.fact_key is not null
     order by c.tenant_id, c.fact_key, c.as_of desc, c.authority desc, c.recorded_at desc, c.id desc;
comment on view knowledge.current_keyed_facts is
    'Per fact key, the snapshot with the newest as_of among the caller''s current claims.';

create view knowledge.effective_claims with (security_barrier = true, security_invoker = true) as
    select c.*,
           case when k.id <> c.id
                 and (k.object_id, k.object_value) is distinct from (c.object_id, c.object_value)
                 and (c.fact_key is null or c.authority < k.authority
                      or (c.fact_key = k.fact_key and c.as_of < k.as_of))
                then k.id end as beaten_by
      from knowledge.current_claims c
      -- Only the strongest current keyed fact about this subject and predicate
      -- can beat a claim: a keyed fact that is itself outranked beats nothing.
      left join lateral (
          select k.id, k.object_id, k.object_value, k.authority, k.fact_key, k.as_of
            from knowledge.current_keyed_facts k
           where k.tenant_id = c.tenant_id and k.subject_id = c.subject_id and k.predicate = c.predicate
           order by k.authority desc, k.as_of desc, k.id desc
           limit 1
      ) k on true;
comment on view knowledge.effective_claims is
    'Current claims with beaten_by: the current keyed fact that contradicts and outranks a claim '
    '(prose, a lower authority, or an older snapshot of the same key). Recall keeps beaten_by is null.';
"""

POLICIES_SQL = """
alter table knowledge.entities enable row level security;
alter table knowledge.entities force row level security;
alter table knowledge.fact_content enable row level security;
alter table knowledge.fact_content force row level security;
alter table knowledge.fact_claim enable row level security;
alter table knowledge.fact_claim force row level security;
alter table knowledge.shapes enable row level security;
alter table knowledge.shapes force row level security;
alter table knowledge.tenant_settings enable row level security;
alter table knowledge.tenant_settings force row level security;
alter table knowledge.quarantine enable row level security;
alter table knowledge.quarantine force row level security;
alter table knowledge.conflicts enable row level security;
alter table knowledge.conflicts force row level security;

create policy entities__select_app on knowledge.entities for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy entities__insert_app on knowledge.entities for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy entities__update_app on knowledge.entities for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy entities__delete_app on knowledge.entities for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));

create policy fact_claim__select_app on knowledge.fact_claim for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy fact_claim__insert_app on knowledge.fact_claim for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy fact_claim__update_app on knowledge.fact_claim for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
create policy fact_claim__delete_app on knowledge.fact_claim for delete to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));
-- For knowledge.touch_claims (SECURITY DEFINER): the owner, bound to the
-- caller's identity, may bump counters of claims the caller can read.
create policy fact_claim__select_owner on knowledge.fact_claim for select to engram_owner
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy fact_claim__update_owner on knowledge.fact_claim for update to engram_owner
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()))
    with check (tenant_id = (select auth.tenant_id()));

-- Content is readable exactly when a claim the caller can read points at it
-- (the subquery runs under fact_claim's own policies).
create policy fact_content__select_app on knowledge.fact_content for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and exists (select 1 from knowledge.fact_claim c
                        where c.tenant_id = fact_content.tenant_id and c.content_id = fact_content.id));
-- For knowledge.intern_content (SECURITY DEFINER): deduplication within the bound tenant.
create policy fact_content__select_owner on knowledge.fact_content for select to engram_owner
    using (tenant_id = (select auth.tenant_id()));
create policy fact_content__insert_owner on knowledge.fact_content for insert to engram_owner
    with check (tenant_id = (select auth.tenant_id()));

create policy shapes__select_app on knowledge.shapes for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy shapes__all_dba on knowledge.shapes for all to engram_dba
    using (true) with check (true);
create policy tenant_settings__select_app on knowledge.tenant_settings for select to engram_app
    using (tenant_id = (select auth.tenant_id()));
create policy tenant_settings__all_dba on knowledge.tenant_settings for all to engram_dba
    using (true) with check (true);

-- A quarantined claim is visible to its writer, and to readers of its scopes.
create policy quarantine__select_app on knowledge.quarantine for select to engram_app
    using (tenant_id = (select auth.tenant_id())
           and (author = (select auth.user_id()) or scopes && (select auth.read_scopes())));
create policy quarantine__insert_app on knowledge.quarantine for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and author = (select auth.user_id())
                and scopes <@ (select auth.write_scopes()));
create policy quarantine__update_app on knowledge.quarantine for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));

create policy conflicts__select_app on knowledge.conflicts for select to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy conflicts__insert_app on knowledge.conflicts for insert to engram_app
    with check (tenant_id = (select auth.tenant_id()) and scopes && (select auth.read_scopes()));
create policy conflicts__update_app on knowledge.conflicts for update to engram_app
    using (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()))
    with check (tenant_id = (select auth.tenant_id()) and scopes <@ (select auth.write_scopes()));

grant usage on schema knowledge to engram_app, engram_dba;
grant usage on type knowledge.epistemic_kind, knowledge.conflict_kind, knowledge.conflict_status,
    knowledge.resolution_strategy to engram_app;
grant select, delete on knowledge.entities to engram_app;
grant insert (entity_type, canonical_name, aliases, summary, scopes) on knowledge.entities to engram_app;
grant update (entity_type, canonical_name, aliases, summary, scopes, merged_into)
    on knowledge.entities to engram_app;
grant select on knowledge.fact_content to engram_app;
grant select, delete on knowledge.fact_claim to engram_app;
grant insert (content_id, subject_id, predicate, object_id, object_value, object_datatype, scopes,
              author_role, epistemic_kind, confidence, authority, valid_from, valid_to, fact_key, as_of)
    on knowledge.fact_claim to engram_app;
grant update (subject_id, object_id, valid_to, superseded_at, disputed) on knowledge.fact_claim to engram_app;
grant select on knowledge.shapes, knowledge.tenant_settings to engram_app;
grant select, delete on knowledge.shapes, knowledge.tenant_settings to engram_dba;
grant insert (tenant_id, predicate, subject_type, object_type, datatype, min_count, max_count,
              value_pattern, allowed_values, exclusive_with, description)
    on knowledge.shapes to engram_dba;
grant update (subject_type, object_type, datatype, min_count, max_count, value_pattern, allowed_values,
              exclusive_with, description)
    on knowledge.shapes to engram_dba;
grant insert (tenant_id, strict_shapes), update (strict_shapes) on knowledge.tenant_settings to engram_dba;
grant select on knowledge.quarantine to engram_app;
-- tenant_id and author are insertable because the claim trigger (security
-- invoker) names them; the insert policy pins both to the bound identity.
grant insert (tenant_id, author, shape_id, reasons, payload, scopes) on knowledge.quarantine to engram_app;
grant update (shape_id, reasons, payload, status, released_claim_id, released_at) on knowledge.quarantine to engram_app;
grant select on knowledge.conflicts to engram_app;
grant insert (kind, claim_a, claim_b, subject_id, predicate, perspective_key, scopes) on knowledge.conflicts to engram_app;
grant update (status, strategy, winner_id, resolved_at, resolved_by) on knowledge.conflicts to engram_app;
grant select on knowledge.current_claims, knowledge.relations, knowledge.current_keyed_facts,
    knowledge.effective_claims to engram_app;
grant execute on function knowledge.intern_content(text), knowledge.touch_claims(uuid[]) to engram_app;

comment on table knowledge.entities is
    'People, organisations, places, things: typed, canonical name, aliases, summary; merged rows stay resolvable.';
comment on column knowledge.entities.name_key is 'Normalised canonical name (knowledge.normalize_name).';
comment on column knowledge.entities.alias_keys is 'Normalised aliases, in step with aliases (trigger).';
comment on column knowledge.entities.merged_into is 'Set when merged away: the entity this one now is.';
comment on column knowledge.entities.embedding is 'Embedding of the summary (or the name when there is none).';
comment on table knowledge.fact_content is
    'Immutable fact text, once per tenant by SHA-256; readable through a visible claim.';
comment on table knowledge.fact_claim is
    'Who claims which content about which subject, in which perspective, scope, valid and record time.';
comment on column knowledge.fact_claim.perspective_key is
    'Consolidation partition: world for world facts, user:<author> for experiences, observations, opinions, preferences.';
comment on column knowledge.fact_claim.authority is 'Trust level of the source (0..100); keyed facts outrank lower ones.';
comment on column knowledge.fact_claim.fact_key is 'Key of a keyed fact; with as_of, one snapshot of it.';
comment on column knowledge.fact_claim.disputed is 'Set when a conflict involving this claim was resolved as keep_both.';
comment on table knowledge.shapes is
    'SHACL-style shape per predicate: subject/object type, datatype, cardinality, pattern, allowed values, '
    'exclusive predicates. max_count = 1 makes the predicate functional.';
comment on table knowledge.tenant_settings is 'Per tenant knowledge options (strict shapes: unknown predicates are quarantined).';
comment on table knowledge.quarantine is
    'Claims that failed a shape: the reasons and the original payload; releasable after correction.';
comment on table knowledge.conflicts is
    'Contradicting claim pairs (value, time, relation) with status and resolution; never deletes a claim.';
"""


def upgrade() -> None:
    op.execute("create schema knowledge authorization engram_owner")
    op.execute("comment on schema knowledge is 'Entities, facts and claims, shapes, quarantine, conflicts.'")
    bind = op.get_bind()
    for name, values in (
        ("epistemic_kind", ("world_fact", "experience", "observation", "opinion", "preference")),
        ("conflict_kind", ("value", "time", "relation")),
        ("conflict_status", ("open", "resolved", "disputed")),
        ("resolution_strategy", ("newest_wins", "highest_authority_wins", "keep_both", "manual")),
    ):
        postgresql.ENUM(*values, name=name, schema="knowledge").create(bind)

    def enum(name: str) -> postgresql.ENUM:
        return postgresql.ENUM(name=name, schema="knowledge", create_type=False)

    tenant_fk = "fk_{}_tenant_id_tenants"
    op.create_table(
        "entities",
        _tenant(), _id(),
        sa.Column("entity_type", sa.Text(), nullable=False),
        sa.Column("canonical_name", sa.Text(), nullable=False),
        sa.Column("name_key", sa.Text(), nullable=False),
        sa.Column("aliases", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("alias_keys", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        *_embedding_columns("entities"),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("merged_into", UUID, nullable=True),
        sa.Column("created_by", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_entities"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("entities"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "merged_into"], ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                                name="fk_entities_tenant_id_merged_into_entities"),
        sa.CheckConstraint(r"entity_type ~ '^[A-Za-z][A-Za-z0-9_]{0,62}$'", name="ck_entities_entity_type_format"),
        sa.CheckConstraint("length(canonical_name) between 1 and 500", name="ck_entities_canonical_name_length"),
        sa.CheckConstraint("cardinality(aliases) <= 200", name="ck_entities_aliases_count"),
        sa.CheckConstraint("summary is null or length(summary) <= 20000", name="ck_entities_summary_length"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_entities_scopes_nonempty"),
        schema="knowledge",
    )
    op.create_index("ix_entities_tenant_id_entity_type_name_key", "entities",
                    ["tenant_id", "entity_type", "name_key"], schema="knowledge")
    op.create_index("ix_entities_alias_keys", "entities", ["alias_keys"], schema="knowledge",
                    postgresql_using="gin")

    op.create_table(
        "fact_content",
        _tenant(), _id(),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("content_hash", postgresql.BYTEA(), nullable=False),
        *_embedding_columns("fact_content"),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_fact_content"),
        sa.UniqueConstraint("tenant_id", "content_hash", name="uq_fact_content_tenant_id_content_hash"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("fact_content"),
                                ondelete="CASCADE"),
        sa.CheckConstraint("length(text) between 1 and 20000", name="ck_fact_content_text_length"),
        schema="knowledge",
    )
    op.create_index("ix_fact_content_embedding_hnsw", "fact_content", ["embedding"], schema="knowledge",
                    postgresql_using="hnsw", postgresql_with={"m": 16, "ef_construction": 64},
                    postgresql_ops={"embedding": "vector_cosine_ops"})
    op.create_index("ix_fact_content_embed_queue", "fact_content", ["created_at"], schema="knowledge",
                    postgresql_where=sa.text("embed_state = 'pending'"))

    op.create_table(
        "fact_claim",
        _tenant(), _id(),
        sa.Column("content_id", UUID, nullable=False),
        sa.Column("subject_id", UUID, nullable=False),
        sa.Column("predicate", sa.Text(), nullable=False),
        sa.Column("object_id", UUID, nullable=True),
        sa.Column("object_value", sa.Text(), nullable=True),
        sa.Column("object_datatype", sa.Text(), server_default=sa.text("'string'"), nullable=False),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("author", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=False),
        sa.Column("author_role", sa.Text(), server_default=sa.text("'user'"), nullable=False),
        sa.Column("epistemic_kind", enum("epistemic_kind"), server_default=sa.text("'world_fact'"), nullable=False),
        sa.Column("perspective_key", sa.Text(), nullable=False),
        sa.Column("confidence", postgresql.DOUBLE_PRECISION(), server_default=sa.text("1.0"), nullable=False),
        sa.Column("authority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("valid_from", TS, nullable=True),
        sa.Column("valid_to", TS, nullable=True),
        sa.Column("recorded_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("superseded_at", TS, nullable=True),
        sa.Column("fact_key", sa.Text(), nullable=True),
        sa.Column("as_of", TS, nullable=True),
        sa.Column("disputed", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("access_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_accessed_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_fact_claim"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("fact_claim"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "content_id"], ["knowledge.fact_content.tenant_id", "knowledge.fact_content.id"],
                                name="fk_fact_claim_tenant_id_content_id_fact_content"),
        sa.ForeignKeyConstraint(["tenant_id", "subject_id"], ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                                name="fk_fact_claim_tenant_id_subject_id_entities"),
        sa.ForeignKeyConstraint(["tenant_id", "object_id"], ["knowledge.entities.tenant_id", "knowledge.entities.id"],
                                name="fk_fact_claim_tenant_id_object_id_entities"),
        sa.CheckConstraint(r"predicate ~ '^[a-z][a-z0-9_:.-]{0,99}$'", name="ck_fact_claim_predicate_format"),
        sa.CheckConstraint("(object_id is null) <> (object_value is null)", name="ck_fact_claim_one_object"),
        sa.CheckConstraint("(object_datatype = 'entity') = (object_id is not null)",
                           name="ck_fact_claim_entity_datatype"),
        sa.CheckConstraint("object_datatype in (" + ", ".join(f"'{d}'" for d in DATATYPES) + ")",
                           name="ck_fact_claim_object_datatype_known"),
        sa.CheckConstraint("object_value is null or length(object_value) <= 2000", name="ck_fact_claim_object_value_length"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_fact_claim_scopes_nonempty"),
        sa.CheckConstraint("length(author_role) between 1 and 50", name="ck_fact_claim_author_role_length"),
        sa.CheckConstraint("confidence >= 0 and confidence <= 1", name="ck_fact_claim_confidence_range"),
        sa.CheckConstraint("authority between 0 and 100", name="ck_fact_claim_authority_range"),
        sa.CheckConstraint("valid_to is null or valid_from is null or valid_to > valid_from",
                           name="ck_fact_claim_valid_time_ordered"),
        sa.CheckConstraint("(fact_key is null) = (as_of is null)", name="ck_fact_claim_keyed_as_of"),
        sa.CheckConstraint("fact_key is null or length(fact_key) between 1 and 200", name="ck_fact_claim_fact_key_length"),
        sa.CheckConstraint("access_count >= 0", name="ck_fact_claim_access_count_nonnegative"),
        schema="knowledge",
    )
    op.create_index("ix_fact_claim_tenant_id_subject_id", "fact_claim", ["tenant_id", "subject_id"], schema="knowledge")
    op.create_index("ix_fact_claim_tenant_id_object_id", "fact_claim", ["tenant_id", "object_id"], schema="knowledge")
    op.create_index("ix_fact_claim_tenant_id_content_id", "fact_claim", ["tenant_id", "content_id"], schema="knowledge")
    op.create_index("ix_fact_claim_tenant_id_fact_key_as_of", "fact_claim", ["tenant_id", "fact_key", "as_of"],
                    schema="knowledge", unique=True, postgresql_where=sa.text("fact_key is not null"))

    op.create_table(
        "shapes",
        sa.Column("tenant_id", UUID, nullable=False), _id(),
        sa.Column("predicate", sa.Text(), nullable=False),
        sa.Column("subject_type", sa.Text(), nullable=True),
        sa.Column("object_type", sa.Text(), nullable=True),
        sa.Column("datatype", sa.Text(), nullable=True),
        sa.Column("min_count", sa.Integer(), nullable=True),
        sa.Column("max_count", sa.Integer(), nullable=True),
        sa.Column("value_pattern", sa.Text(), nullable=True),
        sa.Column("allowed_values", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("exclusive_with", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_shapes"),
        sa.UniqueConstraint("tenant_id", "predicate", name="uq_shapes_tenant_id_predicate"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("shapes"),
                                ondelete="CASCADE"),
        sa.CheckConstraint(r"predicate ~ '^[a-z][a-z0-9_:.-]{0,99}$'", name="ck_shapes_predicate_format"),
        sa.CheckConstraint("datatype is null or datatype in (" + ", ".join(f"'{d}'" for d in DATATYPES) + ")",
                           name="ck_shapes_datatype_known"),
        sa.CheckConstraint("object_type is null or datatype is null or datatype = 'entity'",
                           name="ck_shapes_object_type_is_entity"),
        sa.CheckConstraint("min_count is null or min_count >= 0", name="ck_shapes_min_count_nonnegative"),
        sa.CheckConstraint("max_count is null or max_count >= 1", name="ck_shapes_max_count_positive"),
        sa.CheckConstraint("min_count is null or max_count is null or min_count <= max_count",
                           name="ck_shapes_counts_ordered"),
        schema="knowledge",
    )

    op.create_table(
        "tenant_settings",
        sa.Column("tenant_id", UUID, nullable=False), _id(),
        sa.Column("strict_shapes", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_tenant_settings"),
        sa.UniqueConstraint("tenant_id", name="uq_tenant_settings_tenant_id"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("tenant_settings"),
                                ondelete="CASCADE"),
        schema="knowledge",
    )

    op.create_table(
        "quarantine",
        _tenant(), _id(),
        sa.Column("shape_id", UUID, nullable=True),
        sa.Column("reasons", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("author", sa.Text(), server_default=sa.text("auth.user_id()"), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'held'"), nullable=False),
        sa.Column("released_claim_id", UUID, nullable=True),
        sa.Column("released_at", TS, nullable=True),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_quarantine"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("quarantine"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "released_claim_id"],
                                ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                                name="fk_quarantine_tenant_id_released_claim_id_fact_claim"),
        sa.CheckConstraint("cardinality(reasons) >= 1", name="ck_quarantine_reasons_nonempty"),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="ck_quarantine_payload_object"),
        sa.CheckConstraint("status in ('held', 'released', 'discarded')", name="ck_quarantine_status_known"),
        sa.CheckConstraint("(status = 'released') = (released_claim_id is not null)",
                           name="ck_quarantine_released_claim"),
        schema="knowledge",
    )
    op.create_index("ix_quarantine_tenant_id_author_status", "quarantine", ["tenant_id", "author", "status"],
                    schema="knowledge")

    op.create_table(
        "conflicts",
        _tenant(), _id(),
        sa.Column("kind", enum("conflict_kind"), nullable=False),
        sa.Column("claim_a", UUID, nullable=False),
        sa.Column("claim_b", UUID, nullable=False),
        sa.Column("subject_id", UUID, nullable=False),
        sa.Column("predicate", sa.Text(), nullable=False),
        sa.Column("perspective_key", sa.Text(), nullable=False),
        sa.Column("scopes", UUIDS, nullable=False),
        sa.Column("status", enum("conflict_status"), server_default=sa.text("'open'"), nullable=False),
        sa.Column("strategy", enum("resolution_strategy"), nullable=True),
        sa.Column("winner_id", UUID, nullable=True),
        sa.Column("detected_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("resolved_at", TS, nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_conflicts"),
        sa.UniqueConstraint("tenant_id", "claim_a", "claim_b", name="uq_conflicts_tenant_id_claim_a_claim_b"),
        sa.ForeignKeyConstraint(["tenant_id"], ["auth.tenants.id"], name=tenant_fk.format("conflicts"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "claim_a"], ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                                name="fk_conflicts_tenant_id_claim_a_fact_claim", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id", "claim_b"], ["knowledge.fact_claim.tenant_id", "knowledge.fact_claim.id"],
                                name="fk_conflicts_tenant_id_claim_b_fact_claim", ondelete="CASCADE"),
        sa.CheckConstraint("claim_a < claim_b", name="ck_conflicts_claims_ordered"),
        sa.CheckConstraint("winner_id is null or winner_id in (claim_a, claim_b)", name="ck_conflicts_winner_is_party"),
        sa.CheckConstraint("(status = 'open') = (resolved_at is null)", name="ck_conflicts_resolved_when_closed"),
        sa.CheckConstraint("cardinality(scopes) >= 1", name="ck_conflicts_scopes_nonempty"),
        schema="knowledge",
    )
    op.create_index("ix_conflicts_tenant_id_status", "conflicts", ["tenant_id", "status"], schema="knowledge")

    op.execute(FUNCTIONS_SQL)
    op.execute(TRIGGERS_SQL)
    op.execute(VIEWS_SQL)
    op.execute(POLICIES_SQL)


def downgrade() -> None:
    op.execute("drop schema knowledge cascade")
