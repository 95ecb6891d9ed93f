-- Helpers for the knowledge and derived-memory pgTAP files (10_..19_). Loaded
-- with \ir inside each file's transaction, so they vanish with its rollback.

create or replace function tests.k_entity(p_org text, p_type text, p_name text, p_scopes text[],
                                          p_aliases text[] default '{}')
    returns uuid language sql as $$
    insert into knowledge.entities (tenant_id, entity_type, canonical_name, aliases, scopes)
    values (tests.tenant(p_org), p_type, p_name, p_aliases, tests.scopes(p_org, p_scopes))
    returning id
$$;
comment on function tests.k_entity(text, text, text, text[], text[]) is
    'Fixture (as the superuser): an entity in a tenant''s scopes.';

-- Runs as whoever calls it (engram_app after tests.act_as): asserts a literal
-- claim through the same path the Python API takes. Returns null when the claim
-- was quarantined.
create or replace function tests.k_claim(p_subject uuid, p_predicate text, p_value text, p_scopes uuid[],
                                         p_kind knowledge.epistemic_kind default 'world_fact',
                                         p_datatype text default 'string', p_authority integer default 0,
                                         p_valid_from timestamptz default null,
                                         p_valid_to timestamptz default null,
                                         p_fact_key text default null, p_as_of timestamptz default null,
                                         p_object uuid default null, p_confidence float8 default 1.0)
    returns uuid language plpgsql as $$
declare
    v_id uuid;
begin
    insert into knowledge.fact_claim (content_id, subject_id, predicate, object_id, object_value,
                                      object_datatype, scopes, epistemic_kind, authority, valid_from,
                                      valid_to, fact_key, as_of, confidence)
    values (knowledge.intern_content(p_predicate || ' ' || coalesce(p_value, p_object::text)),
            p_subject, p_predicate, p_object, case when p_object is null then p_value end,
            case when p_object is null then p_datatype else 'entity' end, p_scopes, p_kind,
            p_authority, p_valid_from, p_valid_to, p_fact_key, p_as_of, p_confidence)
    returning id into v_id;
    return v_id;
end $$;

create or replace function tests.k_shape(p_org text, p_predicate text, p_max integer default null,
                                         p_datatype text default null, p_subject_type text default null,
                                         p_object_type text default null, p_pattern text default null,
                                         p_allowed text[] default null, p_exclusive text[] default '{}')
    returns uuid language sql as $$
    insert into knowledge.shapes (tenant_id, predicate, max_count, datatype, subject_type, object_type,
                                  value_pattern, allowed_values, exclusive_with)
    values (tests.tenant(p_org), p_predicate, p_max, p_datatype, p_subject_type, p_object_type,
            p_pattern, p_allowed, p_exclusive)
    returning id
$$;
